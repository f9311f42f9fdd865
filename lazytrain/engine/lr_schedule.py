"""Learning-rate multipliers: callables ``iteration -> factor`` of the base LR (a pure function of the
iteration, so a resumed run continues the schedule exactly). The `LRScheduler` hook applies them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["WarmupCosineMultiplier", "WarmupMultiStepMultiplier"]


def _warmup_factor(iteration: int, warmup_iters: int, warmup_factor: float) -> float:
    if iteration >= warmup_iters:
        return 1.0
    alpha = iteration / warmup_iters
    return warmup_factor * (1 - alpha) + alpha


class WarmupMultiStepMultiplier:
    """Linear warmup from `warmup_factor` over `warmup_iters`, then x`gamma` at each milestone.

    Args:
        milestones: increasing iterations where the LR is multiplied by `gamma`.
        gamma: factor per milestone.
        warmup_iters: length of the linear warmup.
        warmup_factor: multiplier at iteration 0.
    """

    def __init__(
        self,
        milestones: Sequence[int],
        gamma: float = 0.1,
        warmup_iters: int = 1000,
        warmup_factor: float = 0.001,
    ) -> None:
        milestones = [int(m) for m in milestones]
        if milestones != sorted(milestones):
            raise ValueError(f"WarmupMultiStepMultiplier(milestones=) must increase; got {milestones}")
        self.milestones = milestones
        self.gamma = gamma
        self.warmup_iters = warmup_iters
        self.warmup_factor = warmup_factor

    def __call__(self, iteration: int) -> float:
        steps = bisect.bisect_right(self.milestones, iteration)
        return _warmup_factor(iteration, self.warmup_iters, self.warmup_factor) * self.gamma**steps


class WarmupCosineMultiplier:
    """Cosine decay from 1 at iteration 0 to `final_factor` at `max_iter`, times a linear warmup.

    As in detectron2, the cosine spans the whole run and the warmup factor multiplies it during the first
    `warmup_iters` iterations. In recipes, ``max_iter="${train.max_iter}"``.
    """

    def __init__(
        self, max_iter: int, warmup_iters: int = 1000, warmup_factor: float = 0.001, final_factor: float = 0.0
    ) -> None:
        if max_iter <= 0:
            raise ValueError(f"WarmupCosineMultiplier(max_iter=) must be > 0; got {max_iter}")
        self.max_iter = max_iter
        self.warmup_iters = warmup_iters
        self.warmup_factor = warmup_factor
        self.final_factor = final_factor

    def __call__(self, iteration: int) -> float:
        progress = min(iteration / self.max_iter, 1.0)
        cosine = self.final_factor + (1 - self.final_factor) * 0.5 * (1 + math.cos(math.pi * progress))
        return _warmup_factor(iteration, self.warmup_iters, self.warmup_factor) * cosine
