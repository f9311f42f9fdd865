"""The checkpoint hooks: `PeriodicCheckpointer` (every `period` steps, the last few kept, and the final one) and
`BestCheckpointer` (whenever the evaluated metric improves).

Both save through ``trainer.checkpointer`` on every rank (saving gathers per-rank state), so their decisions
depend only on what every rank knows alike: the iteration, the agreed stop signal, and evaluation results that
`EvalHook` shares with all ranks.
"""

from __future__ import annotations

import logging
import math
import os

from lazytrain.engine.hooks.period import is_period_end
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm

__all__ = ["BestCheckpointer", "PeriodicCheckpointer"]

logger = logging.getLogger(__name__)


class PeriodicCheckpointer(HookBase):
    """Save ``model_{iter:07d}.pth`` every `period` iterations, keep the last `max_to_keep`, and save
    ``model_final.pth`` after the last iteration (through ``trainer.checkpointer``).

    Args:
        period: save every this many iterations (``${train.checkpointer.period}``).
        max_to_keep: how many periodic checkpoints to keep (None: all); ``model_final`` and
            ``model_best`` are never deleted. Survives resume: the list of kept files is hook state.
        file_prefix: file name prefix.
    """

    def __init__(self, period: int, max_to_keep: int | None = None, file_prefix: str = "model") -> None:
        if period <= 0:
            raise ValueError(
                f"PeriodicCheckpointer(period=) must be > 0; got {period} (train.checkpointer.period)"
            )
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(
                f"PeriodicCheckpointer(max_to_keep=) must be >= 1 or None (keep all); got {max_to_keep}"
            )
        self.period = period
        self.max_to_keep = max_to_keep
        self.file_prefix = file_prefix
        self._saved: list[str] = []  # basenames of periodic checkpoints, oldest first

    def after_step(self) -> None:
        trainer = self.trainer
        if trainer.checkpointer is None:
            return
        # On a stop request (SIGTERM/SIGINT) this step is saved like a periodic one, so it is rotated too.
        due = is_period_end(trainer, self.period) or trainer.agreed_stop_signal
        if due and trainer.iter + 1 < trainer.max_iter:
            name = f"{self.file_prefix}_{trainer.iter:07d}"
            # Recorded before saving, so the checkpoint's own copy of this list includes it.
            self._saved.append(f"{name}.pth")
            trainer.checkpointer.save(name, iteration=trainer.iter)
            self._remove_old()
        if trainer.iter + 1 >= trainer.max_iter:
            trainer.checkpointer.save(f"{self.file_prefix}_final", iteration=trainer.iter)

    def _remove_old(self) -> None:
        if self.max_to_keep is None:
            return
        save_dir = self.trainer.checkpointer.save_dir
        while len(self._saved) > self.max_to_keep:
            old = os.path.join(save_dir, self._saved.pop(0))
            if save_dir and comm.is_main_process() and os.path.exists(old):
                os.remove(old)

    def state_dict(self) -> dict:
        return {"saved": list(self._saved)}

    def load_state_dict(self, state: dict) -> None:
        self._saved = [os.path.basename(path) for path in state.get("saved", [])]


class BestCheckpointer(HookBase):
    """Save ``model_best.pth`` when `val_metric` (e.g. ``segm/AP``) improves; NaN is never best.

    Place it after the `EvalHook` in ``train.hooks`` with the same period.
    """

    def __init__(
        self, eval_period: int, val_metric: str, mode: str = "max", file_prefix: str = "model_best"
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer(mode=) must be 'max' or 'min'; got {mode!r}")
        self.eval_period = eval_period
        self.val_metric = val_metric
        self.mode = mode
        self.file_prefix = file_prefix
        self.best_value: float | None = None
        self.best_iter: int | None = None

    def _improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value if self.mode == "max" else value < self.best_value

    def _check(self) -> None:
        latest = self.trainer.storage.latest()
        if self.val_metric not in latest:
            logger.warning(
                "BestCheckpointer: metric '%s' not found; recorded: %s", self.val_metric, sorted(latest)
            )
            return
        value, iteration = latest[self.val_metric]
        if iteration != self.trainer.iter or not self._improves(value):
            return
        self.best_value, self.best_iter = value, iteration
        if self.trainer.checkpointer is not None:
            self.trainer.checkpointer.save(self.file_prefix, iteration=iteration)
        logger.info("New best %s = %.4f at iteration %d", self.val_metric, value, iteration)

    def after_step(self) -> None:
        # No evaluation ran at a stop (skipped or abandoned by the EvalHook).
        if is_period_end(self.trainer, self.eval_period) and not self.trainer.agreed_stop_signal:
            self._check()

    def after_train(self) -> None:
        if self.trainer.iter >= self.trainer.max_iter:
            self._check()

    def state_dict(self) -> dict:
        return {"best_value": self.best_value, "best_iter": self.best_iter}

    def load_state_dict(self, state: dict) -> None:
        self.best_value, self.best_iter = state.get("best_value"), state.get("best_iter")
