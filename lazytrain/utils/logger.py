"""Logging setup (rank-aware, as detectron2's setup_logger) and rate-limited logging helpers."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = ["create_small_table", "log_every_n", "log_every_n_seconds", "log_first_n", "setup_logger"]

_FORMAT = "[%(asctime)s %(name)s %(levelname)s] %(message)s"
_DATE_FORMAT = "%m/%d %H:%M:%S"


class _ColorfulFormatter(logging.Formatter):
    """Highlights WARNING (yellow) and ERROR/CRITICAL (red) lines and shortens the logger name prefix."""

    _COLORS = {logging.WARNING: "\033[33m", logging.ERROR: "\033[31;1m", logging.CRITICAL: "\033[31;1m"}

    def __init__(self, *args: Any, color: bool, root_name: str, abbrev_name: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._color = color
        self._root_name = root_name + "."
        self._abbrev_name = abbrev_name + "." if abbrev_name else ""

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)  # other handlers must see the unchanged record
        if record.name.startswith(self._root_name):
            record.name = self._abbrev_name + record.name[len(self._root_name) :]
        text = super().format(record)
        color = self._COLORS.get(record.levelno) if self._color else None
        return f"{color}{text}\033[0m" if color else text


def _has_handler(logger: logging.Logger, marker: str) -> bool:
    return any(getattr(h, "_lazytrain_marker", None) == marker for h in logger.handlers)


def setup_logger(
    output: str | None = None,
    distributed_rank: int = 0,
    name: str = "lazytrain",
    color: bool = True,
    abbrev_name: str | None = None,
    console_level: int | None = None,
) -> logging.Logger:
    """Configure the `name` logger: console on rank 0, ``log.txt`` (rank 0) / ``log.txt.rank{N}`` in `output`.

    Idempotent: calling it again adds no duplicate handler; a different `output` (the next job of a
    multirun) replaces the log file. The logger does not propagate to the root logger, so Hydra's own handlers do not print
    lines twice. To log from your own package as well, call it again with ``name="mypackage"``.

    Args:
        output: a directory (``log.txt`` inside it) or a file path ending in .txt/.log; None: console only.
        distributed_rank: this process's rank; only rank 0 logs to the console, every rank to its own file.
        name: logger name (``"lazytrain"`` covers the whole library).
        color: highlight WARNING/ERROR lines on the console when it is a terminal.
        abbrev_name: shorter name shown on the console for `name` and its children (e.g. ``"lt"`` turns
            ``lazytrain.engine.hooks`` into ``lt.engine.hooks``); None keeps the full name.
        console_level: lowest level shown on the console (``log.txt`` gets everything); None: INFO, or the
            level given by an earlier call.

    Returns:
        The configured logger.
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if distributed_rank == 0 and not _has_handler(logger, "console"):
        _add_console_handler(logger, name, color, abbrev_name)
    for handler in logger.handlers:
        if console_level is not None and getattr(handler, "_lazytrain_marker", None) == "console":
            handler.setLevel(console_level)
    if output is not None:
        _use_log_file(logger, _log_file_path(output, distributed_rank))
    return logger


def _add_console_handler(logger: logging.Logger, name: str, color: bool, abbrev_name: str | None) -> None:
    """An INFO handler on stdout, coloured when stdout is a terminal, showing `name` as `abbrev_name`."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setLevel(logging.INFO)
    handler.setFormatter(
        _ColorfulFormatter(
            _FORMAT,
            _DATE_FORMAT,
            color=color and sys.stdout.isatty(),
            root_name=name,
            abbrev_name=abbrev_name if abbrev_name is not None else name,
        )
    )
    handler._lazytrain_marker = "console"
    logger.addHandler(handler)


def _log_file_path(output: str, distributed_rank: int) -> str:
    """Absolute path of this rank's log file: `output` itself when it names a .txt/.log file, else
    ``output/log.txt``; ranks > 0 add ``.rank{N}``."""
    path = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
    if distributed_rank > 0:
        path = f"{path}.rank{distributed_rank}"
    return os.path.abspath(path)


def _use_log_file(logger: logging.Logger, path: str) -> None:
    """Log everything (DEBUG and up) to `path`, replacing any other log file of `logger`."""
    if _has_handler(logger, path):
        return
    # One log file at a time: the next job of a multirun must not write into the previous job's file.
    for old in [h for h in logger.handlers if isinstance(h, logging.FileHandler)]:
        old.close()
        logger.removeHandler(old)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handler = logging.FileHandler(path, mode="a")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    handler._lazytrain_marker = path
    logger.addHandler(handler)


_COUNTS: Counter = Counter()
_LAST_TIME: dict[tuple, float] = {}


def _caller() -> tuple[tuple[str, int], str]:
    """(file, line) of the call site of the public helper, and the caller's module name."""
    frame = sys._getframe(2)
    return (frame.f_code.co_filename, frame.f_lineno), frame.f_globals.get("__name__", "lazytrain")


def log_first_n(
    level: int, message: str, n: int = 1, *, name: str | None = None, key: str = "caller"
) -> None:
    """Log `message` only the first `n` times.

    Args:
        level: logging level, e.g. ``logging.WARNING``.
        message: the message.
        n: how many times to log it.
        name: logger name; default the calling module's ``__name__``.
        key: what counts as "the same" log: ``"caller"`` (the call site), ``"message"``, or
            ``"caller,message"`` (both).
    """
    site, module = _caller()
    parts = key.split(",")
    unknown = set(parts) - {"caller", "message"}
    if unknown:
        raise ValueError(f"log_first_n(key=) must combine 'caller' and 'message'; got {key!r}")
    count_key = (site if "caller" in parts else None, message if "message" in parts else None)
    _COUNTS[count_key] += 1
    if _COUNTS[count_key] <= n:
        logging.getLogger(name or module).log(level, message)


def log_every_n(level: int, message: str, n: int = 1, *, name: str | None = None) -> None:
    """Log `message` on the 1st, (n+1)-th, (2n+1)-th, ... call from this call site.

    Args:
        level: logging level.
        message: the message.
        n: log once every `n` calls.
        name: logger name; default the calling module's ``__name__``.
    """
    site, module = _caller()
    _COUNTS[site] += 1
    if n <= 1 or _COUNTS[site] % n == 1:
        logging.getLogger(name or module).log(level, message)


def log_every_n_seconds(level: int, message: str, n: float = 1.0, *, name: str | None = None) -> None:
    """Log `message` at most once every `n` seconds from this call site (the first call always logs).

    Args:
        level: logging level.
        message: the message.
        n: minimum number of seconds between two logged lines.
        name: logger name; default the calling module's ``__name__``.
    """
    site, module = _caller()
    now = time.perf_counter()
    if site not in _LAST_TIME or now - _LAST_TIME[site] >= n:
        _LAST_TIME[site] = now
        logging.getLogger(name or module).log(level, message)


def create_small_table(values: Mapping[str, Any]) -> str:
    """A one-row markdown table of named values, e.g. AP metrics (floats shown with 3 decimals).

    Args:
        values: column name -> value, in column order.

    Returns:
        Three lines: header, alignment rule, values.
    """
    keys = list(values)
    cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in values.values()]
    widths = [max(len(k), len(c)) for k, c in zip(keys, cells)]
    header = "| " + " | ".join(k.ljust(w) for k, w in zip(keys, widths)) + " |"
    rule = "|" + "|".join(":" + "-" * (w + 1) for w in widths) + "|"
    row = "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([header, rule, row])
