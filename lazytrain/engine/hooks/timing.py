"""`IterationTimer`: the time of each step (the ``time`` metric) and the training speed at the end."""

from __future__ import annotations

import datetime
import logging
import time

from lazytrain.engine.train_loop import HookBase

__all__ = ["IterationTimer"]

logger = logging.getLogger(__name__)


class IterationTimer(HookBase):
    """Put the step time as ``time`` and log the total training time at the end.

    Args:
        warmup_iter: steps left out of the logged speed (the first steps build caches and warm up).
    """

    def __init__(self, warmup_iter: int = 3) -> None:
        self._warmup = warmup_iter
        self._step_start = 0.0
        self._train_start = 0.0
        self._steps = 0
        self._measured = 0.0

    def before_train(self) -> None:
        self._train_start = time.perf_counter()

    def before_step(self) -> None:
        self._step_start = time.perf_counter()

    def after_step(self) -> None:
        seconds = time.perf_counter() - self._step_start
        self._steps += 1
        if self._steps > self._warmup:
            self._measured += seconds
        self.trainer.storage.put_scalar("time", seconds)

    def after_train(self) -> None:
        total = time.perf_counter() - self._train_start
        counted = self._steps - self._warmup
        if counted > 0:
            logger.info(
                "Overall training speed: %d iterations in %s (%.4f s / it)",
                counted,
                datetime.timedelta(seconds=int(self._measured)),
                self._measured / counted,
            )
        logger.info("Total training time: %s", datetime.timedelta(seconds=int(total)))
