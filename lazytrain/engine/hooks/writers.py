"""`PeriodicWriter`: the event writers (console line, ``metrics.json``, TensorBoard) run every `period` steps
and at the end, on the main process."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from lazytrain.engine.hooks.period import is_period_end
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm
from lazytrain.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardWriter

__all__ = ["PeriodicWriter"]

logger = logging.getLogger(__name__)

# What a nonzero count of the fixed-shape step's counters (`lazytrain.modeling.FixedShapeCounters`) means.
_COUNTER_WARNINGS = {
    "dropped_mask_positives": (
        "the mask branch left out %d foreground RoIs beyond model.fixed_shapes.mask_positives (a uniform "
        "subsample trained instead); set it to null (the sampler's most positives) to train on all of them"
    ),
    "nms_not_final": (
        "the RPN's NMS needed more greedy steps than the fixed-shape step takes (%d times); there it kept "
        "fewer proposals than the dynamic step (a subset: none that greedy NMS suppresses)"
    ),
}


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
        self._counted: dict[str, int] = {}  # the model's counter totals at the last write
        self._warned: set[str] = set()

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
            self._put_model_counters()
            for writer in self.writers:
                writer.write()

    def after_train(self) -> None:
        for writer in self.writers or []:
            writer.write()
            writer.close()

    def _put_model_counters(self) -> None:
        """The model's device counters (``fixed_shape_counters`` of an `RCNN` training with fixed shapes,
        summed over its steps) as metrics ``fixed_shapes/<name>``: the counts of the steps since the last
        write, summed over the processes. Read here only (every process runs this hook at the same
        iterations, so the sum is one collective per write, none per step), as reading one waits for the
        device; a warning the first time each is nonzero."""
        model = getattr(self.trainer, "model", None)
        if model is None:
            return
        counters = getattr(comm.unwrap_model(model), "fixed_shape_counters", None)
        if counters is None:
            return
        counts = {}
        for name, value in counters._asdict().items():
            total, before = int(value), self._counted.get(name, 0)
            self._counted[name] = total
            # Counts since the last write; where the model's totals were reset, all of them.
            counts[name] = torch.tensor(total - before if total >= before else total, device=value.device)
        counts = comm.reduce_dict(counts, average=False)  # on the main process: every process's counts
        if not comm.is_main_process():
            return
        for name, value in counts.items():
            count = round(float(value))
            self.trainer.storage.put_scalar(f"fixed_shapes/{name}", count, smoothing_hint=False)
            if count and name in _COUNTER_WARNINGS and name not in self._warned:
                self._warned.add(name)
                logger.warning("Fixed shapes: " + _COUNTER_WARNINGS[name] + ".", count)
