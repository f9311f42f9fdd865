"""Stopping training on a signal without losing work: what SLURM preemption and Ctrl-C need.

SLURM (and most schedulers) send SIGTERM some time before killing a preempted job; a user presses Ctrl-C
(SIGINT). While the training loop runs, the first of either is only recorded (`StopRequest`); the trainer
finishes the current step, all ranks agree on the same last iteration, a checkpoint is written, the
``after_train`` hooks run, and `TrainingInterrupted` ends the run with exit status ``128 + signal`` (143 for
SIGTERM, 130 for SIGINT), so that scripts see the run did not finish. ``train.resume=true`` continues
exactly from there. A second Ctrl-C stops at once (KeyboardInterrupt); the checkpoints already on disk stay
complete because every write is atomic. A SIGINT within `SAME_CTRL_C_SECONDS` of the first is the same Ctrl-C
delivered twice: a terminal signals its whole foreground process group, and a wrapper in that group (such as
``timeout``) passes the signal it got on to the command as well. A second SIGTERM is ignored: SLURM signals
every process of a job, so spawned ranks get one from SLURM and one forwarded by their parent.

Under submitit (``hydra/launcher=submitit_slurm``), the scheduler's "time is almost up / preempted" signal is
SIGUSR2 and submitit's handler for it requeues the job. `StopRequest` treats it as a stop request too
(`REQUEUE_SIGNAL`, only when some handler is installed for it): the step finishes, the checkpoint is written,
and then the entrypoint hands the signal back to submitit's handler, which requeues the job; the requeued job
resumes (``train.resume=true``, set automatically in a requeued SLURM job). See docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType, TracebackType

__all__ = [
    "REQUEST_SIGNALS",
    "REQUEUE_SIGNAL",
    "SAME_CTRL_C_SECONDS",
    "STOP_SIGNALS",
    "EvaluationStopped",
    "StopRequest",
    "TrainingInterrupted",
    "abandon_on_stop",
    "get_stop_request",
    "hand_over_requeue_signal",
    "signal_name",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REQUEUE_SIGNAL = signal.SIGUSR2  # submitit's default timeout/preemption signal
REQUEST_SIGNALS = (*STOP_SIGNALS, REQUEUE_SIGNAL)  # every signal a `StopRequest` may record
SAME_CTRL_C_SECONDS = 1.0  # a second SIGINT sooner than this after the first one is not a second Ctrl-C
_ACTIVE: list[StopRequest] = []  # the entered requests of this process, innermost last


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
    """While active (a context manager), the first SIGTERM or SIGINT (or `REQUEUE_SIGNAL` when a handler such as
    submitit's is installed for it) is recorded in `signum` instead of ending the process; a second SIGINT
    raises KeyboardInterrupt (unless it comes within `SAME_CTRL_C_SECONDS` of the first request), a second
    SIGTERM is ignored.

    Signals that the process ignores when it enters (``SIG_IGN``, as spawned ranks ignore SIGINT so that only
    their parent reacts to Ctrl-C) are left alone, and outside the main thread nothing is installed (Python
    delivers signals to the main thread only). The previous handlers are restored on exit.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._requested_at = 0.0  # time.monotonic() of the first request
        self._previous: dict[int, object] = {}
        self._abandon_in_pid: int | None = None  # see `abandon_on_stop`

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self
        _ACTIVE.append(self)
        for signum in REQUEST_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or signum == REQUEUE_SIGNAL and not callable(previous):
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
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum == 0:
            self.signum = signum
            self._requested_at = time.monotonic()
            self._on_first_request(signum)
        elif signum == signal.SIGINT and time.monotonic() - self._requested_at >= SAME_CTRL_C_SECONDS:
            raise KeyboardInterrupt
        if self._abandon_in_pid == os.getpid():
            self._abandon_in_pid = None  # raise once
            raise EvaluationStopped(self.signum)

    def _on_first_request(self, signum: int) -> None:
        """What else to do on the first request (subclasses). Here nothing: this runs between two bytecodes of
        the main thread, and the training loop reports the request when it sees it."""


class EvaluationStopped(BaseException):
    """An evaluation was abandoned because a stop signal arrived (see `abandon_on_stop`).

    A `BaseException`, as `KeyboardInterrupt` is: the signal handler raises it wherever the main thread is, and
    handlers of ``Exception`` on the way (the data set skipping an image that failed to map) must let it through.

    Attributes:
        signum: the signal.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"evaluation abandoned on {signal_name(signum)}")
        self.signum = signum


def get_stop_request() -> StopRequest | None:
    """The innermost active `StopRequest` of this process (the trainer's while training), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def abandon_on_stop() -> Iterator[None]:
    """Inside the block, a stop signal raises `EvaluationStopped` at once (also if one arrived before).

    For work that can be thrown away and redone after resuming, and that would outlast a scheduler's grace
    period (an LVIS evaluation): the block must hold no collective operation, since only this rank leaves it.
    Without an active `StopRequest` (no training) signals keep their usual effect. Forked data-loader workers
    inherit the handler but never raise: only the process that entered the block does.
    """
    request = get_stop_request()
    if request is None:
        yield
        return
    if request.signum:
        raise EvaluationStopped(request.signum)
    request._abandon_in_pid = os.getpid()
    try:
        yield
    finally:
        request._abandon_in_pid = None


def hand_over_requeue_signal(signum: int) -> None:
    """Training stopped on submitit's timeout/preemption signal, its checkpoint written: now let submitit's
    handler (restored by then) requeue the job; it exits the process."""
    if signum == REQUEUE_SIGNAL and callable(signal.getsignal(signum)):
        signal.raise_signal(signum)
