"""What a tracker says about a run besides its metrics: the run's config flattened into params, and the
names of runs and sweeps (the run directory and its overrides, the sweep directory)."""

from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import DictConfig

from lazytrain.config import LazyConfig, tree
from lazytrain.utils.run_dirs import read_overrides

__all__ = ["get_flat_config", "get_run_name", "get_sweep_name"]

logger = logging.getLogger(__name__)

_RUN_NAME_LENGTH = 200


def get_flat_config(output_dir: str) -> dict[str, Any]:
    """The run's ``config.yaml`` (written by the main process before training) as ``{"a.b.0.c": value}``.

    Values are resolved (``train.output_dir`` is `output_dir` again, not the saved file's ``./output``); an
    interpolation of a whole node (``dataset_dicts: ${..dataset}``) or one that does not resolve stays as its
    ``${...}`` text. Returns ``{}`` when the run directory has no ``config.yaml``.
    """
    path = os.path.join(output_dir, "config.yaml")
    if not os.path.isfile(path):
        logger.debug("No %s: no config to log as params.", path)
        return {}
    cfg = LazyConfig.load(path)
    if isinstance(cfg.get("train"), DictConfig):
        cfg.train.output_dir = output_dir
    flat = {}
    for entry in tree.walk(cfg, join=tree.dotted_path):
        if tree.has_children(entry.node):
            continue
        flat[entry.path] = _get_leaf_value(entry)
    return flat


def _get_leaf_value(entry: tree.Entry) -> Any:
    raw = tree.raw_value(entry.node)
    if not tree.is_interpolation(entry.node):
        return raw
    try:
        return raw if tree.points_at_container(entry.node) else entry.parent[entry.key]
    except Exception:  # a resolver only the Hydra process has, a key removed since: keep the text
        return raw


def get_run_name(output_dir: str) -> str:
    """The run directory's name and its Hydra overrides: ``"1 dataloader.train.sampler.repeat_thresh=0.3"``.

    Overrides of ``train.hooks`` are left out: they add or tune hooks (this tracker among them), they do not
    tell runs apart."""
    overrides = [o for o in read_overrides(output_dir) if not o.lstrip("+~").startswith("train.hooks.")]
    name = " ".join([os.path.basename(os.path.normpath(output_dir)), *overrides])
    return name[:_RUN_NAME_LENGTH]


def get_sweep_name(sweep_dir: str) -> str:
    """A sweep directory as the user named it: relative to the working directory when it is below it."""
    relative = os.path.relpath(sweep_dir)
    return sweep_dir if relative.startswith("..") else relative
