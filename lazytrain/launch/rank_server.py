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
- stop signals: the scheduler and the terminal signal every process of a job. The server must survive them,
  or the launching process would lose its ranks' exit statuses, which the server reports: it is started with
  them blocked, and a forked rank sets what they do before it unblocks them (`lazytrain.utils.preemption`,
  rule 4: `job_signals_blocked`, `prepare_rank_signals`);
- a rank's parent process is the server, whose parent is the launching process;
- a rank writes to the stdout and stderr that the launching process had when it started the server.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Mapping
from multiprocessing import forkserver, resource_tracker

from lazytrain.utils.preemption import job_signals_blocked

__all__ = ["RANK_START_METHOD", "enter_rank", "get_rank_context", "start_rank_server"]

RANK_START_METHOD = "forkserver"


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
    with job_signals_blocked():
        forkserver.ensure_running()


def enter_rank(environment: Mapping[str, str]) -> None:
    """In a rank forked from the server, after `lazytrain.utils.preemption.prepare_rank_signals`: the
    environment of the launching process's job."""
    os.environ.clear()
    os.environ.update(environment)
