"""How a tracker's calls reach its library without holding training up: the calls run in a worker thread that
rank 0 waits on for a bounded time (`CallWorker`), failures are tried again after growing pauses until a time
bound (`RetrySchedule`), an error becomes one line (`describe_error`), and the library's own log records go to
``log.txt`` at DEBUG level instead of the console (`library_logs_to_debug`).

The invariant: no tracker call keeps rank 0 away from training for more than its timeout, whatever the library
or its server does, while the other ranks may be waiting for it in the next collective.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "CallTimeout",
    "CallWorker",
    "LibraryExit",
    "RetrySchedule",
    "TrackingLost",
    "describe_error",
    "library_logs_to_debug",
]

logger = logging.getLogger(__name__)

_CAUSE_LENGTH = 240


class CallTimeout(TimeoutError):
    """A tracker call gave no answer within its time; it goes on in its worker thread."""


class LibraryExit(RuntimeError):
    """A tracker call raised `SystemExit` (or another `BaseException` that is not an `Exception`): a library
    that exits on an error it cannot handle. It is a failed call like any other, retried and reported."""


class TrackingLost(RuntimeError):
    """An error that trying again cannot mend (the run's local folder was deleted, say): the tracker stops."""


# SQLAlchemy 2 puts this line above the database's own message when a query's autoflush fails.
_SQLALCHEMY_NOTES = ("(raised as a result of",)


def describe_error(error: BaseException) -> str:
    """``Type: first line of the message``, without what databases add (SQLAlchemy's autoflush note before the
    cause, its statement, parameters and link after), cut to a line's length."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    lines = [line for line in lines if line and not line.startswith(_SQLALCHEMY_NOTES)]
    text = lines[0] if lines else ""
    text = text.split("[SQL:")[0].split("(Background on this error")[0].strip()
    described = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return described if len(described) <= _CAUSE_LENGTH else described[: _CAUSE_LENGTH - 3] + "..."


class _ToDebug(logging.Handler):
    """Re-logs a library's records on `target` at DEBUG level (into log.txt, not onto the console)."""

    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.debug(
            "%s %s: %s", record.name, record.levelname, record.getMessage(), exc_info=record.exc_info
        )


@contextlib.contextmanager
def library_logs_to_debug(names: Sequence[str], target: logging.Logger) -> Iterator[None]:
    """While inside, the records of the loggers `names` (and their children) go to `target` at DEBUG level
    only: a library that logs its own tracebacks on failure (MLflow's SQL store does) prints nothing."""
    handler = _ToDebug(target)
    saved = []
    for name in names:
        library = logging.getLogger(name)
        saved.append((library, library.handlers[:], library.propagate))
        library.handlers = [handler]
        library.propagate = False
    try:
        yield
    finally:
        for library, handlers, propagate in saved:
            library.handlers = handlers
            library.propagate = propagate


class CallWorker:
    """Runs one job at a time in a daemon thread; the caller waits for it at most a given time.

    A job still running when the wait ends goes on (a thread cannot be stopped) and `busy` says so; the caller
    starts nothing more until it has ended. Being a daemon, a stalled call never keeps the process alive.

    Args:
        name: the tracker's name, for the thread and the log.
        library_loggers: the loggers of the library the jobs call (`library_logs_to_debug`).
    """

    def __init__(self, name: str, library_loggers: Sequence[str] = ()) -> None:
        self.name = name
        self.library_loggers = tuple(library_loggers)
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """Whether a job that outlived its wait is still running."""
        return self._thread is not None and self._thread.is_alive()

    def run(self, job: Callable[[], None], timeout: float) -> None:
        """Run `job`, waiting at most `timeout` seconds.

        Raises:
            CallTimeout: the job has not ended in time (or an earlier one is still running).
            KeyboardInterrupt: the job raised it; it is the caller's (the main thread's) to handle as Ctrl-C.
            LibraryExit: the job raised `SystemExit` or another `BaseException` that is not an `Exception`.
            Exception: what the job raised (its traceback goes to the log at DEBUG level).
        """
        if self.busy:
            raise CallTimeout("an earlier call is still running")
        errors: list[BaseException] = []
        done = threading.Event()
        self._thread = threading.Thread(
            target=self._run_job, args=(job, errors, done), name=f"{self.name} call", daemon=True
        )
        self._thread.start()
        if not done.wait(timeout):
            raise CallTimeout(f"no answer in {timeout:g} s")
        if not errors:
            return
        error = errors[0]
        # A KeyboardInterrupt is the user's, not the library's: it goes on in the caller's thread, where
        # Ctrl-C is handled. Anything else that is not an Exception (a library's sys.exit) is a failed call.
        if isinstance(error, (Exception, KeyboardInterrupt)):
            raise error
        raise LibraryExit(f"the library raised {type(error).__name__}({_exit_argument(error)})") from error

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a job that outlived its wait; whether none is running now."""
        if self._thread is not None:
            self._thread.join(max(timeout, 0.0))
        return not self.busy

    def _run_job(self, job: Callable[[], None], errors: list[BaseException], done: threading.Event) -> None:
        try:
            with library_logs_to_debug(self.library_loggers, logger):
                job()
        except BaseException as error:
            # BaseException: a SystemExit left to the thread would end it quietly, and the call would count
            # as delivered. `run` decides what each kind of error means for the caller.
            errors.append(error)
            logger.debug("%s: a call failed", self.name, exc_info=True)
        finally:
            done.set()


def _exit_argument(error: BaseException) -> str:
    """What the error was raised with, as Python would write it (``2``, ``'no server'``), or nothing."""
    return ", ".join(repr(argument) for argument in error.args)


class RetrySchedule:
    """When to try again after failures and when to stop trying.

    After a failure the next attempt waits `first_pause` seconds, doubling with each further failure up to
    `max_pause`; once failures have gone on for `give_up_after` seconds there is no further attempt.

    Args:
        give_up_after: seconds of failures after which the tracker gives up.
        first_pause: the pause after the first failure.
        max_pause: the longest pause between two attempts.
    """

    def __init__(self, give_up_after: float, first_pause: float = 2.0, max_pause: float = 60.0) -> None:
        self.give_up_after = give_up_after
        self.first_pause = first_pause
        self.max_pause = max_pause
        self.failing_since: float | None = None
        self.failures = 0
        self._next_attempt = 0.0

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def is_due(self, now: float) -> bool:
        return now >= self._next_attempt

    def is_exhausted(self, now: float) -> bool:
        return self.failing_since is not None and now - self.failing_since >= self.give_up_after

    def record_failure(self, now: float) -> bool:
        """Count a failed attempt; True for the first of a series (the one to tell the user about)."""
        first = self.failing_since is None
        if first:
            self.failing_since = now
        self.failures += 1
        pause = min(self.first_pause * 2 ** (self.failures - 1), self.max_pause)
        self._next_attempt = now + pause
        return first

    def record_success(self) -> None:
        self.failing_since = None
        self.failures = 0
        self._next_attempt = 0.0

    def describe_series(self, now: float) -> str:
        """``3 attempts over 2 min 10 s``: the failures so far."""
        seconds = now - self.failing_since if self.failing_since is not None else 0.0
        if seconds >= 60:
            span = f"{int(seconds) // 60} min {int(seconds) % 60} s"
        else:
            span = f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
        return f"{self.failures} attempt{'s' if self.failures != 1 else ''} over {span}"
