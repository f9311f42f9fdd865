"""`LRScheduler`: every parameter group's learning rate set from the iteration before each step.

The multipliers it applies are in `lazytrain.engine.lr_schedule`.
"""

from __future__ import annotations

from collections.abc import Callable

from lazytrain.engine.train_loop import HookBase

__all__ = ["LRScheduler"]


class LRScheduler(HookBase):
    """Set every param group's LR to ``initial_lr * multiplier(iteration)`` before each step.

    The LR is a pure function of the iteration, so this hook has no state of its own: a resumed run (whose
    optimizer state restores ``initial_lr``) continues the schedule exactly.

    Args:
        multiplier: a callable ``iteration -> factor`` (see `lazytrain.engine.lr_schedule`); in configs,
            ``multiplier="${lr_multiplier}"``.
    """

    def __init__(self, multiplier: Callable[[int], float]) -> None:
        self.multiplier = multiplier

    def before_train(self) -> None:
        for group in self.trainer.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])

    def before_step(self) -> None:
        factor = self.multiplier(self.trainer.iter)
        groups = self.trainer.optimizer.param_groups
        for group in groups:
            group["lr"] = group["initial_lr"] * factor
        self.trainer.storage.put_scalar("lr", groups[0]["lr"], smoothing_hint=False)
