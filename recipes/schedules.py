"""LR multipliers. Milestones are interpolations of ``train.max_iter`` so `train.max_iter=90000` moves them.

``lr_multiplier``: warmup 1000 iterations from x0.001, then x0.1 at 2/3 and 8/9 of training (detectron2's
LVIS/COCO schedules: 180k -> 120k/160k, 90k -> 60k/80k). ``cosine_lr_multiplier``: warmup, then cosine.
`use_vitdet_lvis_schedule` sets a config to detectron2's ViTDet-family LVIS schedule.
"""

from typing import Any

from lazytrain.config import LazyCall as L
from lazytrain.engine.lr_schedule import WarmupCosineMultiplier, WarmupMultiStepMultiplier

lr_multiplier = L(WarmupMultiStepMultiplier)(
    milestones=["${lazytrain.frac:${train.max_iter},2,3}", "${lazytrain.frac:${train.max_iter},8,9}"],
    gamma=0.1,
    warmup_iters=1000,
    warmup_factor=0.001,
)

cosine_lr_multiplier = L(WarmupCosineMultiplier)(
    max_iter="${train.max_iter}",
    warmup_iters=1000,
    warmup_factor=0.001,
)


def use_vitdet_lvis_schedule(train: Any, lr_multiplier: Any, max_iter: int) -> None:
    """detectron2's LVIS schedule of its ViTDet-family recipes (ViT, Swin, MViTv2): `max_iter` iterations in
    mixed precision, 250 warmup iterations from x0.001, x0.1 at 8/9 and 26/27 of training (interpolations of
    ``train.max_iter``, so an override moves them)."""
    train.max_iter = max_iter
    train.amp.enabled = True
    lr_multiplier.warmup_iters = 250
    lr_multiplier.milestones = [
        "${lazytrain.frac:${train.max_iter},8,9}",
        "${lazytrain.frac:${train.max_iter},26,27}",
    ]
