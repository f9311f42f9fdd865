"""Hooks that look at where time and memory go: `TorchProfiler` (a Chrome trace of a window of steps) and
`TorchMemoryStats` (CUDA memory peaks, logged)."""

from __future__ import annotations

import logging
import os

import torch

from lazytrain.engine.hooks.period import is_period_end
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm

__all__ = ["TorchMemoryStats", "TorchProfiler"]

logger = logging.getLogger(__name__)


class TorchProfiler(HookBase):
    """Profile iterations ``[start_iter, end_iter)`` with torch.profiler and write a Chrome trace.

    Add it from the command line: ``+train.hooks.profiler="{_target_: lazytrain.engine.hooks.TorchProfiler,
    output_dir: ${train.output_dir}}"``.
    """

    def __init__(self, output_dir: str, start_iter: int = 5, end_iter: int = 10) -> None:
        self.output_dir = output_dir
        self.start_iter = start_iter
        self.end_iter = end_iter
        self._profiler = None

    def before_step(self) -> None:
        if self.trainer.iter == self.start_iter:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            self._profiler.__enter__()

    def after_step(self) -> None:
        if self._profiler is not None and self.trainer.iter + 1 >= self.end_iter:
            self._finish()

    def after_train(self) -> None:
        if self._profiler is not None:  # training ended inside the profiled window
            self._finish()

    def _finish(self) -> None:
        self._profiler.__exit__(None, None, None)
        os.makedirs(self.output_dir, exist_ok=True)
        path = os.path.join(
            self.output_dir, f"profiler-trace-rank{comm.get_rank()}-iter{self.trainer.iter}.json"
        )
        self._profiler.export_chrome_trace(path)
        logger.info("Profiler trace written to %s", path)
        self._profiler = None


class TorchMemoryStats(HookBase):
    """Log CUDA memory statistics every `period` iterations (a no-op without CUDA)."""

    def __init__(self, period: int = 20, max_runs: int = 10) -> None:
        self.period = period
        self.max_runs = max_runs
        self._runs = 0

    def after_step(self) -> None:
        if not torch.cuda.is_available() or self._runs >= self.max_runs:
            return
        if is_period_end(self.trainer, self.period):
            self._runs += 1
            allocated = torch.cuda.max_memory_allocated() / 1024**2
            reserved = torch.cuda.max_memory_reserved() / 1024**2
            logger.info(
                "iter %d: max allocated %.0f MB, max reserved %.0f MB", self.trainer.iter, allocated, reserved
            )
            torch.cuda.reset_peak_memory_stats()
