"""Where the ranks `launch` starts on this machine come from: one process that imported torch and the rank's
program once, and forks a rank when asked (multiprocessing's forkserver).

A spawned rank is a new interpreter that imports torch, torchvision and lazytrain before it does anything, so
each rank of each job pays seconds of CPU at start. A rank forked from the server has them already. It is
still a new process as with "spawn": the server only imported modules, so a rank inherits no CUDA context, no
process group and no thread of a trainer. The server lives as long as the launching process, so the jobs of a
sweep run one after another in that process (Hydra's basic launcher) share it.

What differs from a spawned rank, and how `launch` keeps it the same:
- the server's environment is that of the launching process when it started the server (the first job of a
  sweep): each rank takes the launching process's environment of its own job (`enter_rank`);
- stop signals: the scheduler and the terminal signal every process of a job (SLURM's preemption SIGTERM, its
  ``--signal`` SIGUSR2, Ctrl-C's SIGINT). The server must survive them, or the launching process would lose
  its ranks' exit statuses, which the server reports. It is started with those signals blocked, so they stay
  pending in it and never act; a forked rank unblocks them first thing (`enter_rank`), and a signal that
  reached the rank meanwhile then takes effect;
- a rank's parent process is the server, whose parent is the launching process;
- a rank writes to the stdout and stderr that the launching process had when it started the server.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterable, Mapping
from multiprocessing import forkserver, resource_tracker

__all__ = ["RANK_START_METHOD", "enter_rank", "get_rank_context", "start_rank_server"]

RANK_START_METHOD = "forkserver"
# Signals a scheduler or a terminal sends to every process of a job or process group.
_JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def get_rank_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context ranks are started in (for values shared with them)."""
    return multiprocessing.get_context(RANK_START_METHOD)


def start_rank_server(modules: Iterable[str]) -> None:
    """Start this process's rank server, which imports torch and `modules` (e.g. the rank function's module)
    before it forks any rank. Once it runs (a later job of a sweep), nothing changes."""
    forkserver.set_forkserver_preload(["torch", *modules])
    # Started first because starting it unblocks SIGINT and SIGTERM in this thread.
    resource_tracker.ensure_running()
    # The server inherits the signal mask of the thread that starts it, across its exec.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _JOB_SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def enter_rank(environment: Mapping[str, str]) -> None:
    """First thing in a rank forked from the server: the environment of the launching process's job, and the
    job signals unblocked (a rank sets what each one does before calling this)."""
    os.environ.clear()
    os.environ.update(environment)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _JOB_SIGNALS)
