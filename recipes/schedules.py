"""LR multipliers. Milestones are interpolations of ``train.max_iter`` so `train.max_iter=90000` moves them.

``lr_multiplier``: warmup 1000 iterations from x0.001, then x0.1 at 2/3 and 8/9 of training (detectron2's
LVIS/COCO schedules: 180k -> 120k/160k, 90k -> 60k/80k). ``cosine_lr_multiplier``: warmup, then cosine.
"""

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
