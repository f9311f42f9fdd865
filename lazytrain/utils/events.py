"""Training events: `EventStorage` (scalars with history, images, histograms) and the writers that emit them.

The trainer opens an `EventStorage` for the whole run; any code can reach it with `get_event_storage()` and
`put_scalar`. Writers (`CommonMetricPrinter`, `JSONWriter`, `TensorboardWriter`) read it periodically.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import math
import os
import statistics
import time
from collections import defaultdict, deque
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "CommonMetricPrinter",
    "EventStorage",
    "EventWriter",
    "HistoryBuffer",
    "JSONWriter",
    "TensorboardWriter",
    "format_metrics_line",
    "get_event_storage",
    "get_scalars_by_iteration",
    "parse_metrics_line",
]

logger = logging.getLogger(__name__)
_STORAGE_STACK: list[EventStorage] = []


def get_event_storage() -> EventStorage:
    """The innermost open `EventStorage` (raises if none is open: call it inside training)."""
    if not _STORAGE_STACK:
        raise RuntimeError("get_event_storage() must be called inside a `with EventStorage(...)` block.")
    return _STORAGE_STACK[-1]


class HistoryBuffer:
    """The last `max_length` values of a scalar with the iteration each was put at, plus a global mean.

    Windowed statistics cost O(window), not O(history), so writers stay cheap in long runs.
    """

    def __init__(self, max_length: int = 1000000) -> None:
        self._data: deque[tuple[float, int]] = deque(maxlen=max_length)
        self._count = 0
        self._total = 0.0

    def update(self, value: float, iteration: int) -> None:
        self._data.append((value, iteration))
        self._count += 1
        self._total += value

    def latest(self) -> float:
        return self._data[-1][0]

    def latest_iteration(self) -> int:
        """The iteration the newest value was put at."""
        return self._data[-1][1]

    def _window(self, window: int) -> list[float]:
        return [value for value, _ in itertools.islice(reversed(self._data), window)]

    def median(self, window: int) -> float:
        return float(statistics.median(self._window(window)))

    def avg(self, window: int) -> float:
        return statistics.fmean(self._window(window))

    def global_avg(self) -> float:
        return self._total / max(self._count, 1)

    def values(self) -> list[tuple[float, int]]:
        return list(self._data)

    def state_dict(self, max_values: int) -> dict[str, Any]:
        """The last `max_values` values and iterations (as tensors) and the running sum and count."""
        tail = list(itertools.islice(reversed(self._data), max_values))[::-1]
        return {
            "values": torch.tensor([value for value, _ in tail], dtype=torch.float64),
            "iterations": torch.tensor([iteration for _, iteration in tail], dtype=torch.int64),
            "count": self._count,
            "total": self._total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._data.clear()
        self._data.extend(zip(state["values"].tolist(), state["iterations"].tolist()))
        self._count, self._total = int(state["count"]), float(state["total"])


class EventStorage:
    """Per-run store of metrics. Use as a context manager: ``with EventStorage(start_iter) as storage:``.

    Args:
        start_iter: the iteration the run starts (or resumes) at.
    """

    def __init__(self, start_iter: int = 0) -> None:
        self.iter = start_iter
        self._history: dict[str, HistoryBuffer] = defaultdict(HistoryBuffer)
        self._latest: dict[str, tuple[float, int]] = {}
        self._smoothing_hints: dict[str, bool] = {}
        self._prefix = ""
        self.images: list[tuple[str, torch.Tensor, int]] = []
        self.histograms: list[dict[str, Any]] = []

    def __enter__(self) -> EventStorage:
        _STORAGE_STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        assert _STORAGE_STACK[-1] is self
        _STORAGE_STACK.pop()

    def put_scalar(
        self, name: str, value: float, smoothing_hint: bool = True, *, cur_iter: int | None = None
    ) -> None:
        """Record a scalar at the current (or given) iteration; `smoothing_hint` asks writers for a median."""
        name = self._prefix + name
        value = float(value.detach().item() if isinstance(value, torch.Tensor) else value)
        iteration = self.iter if cur_iter is None else cur_iter
        self._history[name].update(value, iteration)
        self._latest[name] = (value, iteration)
        self._smoothing_hints.setdefault(name, smoothing_hint)

    def put_scalars(
        self, *, smoothing_hint: bool = True, cur_iter: int | None = None, **values: float
    ) -> None:
        for name, value in values.items():
            self.put_scalar(name, value, smoothing_hint, cur_iter=cur_iter)

    def put_image(self, name: str, image: torch.Tensor) -> None:
        """Queue a CHW float image in [0, 1] for TensorBoard."""
        self.images.append((self._prefix + name, image, self.iter))

    def put_histogram(self, name: str, values: torch.Tensor, bins: int = 64) -> None:
        """Queue a histogram of `values` for TensorBoard."""
        values = values.detach().float().cpu()
        counts = torch.histc(values, bins=bins)
        edges = torch.linspace(values.min().item(), values.max().item(), bins + 1)
        self.histograms.append(
            {
                "tag": self._prefix + name,
                "min": values.min().item(),
                "max": values.max().item(),
                "num": values.numel(),
                "sum": values.sum().item(),
                "sum_squares": (values**2).sum().item(),
                "bucket_limits": edges[1:].tolist(),
                "bucket_counts": counts.tolist(),
                "global_step": self.iter,
            }
        )

    def history(self, name: str) -> HistoryBuffer:
        if name not in self._history:
            raise KeyError(f"no history for metric '{name}'; recorded: {sorted(self._history)}")
        return self._history[name]

    def histories(self) -> dict[str, HistoryBuffer]:
        return dict(self._history)

    def latest(self) -> dict[str, tuple[float, int]]:
        """name -> (latest value, iteration it was put at)."""
        return dict(self._latest)

    def latest_with_smoothing_hint(self, window: int = 20) -> dict[str, tuple[float, int]]:
        """Like `latest`, with the windowed median for scalars that asked for smoothing."""
        return {
            name: (self._history[name].median(window) if self._smoothing_hints[name] else value, iteration)
            for name, (value, iteration) in self._latest.items()
        }

    def state_dict(self, max_values: int = 1000) -> dict[str, Any]:
        """The recent history of every scalar (checkpointed, so that a resumed run prints and writes the same
        windowed medians as an uninterrupted one)."""
        return {name: history.state_dict(max_values) for name, history in self._history.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the histories `state_dict` returned; the latest values are not restored, so writers only
        write what is put after this."""
        for name, history in state.items():
            self._history[name].load_state_dict(history)

    def step(self) -> None:
        """Advance to the next iteration (the trainer calls it after each step)."""
        self.iter += 1

    @contextmanager
    def name_scope(self, name: str):
        """Prefix every scalar put inside the block with ``name/``."""
        old = self._prefix
        self._prefix = f"{old}{name.rstrip('/')}/"
        try:
            yield
        finally:
            self._prefix = old

    def clear_images(self) -> None:
        self.images = []

    def clear_histograms(self) -> None:
        self.histograms = []


class EventWriter:
    """Base of writers: `write()` is called periodically, `close()` at the end."""

    def write(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JSONWriter(EventWriter):
    """Append one JSON object per written iteration to `json_file` (``metrics.json``), flushed each time.

    A training run passes its `start_iter`. A resumed one (`start_iter` > 0) first removes the lines of that
    and later iterations (written before the run was stopped, and about to be written again), so the file
    reads as if the run had never stopped. One that starts at 0 over an existing file (resumed from no
    checkpoint: its first attempt failed before one) moves that file aside to ``metrics.earlier-N.json`` (N
    the first free number; nothing is lost; an empty file is reused) and starts afresh, instead of mixing two
    runs' iterations. Without `start_iter` (an evaluation) lines are appended.

    Each line holds ``iteration`` and every scalar updated since the last write (windowed median for
    smoothed ones), e.g. ``{"iteration": 99, "total_loss": 0.4, "lr": 0.02, "bbox/AP": 31.2}``. A value that
    is not finite (an AP of no category, a diverged loss) is written as ``null``, so the file is strict JSON
    that any parser reads; `parse_metrics_line` reads it back as NaN.
    """

    def __init__(self, json_file: str, window_size: int = 20, *, start_iter: int | None = None) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(json_file)), exist_ok=True)
        if start_iter == 0 and os.path.exists(json_file) and os.path.getsize(json_file) > 0:
            kept = _set_aside(json_file)
            logger.warning(
                f"{json_file}: this run starts at iteration 0 over the metrics of an earlier attempt; they are "
                f"kept in {kept}."
            )
        elif start_iter and os.path.exists(json_file):
            _drop_lines_from(json_file, start_iter)
        self._file = open(json_file, "a")
        self._window = window_size
        self._last_written = -1

    def write(self) -> None:
        by_iter = get_scalars_by_iteration(get_event_storage(), self._window, after=self._last_written)
        for iteration in by_iter:
            self._file.write(format_metrics_line(iteration, by_iter[iteration]))
        self._file.flush()
        try:
            os.fsync(self._file.fileno())
        except OSError:
            pass
        if by_iter:
            self._last_written = max(by_iter)

    def close(self) -> None:
        self._file.close()


def format_metrics_line(iteration: int, scalars: dict[str, Any]) -> str:
    """One ``metrics.json`` line: strict JSON (non-finite floats as ``null``, which JSON has no other way to
    say), keys sorted, newline-terminated."""
    values = {
        name: None if isinstance(value, float) and not math.isfinite(value) else value
        for name, value in scalars.items()
    }
    return json.dumps({"iteration": iteration, **values}, sort_keys=True, allow_nan=False) + "\n"


def parse_metrics_line(line: str) -> dict[str, Any]:
    """A ``metrics.json`` line as a dict, ``null`` values as NaN (what was written; files written before
    lazytrain wrote ``null`` hold bare ``NaN``, which Python's json reads too). Raises `json.JSONDecodeError`
    on a line that is not JSON (a truncated last line)."""
    return {name: math.nan if value is None else value for name, value in json.loads(line).items()}


def get_scalars_by_iteration(
    storage: EventStorage, window: int = 20, *, after: int = -1
) -> dict[int, dict[str, float]]:
    """The latest scalars put at iterations after `after`, grouped by iteration in increasing order: what
    ``metrics.json`` gets on its next line(s), windowed medians for smoothed scalars (as `JSONWriter` writes
    them). Experiment trackers (`lazytrain.engine.trackers`) log the same values."""
    by_iter: dict[int, dict[str, float]] = defaultdict(dict)
    for name, (value, iteration) in storage.latest_with_smoothing_hint(window).items():
        if iteration > after:
            by_iter[iteration][name] = value
    return {iteration: by_iter[iteration] for iteration in sorted(by_iter)}


def _set_aside(json_file: str) -> str:
    """Rename `json_file` (``metrics.json``) to the first free ``metrics.earlier-N.json`` beside it."""
    stem, extension = os.path.splitext(json_file)
    number = 1
    while os.path.exists(f"{stem}.earlier-{number}{extension}"):
        number += 1
    kept = f"{stem}.earlier-{number}{extension}"
    os.replace(json_file, kept)
    return kept


def _drop_lines_from(json_file: str, start_iter: int) -> None:
    """Rewrite `json_file` (atomically) without the lines of iterations >= `start_iter`: a resumed run redoes
    them, and a run killed while writing may have left a partial last line."""
    kept = []
    with open(json_file) as f:
        for line in f:
            try:
                iteration = json.loads(line)["iteration"]
            except (ValueError, KeyError, TypeError):
                continue
            if iteration < start_iter:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = f"{json_file}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, json_file)


class CommonMetricPrinter(EventWriter):
    """Log one line per write: eta, iteration, losses (windowed median), time, data_time, lr, max memory."""

    def __init__(self, max_iter: int, window_size: int = 20) -> None:
        self._max_iter = max_iter
        self._window = window_size
        self._last: tuple[int, float] | None = None
        self._last_printed = -1

    def _eta(self, storage: EventStorage) -> str:
        iteration = storage.iter
        try:
            seconds = storage.history("time").median(1000) * (self._max_iter - iteration - 1)
        except KeyError:
            now = time.perf_counter()
            if self._last is None or iteration == self._last[0]:
                self._last = (iteration, now)
                return ""
            seconds = (now - self._last[1]) / (iteration - self._last[0]) * (self._max_iter - iteration - 1)
            self._last = (iteration, now)
        return f"eta: {datetime.timedelta(seconds=int(seconds))}  "

    def write(self) -> None:
        storage = get_event_storage()
        iteration = storage.iter
        if iteration >= self._max_iter or iteration == self._last_printed:
            return  # after training only eval results remain; the eval hook logs them
        self._last_printed = iteration
        histories = storage.histories()
        losses = "  ".join(
            f"{name}: {buffer.median(self._window):.4g}"
            for name, buffer in histories.items()
            if "loss" in name and buffer.latest_iteration() == iteration
        )

        def timing(name: str) -> str:
            return f"{name}: {histories[name].avg(self._window):.4f}  " if name in histories else ""

        lr = f"lr: {histories['lr'].latest():.5g}  " if "lr" in histories else ""
        memory = ""
        if torch.cuda.is_available():
            memory = f"max_mem: {torch.cuda.max_memory_allocated() / 1024**2:.0f}M"
        logging.getLogger("lazytrain.engine").info(
            f" {self._eta(storage)}iter: {iteration}  {losses}  {timing('time')}{timing('data_time')}{lr}{memory}".rstrip()
        )


class TensorboardWriter(EventWriter):
    """Scalars, images and histograms to TensorBoard (needs the `tensorboard` extra; skipped with one
    warning otherwise)."""

    def __init__(self, log_dir: str, window_size: int = 20) -> None:
        self._window = window_size
        self._last_written = -1
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.warning(
                "TensorboardWriter: tensorboard is not installed; install lazytrain[tensorboard]. Skipped."
            )
            self._writer = None
            return
        self._writer = SummaryWriter(log_dir)

    def write(self) -> None:
        if self._writer is None:
            return
        storage = get_event_storage()
        newest = self._last_written
        for name, (value, iteration) in storage.latest_with_smoothing_hint(self._window).items():
            if iteration > self._last_written:
                self._writer.add_scalar(name, value, iteration)
                newest = max(newest, iteration)
        self._last_written = newest
        for name, image, iteration in storage.images:
            self._writer.add_image(name, image, iteration)
        storage.clear_images()
        for histogram in storage.histograms:
            self._writer.add_histogram_raw(**histogram)
        storage.clear_histograms()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
