"""Launching: one process per GPU/CPU worker, multi-node (the command line lives in `lazytrain.program`)."""
