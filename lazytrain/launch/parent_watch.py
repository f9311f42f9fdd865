"""A sweep job running in a worker process stops cleanly when the sweep's main process goes away.

The joblib launcher runs each job in a loky worker, a child of the ``python -m lazytrain ... -m`` process. When
that process is stopped alone (``kill PID``, ``timeout``, a scheduler signalling only the process it started;
Ctrl-C reaches the whole process group and is not this case), its default SIGTERM action ends it at once and
the workers, orphaned, would train to the end with nobody to report to, and then wait forever for the pipe
of a parent that is gone. `ParentWatch` notices within a second that the job's parent changed and stops the
job as a SIGTERM does (the step finishes, the checkpoint is written, ``train.resume=true`` continues), then
ends the process, since its result has nowhere to go.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import TracebackType

__all__ = ["SWEEP_PID_ENV", "ParentWatch", "mark_sweep_process", "watch_sweep_parent"]

SWEEP_PID_ENV = "LAZYTRAIN_SWEEP_PID"

logger = logging.getLogger(__name__)


def mark_sweep_process() -> None:
    """Record this process as the one that runs the sweep; the job processes it starts inherit the mark."""
    os.environ[SWEEP_PID_ENV] = str(os.getpid())


def watch_sweep_parent(poll_seconds: float = 1.0) -> ParentWatch:
    """A `ParentWatch` on the sweep's main process for a job that runs in a child of it (joblib's workers); an
    inactive one for a job in the main process itself (the basic launcher) or elsewhere (submitit)."""
    try:
        sweep_pid = int(os.environ.get(SWEEP_PID_ENV, "0"))
    except ValueError:
        sweep_pid = 0
    is_child = sweep_pid > 0 and os.getpid() != sweep_pid and os.getppid() == sweep_pid
    return ParentWatch(sweep_pid if is_child else None, poll_seconds)


class ParentWatch:
    """While active (a context manager), a daemon thread checks every `poll_seconds` whether this process's
    parent is still `parent_pid`; when it is not, the process sends itself SIGTERM (the trainer's stop request:
    checkpoint, then `TrainingInterrupted`) and, when the block ends, exits with ``os._exit`` after flushing
    the logs. With ``parent_pid=None`` it does nothing.

    Attributes:
        orphaned: whether the parent was seen gone.
    """

    def __init__(self, parent_pid: int | None, poll_seconds: float = 1.0) -> None:
        self.parent_pid = parent_pid
        self.poll_seconds = poll_seconds
        self.orphaned = False
        self._done = threading.Event()

    def __enter__(self) -> ParentWatch:
        if self.parent_pid is not None:
            threading.Thread(target=self._watch, name="lazytrain-parent-watch", daemon=True).start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(self.poll_seconds):
            if os.getppid() != self.parent_pid:
                self.orphaned = True
                logger.warning(
                    "The sweep's main process (pid %d) is gone: stopping this job as on SIGTERM (checkpoint, "
                    "then exit); run the sweep again with train.resume=true to continue it.",
                    self.parent_pid,
                )
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._done.set()
        if not self.orphaned:
            return
        # Returning would hand the job's result (or its exit) to a worker loop whose parent is gone, which
        # blocks for good. Everything worth keeping (checkpoint, logs) is written by now.
        code = 0 if exc is None else 1
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            code = exc.code  # 143 after a clean stop on SIGTERM
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
