"""`PeriodicWriter`: the event writers (console line, ``metrics.json``, TensorBoard) run every `period` steps
and at the end, on the main process."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lazytrain.engine.hooks.period import is_period_end
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm
from lazytrain.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardWriter

__all__ = ["PeriodicWriter"]


class PeriodicWriter(HookBase):
    """Run the writers every `period` iterations and at the end (main process only).

    Args:
        output_dir: where ``metrics.json`` and TensorBoard events go (``${train.output_dir}``).
        period: write every this many iterations.
        writers: explicit writers; default: console line, ``metrics.json`` and TensorBoard (if installed).
        tensorboard: include the TensorBoard writer in the defaults.
    """

    def __init__(
        self,
        output_dir: str = "",
        period: int = 20,
        writers: Sequence[EventWriter] | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.output_dir = output_dir
        self.period = period
        self.writers = list(writers) if writers is not None else None
        self.tensorboard = tensorboard

    def before_train(self) -> None:
        if self.writers is None:
            self.writers = []
            if comm.is_main_process():
                self.writers.append(CommonMetricPrinter(self.trainer.max_iter))
                if self.output_dir:
                    json_file = os.path.join(self.output_dir, "metrics.json")
                    self.writers.append(JSONWriter(json_file, start_iter=self.trainer.start_iter))
                    if self.tensorboard:
                        self.writers.append(TensorboardWriter(self.output_dir))

    def after_step(self) -> None:
        if is_period_end(self.trainer, self.period) or self.trainer.iter + 1 >= self.trainer.max_iter:
            for writer in self.writers:
                writer.write()

    def after_train(self) -> None:
        for writer in self.writers or []:
            writer.write()
            writer.close()
