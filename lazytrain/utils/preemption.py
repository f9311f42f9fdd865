"""Stops on a cluster: what every process of a job does with a stop signal, and in which order.

SLURM (and most schedulers) send SIGTERM some time before killing a preempted job, to every process of it; a
user presses Ctrl-C (SIGINT), which the terminal sends to every process of its foreground group; under submitit
(``hydra/launcher=submitit_slurm``) the "time is almost up / preempted" signal is SIGUSR2. A stopped run keeps
its work: the trainer finishes the current step, all ranks agree on the same last iteration
(`lazytrain.engine.step_agreement`), a checkpoint is written, the ``after_train`` hooks run, and
`TrainingInterrupted` ends the run with exit status ``128 + signal`` (143 for SIGTERM, 130 for SIGINT);
``train.resume=true`` continues exactly from there. See docs/reliability.md.

The rules. Each process of a job gets its signals from the scheduler or the terminal, and this module says
what each does with them:

1. The training process (the only one, or each rank) holds a `StopRequest` while it trains: the first SIGTERM
   or SIGINT (or `REQUEUE_SIGNAL`, only when a handler such as submitit's is installed for it) is recorded,
   not acted on. A second SIGINT stops at once (KeyboardInterrupt; checkpoints stay complete, every write is
   atomic) unless it comes within `SAME_CTRL_C_SECONDS` of the first: that is one Ctrl-C delivered twice (the
   terminal signals the group, and a wrapper in it such as ``timeout`` passes its SIGINT on). A second SIGTERM
   is ignored: a spawned rank gets one from SLURM and one from its parent. A signal ignored (``SIG_IGN``) when
   the request is entered stays ignored, and outside the main thread nothing is installed (Python runs
   handlers in the main thread only).
2. The parent of spawned ranks holds a `StopForwarder`: its first request is passed on to every live rank as
   one SIGTERM. A second Ctrl-C raises KeyboardInterrupt in the parent, which terminates the ranks.
3. A spawned rank ignores SIGINT and SIGUSR2 (`prepare_rank_signals`), so that the parent's SIGTERM is its one
   request whatever the terminal or SLURM's ``--signal`` sent to the whole group; SLURM's own SIGTERM to the
   rank is the same request (rule 1).
4. The rank server, from which ranks are forked (`lazytrain.launch.rank_server`), must survive every job
   signal, or the launching process would lose its ranks' exit statuses: it is started with `JOB_SIGNALS`
   blocked (`job_signals_blocked`), so they stay pending in it and never act. A forked rank sets what each
   signal does (rule 3) before it unblocks them, so a signal that reached it meanwhile acts by rule 3, never
   by the default action.
5. A loader worker ignores SIGTERM until its rank begins to exit (`outlive_job_sigterm`): a worker killed by
   the job's SIGTERM would fail its rank mid-step instead of letting it write the stop checkpoint. It inherits
   the rank's other handlers with the fork; they record, but never raise in a worker (`abandon_on_stop`).
6. Exit order: torch's loader shutdown and Python's exit end the workers with SIGTERM and wait for them, so a
   worker must heed SIGTERM once its rank exits. The rank tells them through a flag shared with each worker
   (`share_rank_exit_flag`, called when a worker is forked), set by an exit function registered at the first
   fork: later than torch's and multiprocessing's, which are registered when they are imported, so it runs
   before them (exit functions run last registered first).
7. Who signals whom: the scheduler and the terminal signal every process; the launching process signals its
   ranks (one SIGTERM per stop, `terminate()` on a failure); a rank's loader and exit signal its workers; a
   sweep job whose sweep process is gone signals itself (`lazytrain.launch.parent_watch`). Nobody signals the
   rank server, and ranks never signal their parent or each other: they agree on a stop in the step's
   all-reduce.
8. Under submitit, after the checkpoint the entrypoint hands SIGUSR2 back to submitit's handler
   (`hand_over_requeue_signal`), which requeues the job; the requeued job resumes (``train.resume=true``, set
   automatically in a requeued SLURM job).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any

__all__ = [
    "JOB_SIGNALS",
    "REQUEST_SIGNALS",
    "REQUEUE_SIGNAL",
    "SAME_CTRL_C_SECONDS",
    "STOP_SIGNALS",
    "EvaluationStopped",
    "StopForwarder",
    "StopRequest",
    "TrainingInterrupted",
    "abandon_on_stop",
    "get_stop_request",
    "hand_over_requeue_signal",
    "job_signals_blocked",
    "outlive_job_sigterm",
    "prepare_rank_signals",
    "share_rank_exit_flag",
    "signal_name",
]

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REQUEUE_SIGNAL = signal.SIGUSR2  # submitit's default timeout/preemption signal
REQUEST_SIGNALS = (*STOP_SIGNALS, REQUEUE_SIGNAL)  # every signal a `StopRequest` may record
# Signals a scheduler or a terminal sends to every process of a job or process group.
JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
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


class StopForwarder(StopRequest):
    """In the parent of spawned ranks (rule 2): the first SIGTERM or SIGINT is passed on to every live rank as
    SIGTERM (each finishes its step, they checkpoint together and exit); a second SIGINT raises
    KeyboardInterrupt, on which the caller terminates them.

    Args:
        processes: the ranks (anything with ``pid`` and ``is_alive()``, as multiprocessing's processes).
    """

    def __init__(self, processes: Sequence[Any]) -> None:
        super().__init__()
        self.processes = processes

    def _on_first_request(self, signum: int) -> None:
        logger.warning(
            "Received %s: asking %d rank(s) to finish their step, save a checkpoint and stop%s.",
            signal_name(signum),
            len(self.processes),
            " (Ctrl-C again stops them at once)" if signum == signal.SIGINT else "",
        )
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)


@contextlib.contextmanager
def job_signals_blocked() -> Iterator[None]:
    """Inside the block, `JOB_SIGNALS` are blocked in this thread: a process started inside inherits the mask
    and keeps them pending (the rank server, rule 4)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def prepare_rank_signals() -> None:
    """First thing in a rank spawned by `lazytrain.launch.launch`: SIGINT and SIGUSR2 ignored (rule 3), then
    `JOB_SIGNALS` unblocked, which a rank forked from the rank server inherited blocked (rule 4); one that
    arrived meanwhile takes effect now, by these rules."""
    # Ctrl-C reaches every process of the terminal's group; only the parent reacts and forwards a SIGTERM,
    # so that each rank sees exactly one stop request (and its loader workers, forked later, none).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SLURM's --signal reaches every process of the job (the default action would kill a rank); the parent
    # handles it (under submitit) and forwards a SIGTERM.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)


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


def outlive_job_sigterm(worker_id: int | None = None) -> None:
    """In a forked loader worker (a ``worker_init_fn``; `worker_id` is unused): ignore SIGTERM until the rank
    begins to exit (rules 5 and 6).

    SLURM's preemption (like a SIGTERM to a job's process group) signals every process of the job, the
    workers included. A worker killed by it makes torch raise "DataLoader worker ... is killed by signal:
    Terminated" in its rank, at whatever line the rank is on, so the rank fails instead of finishing its step
    and writing the stop checkpoint. Ignoring SIGTERM for good is no better: torch's loader shutdown and
    Python's exit end a worker that did not stop by itself with SIGTERM, and then wait for it. So once its rank
    has begun to exit, a SIGTERM ends the worker as torch's own handler (replaced here) ends it when the rank
    sends it: exit status 0, which the rank's loader does not report. A rank that dies without exiting is
    noticed by torch's workers themselves within seconds. A worker whose rank did not call
    `share_rank_exit_flag` before forking it keeps torch's handler.
    """
    if _rank_exit is None or _rank_exit[0] != os.getppid():  # its parent shared no exit flag with it
        return
    flag = _rank_exit[1]

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if flag[0]:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


# (pid, flag) of the process whose workers share the flag: a process forked from it (a warm-forked command)
# makes its own, so one exiting does not change what the other's workers do.
_rank_exit: tuple[int, mmap.mmap] | None = None


def share_rank_exit_flag() -> None:
    """In a rank, just before it forks a loader worker: share with the worker a byte set to 1 when this process
    exits, which `outlive_job_sigterm` reads (rule 6).

    Its exit function is registered when the first worker is forked, later than torch's and multiprocessing's
    (which send the workers SIGTERM), so it runs before them: exit functions run last registered first.
    """
    global _rank_exit
    if _rank_exit is None or _rank_exit[0] != os.getpid():
        _rank_exit = (os.getpid(), mmap.mmap(-1, 1))
        atexit.register(_set_rank_exit_flag, *_rank_exit)


def _set_rank_exit_flag(pid: int, flag: mmap.mmap) -> None:
    if os.getpid() == pid:  # a forked child runs its parent's exit functions too
        flag[0] = 1
