"""Launching: the Hydra entrypoint (`python -m lazytrain`), one process per GPU/CPU worker, multi-node."""
