"""Stopping training on a signal without losing work: what SLURM preemption and Ctrl-C need.

SLURM (and most schedulers) send SIGTERM some time before killing a preempted job; a user presses Ctrl-C
(SIGINT). While the training loop runs, the first of either is only recorded (`StopRequest`); the trainer
finishes the current step, all ranks agree on the same last iteration, a checkpoint is written, the
``after_train`` hooks run, and `TrainingInterrupted` ends the run with exit status ``128 + signal`` (143 for
SIGTERM, 130 for SIGINT), so that scripts see the run did not finish. ``train.resume=true`` continues
exactly from there. A second Ctrl-C stops at once (KeyboardInterrupt); the checkpoints already on disk stay
complete because every write is atomic. A second SIGTERM is ignored: SLURM signals every process of a job, so
spawned ranks get one from SLURM and one forwarded by their parent.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

__all__ = ["STOP_SIGNALS", "StopRequest", "TrainingInterrupted", "signal_name"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """``15 -> "SIGTERM"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingInterrupted(Exception):
    """Training stopped early on a signal, after its checkpoint was written.

    Attributes:
        signum: the signal that asked to stop.
        exit_code: the process exit status to use, ``128 + signum`` (the shell's convention).
    """

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopRequest:
    """While active (a context manager), the first SIGTERM or SIGINT is recorded in `signum` instead of
    ending the process; a second SIGINT raises KeyboardInterrupt, a second SIGTERM is ignored.

    Signals that the process ignores when it enters (``SIG_IGN``, as spawned ranks ignore SIGINT so that only
    their parent reacts to Ctrl-C) are left alone, and outside the main thread nothing is installed (Python
    delivers signals to the main thread only). The previous handlers are restored on exit.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue
            self._previous[signum] = previous
            signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum == 0:
            self.signum = signum
            self._on_first_request(signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    def _on_first_request(self, signum: int) -> None:
        """What else to do on the first request (subclasses). Here nothing: this runs between two bytecodes of
        the main thread, and the training loop reports the request when it sees it."""
