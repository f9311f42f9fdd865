"""Logging setup (rank-aware, as detectron2's setup_logger) and rate-limited logging helpers."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping

__all__ = ["create_small_table", "log_every_n", "log_every_n_seconds", "log_first_n", "setup_logger"]

_FORMAT = "[%(asctime)s %(name)s %(levelname)s] %(message)s"
_DATE_FORMAT = "%m/%d %H:%M:%S"


class _ColorfulFormatter(logging.Formatter):
    _COLORS = {logging.WARNING: "\033[33m", logging.ERROR: "\033[31;1m", logging.CRITICAL: "\033[31;1m"}

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        color = self._COLORS.get(record.levelno)
        return f"{color}{text}\033[0m" if color else text


def _has_handler(logger: logging.Logger, marker: str) -> bool:
    return any(getattr(h, "_lazytrain_marker", None) == marker for h in logger.handlers)


def setup_logger(
    output: str | None = None, distributed_rank: int = 0, *, name: str = "lazytrain", color: bool = True
) -> logging.Logger:
    """Configure the `name` logger: console on rank 0, ``log.txt`` (rank 0) / ``log.txt.rank{N}`` in `output`.

    Idempotent: calling it again does not add duplicate handlers.

    Args:
        output: a directory (log file inside it) or a file path ending in .txt/.log; None for console only.
        distributed_rank: this process's rank; only rank 0 logs to the console.
        name: logger name (``"lazytrain"`` covers the whole library).
        color: color WARNING/ERROR lines on a terminal.
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if distributed_rank == 0 and not _has_handler(logger, "console"):
        handler = logging.StreamHandler(sys.stdout)
        handler.setLevel(logging.INFO)
        use_color = color and sys.stdout.isatty()
        handler.setFormatter((_ColorfulFormatter if use_color else logging.Formatter)(_FORMAT, _DATE_FORMAT))
        handler._lazytrain_marker = "console"
        logger.addHandler(handler)
    if output is not None:
        path = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
        if distributed_rank > 0:
            path = f"{path}.rank{distributed_rank}"
        if not _has_handler(logger, path):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            handler = logging.FileHandler(path, mode="a")
            handler.setLevel(logging.DEBUG)
            handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
            handler._lazytrain_marker = path
            logger.addHandler(handler)
    return logger


_COUNTS: Counter = Counter()
_LAST_TIME: dict[tuple, float] = {}


def _caller_key() -> tuple:
    frame = sys._getframe(2)
    return frame.f_code.co_filename, frame.f_lineno


def log_first_n(level: int, message: str, n: int = 1, *, name: str = "lazytrain") -> None:
    """Log `message` only the first `n` times this call site runs."""
    key = (_caller_key(), message)
    _COUNTS[key] += 1
    if _COUNTS[key] <= n:
        logging.getLogger(name).log(level, message)


def log_every_n(level: int, message: str, n: int = 1, *, name: str = "lazytrain") -> None:
    """Log `message` once every `n` calls from this call site."""
    key = _caller_key()
    _COUNTS[key] += 1
    if n == 1 or _COUNTS[key] % n == 1:
        logging.getLogger(name).log(level, message)


def log_every_n_seconds(level: int, message: str, n: float = 1.0, *, name: str = "lazytrain") -> None:
    """Log `message` at most once every `n` seconds from this call site."""
    key = _caller_key()
    now = time.perf_counter()
    if key not in _LAST_TIME or now - _LAST_TIME[key] >= n:
        _LAST_TIME[key] = now
        logging.getLogger(name).log(level, message)


def create_small_table(values: Mapping[str, float]) -> str:
    """A one-row markdown table of named numbers, e.g. AP metrics."""
    keys = list(values)
    cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in values.values()]
    widths = [max(len(k), len(c)) for k, c in zip(keys, cells)]
    header = "| " + " | ".join(k.ljust(w) for k, w in zip(keys, widths)) + " |"
    rule = "|" + "|".join(":" + "-" * (w + 1) for w in widths) + "|"
    row = "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([header, rule, row])
