"""The batch a run trains with, and what follows from it.

``dataloader.train.total_batch_size`` is the batch of one optimizer step over all processes, whatever the
hardware. ``train.images_per_forward`` (gradient accumulation) is how many of this process's images go through
the model at once: the loader yields this process's whole share, and the trainer runs it in
`get_accumulation_steps` forward and backward passes before one optimizer step (`SimpleTrainer`). The recipe's
total batch 16 thus trains on one GPU with ``train.images_per_forward=2`` (8 passes per step).

``train.auto_scale_lr`` (off by default; mmdet's ``auto_scale_lr``) scales every param group's learning rate
by ``total_batch_size / base_batch_size`` (the linear scaling rule), where ``base_batch_size`` is the batch the
recipe's learning rate was set for (16 for ``recipes/optim.py``'s 0.02).
"""

from __future__ import annotations

import logging

import torch
from omegaconf import DictConfig, OmegaConf

from lazytrain.errors import ConfigError

__all__ = ["get_accumulation_steps", "get_lr_scale", "scale_learning_rate"]

logger = logging.getLogger(__name__)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def get_accumulation_steps(cfg: DictConfig, world_size: int) -> int | None:
    """Forward passes per optimizer step in each process: ``total_batch_size / world_size /
    images_per_forward``; 1 without ``train.images_per_forward``, None when the config has no
    ``dataloader.train.total_batch_size`` (the trainer checks each batch then).

    Raises:
        ConfigError: naming the keys, their values and the fix, when the numbers do not divide.
    """
    per_forward = OmegaConf.select(cfg, "train.images_per_forward", default=None)
    if per_forward is None:
        return 1
    if not _positive_int(per_forward):
        raise ConfigError(
            f"train.images_per_forward={per_forward!r}: must be an integer >= 1 (images per process and forward "
            "pass), or null for no gradient accumulation."
        )
    total = OmegaConf.select(cfg, "dataloader.train.total_batch_size", default=None)
    if not _positive_int(total):
        return None
    if total % world_size:
        raise ConfigError(
            f"dataloader.train.total_batch_size={total} must be a multiple of the {world_size} processes; set it "
            f"to e.g. {max(1, total // world_size) * world_size}."
        )
    per_process = total // world_size
    if per_process % per_forward:
        divisors = [n for n in range(1, per_process + 1) if per_process % n == 0]
        raise ConfigError(
            f"train.images_per_forward={per_forward} does not divide the {per_process} images each of the "
            f"{world_size} process(es) takes per step (dataloader.train.total_batch_size={total}); gradient "
            f"accumulation needs {per_process} / images_per_forward forward passes. Set "
            f"train.images_per_forward to one of {divisors}, or change dataloader.train.total_batch_size."
        )
    return per_process // per_forward


def get_lr_scale(cfg: DictConfig) -> float | None:
    """``total_batch_size / base_batch_size`` when ``train.auto_scale_lr.enabled``, else None.

    Raises:
        ConfigError: a base batch that is not a positive integer, or no ``dataloader.train.total_batch_size``.
    """
    settings = OmegaConf.select(cfg, "train.auto_scale_lr", default=None)
    if not settings or not settings.get("enabled", False):
        return None
    base = settings.get("base_batch_size")
    if not _positive_int(base):
        raise ConfigError(
            f"train.auto_scale_lr.base_batch_size={base!r}: must be an integer >= 1, the total batch the "
            "recipe's optimizer.lr was set for (16 for the detectron2-style recipes)."
        )
    total = OmegaConf.select(cfg, "dataloader.train.total_batch_size", default=None)
    if not _positive_int(total):
        raise ConfigError(
            f"train.auto_scale_lr.enabled=true needs dataloader.train.total_batch_size (an integer >= 1); got "
            f"{total!r}. Set it, or train.auto_scale_lr.enabled=false."
        )
    return total / base


def scale_learning_rate(cfg: DictConfig, optimizer: torch.optim.Optimizer) -> None:
    """Multiply every param group's ``lr`` by `get_lr_scale` (when enabled), and log it in one line.

    Call it on a new optimizer: the LR schedule starts from the scaled values, and a resumed run gets them
    back from its checkpoint.
    """
    factor = get_lr_scale(cfg)
    if factor is None:
        return
    before = optimizer.param_groups[0]["lr"]
    for group in optimizer.param_groups:
        group["lr"] *= factor
    settings = cfg.train.auto_scale_lr
    logger.info(
        "train.auto_scale_lr: learning rate %g -> %g (x %d / %d: dataloader.train.total_batch_size / "
        "train.auto_scale_lr.base_batch_size)",
        before,
        optimizer.param_groups[0]["lr"],
        cfg.dataloader.train.total_batch_size,
        settings.base_batch_size,
    )
