"""Loader workers: how their processes start, and how they and the samples they map are seeded.

Random augmentation must be a function of the sample, not of the worker that maps it or of the run's history,
so that a resumed run sees the same augmented images whatever the worker count. Every sample gets a seed from
(seed, global stream position) (`sample_seed`), with which `MapDataset` seeds the global RNGs before mapping;
each worker is seeded at start from (seed, rank, worker id) (`WorkerSeeder`), and torch's own base seed for the
workers comes from a generator of the loader's, never from the global RNG (`make_base_seed_generator`).

Workers are forked on Linux (`worker_context`): they never touch CUDA, and forking spares them re-importing
torch and unpickling the records, and shares the parent's records copy-on-write (`start_workers` keeps the
garbage collector from writing to them). Forked workers also outlive a SIGTERM sent to every process of a job
until their rank exits (`outlive_job_sigterm`).
"""

from __future__ import annotations

import atexit
import gc
import mmap
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from lazytrain.data.common import seed_sample_rngs

__all__ = [
    "WorkerSeeder",
    "make_base_seed_generator",
    "outlive_job_sigterm",
    "sample_seed",
    "start_workers",
    "worker_context",
]

_MASK64 = 2**64 - 1


def _mix64(value: int) -> int:
    """splitmix64 finalizer: nearby inputs give unrelated outputs."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def sample_seed(seed: int, global_position: int) -> int:
    """The augmentation seed (in [0, 2**63)) of the sample at `global_position` of a run seeded with `seed`.

    It depends on the global stream position only, so it does not change with the world size or the number of
    workers.
    """
    return _mix64((_mix64(seed & _MASK64) + global_position) & _MASK64) >> 1


class WorkerSeeder:
    """Picklable ``worker_init_fn``: seed a worker's RNGs from (seed, rank, worker id); the worker outlives a
    SIGTERM to the whole job (`outlive_job_sigterm`).

    Args:
        seed: the loader's seed.
        rank: this process's rank.
    """

    def __init__(self, seed: int, rank: int) -> None:
        self.seed, self.rank = seed, rank

    def __call__(self, worker_id: int) -> None:
        outlive_job_sigterm(worker_id)
        seed_sample_rngs(sample_seed(self.seed ^ 0x5EED, self.rank * 4096 + worker_id))


def make_base_seed_generator(seed: int) -> torch.Generator:
    """The generator a train loader gives torch's DataLoader, from which it draws its workers' base seed.

    Without one, the DataLoader draws that seed from the global torch RNG when iterating starts: at iteration 0
    in a fresh run but right after the restored RNG state in a resumed one, which would then draw other random
    numbers in the model than the run it continues. Workers reseed per sample anyway (`WorkerSeeder`,
    `MapDataset`), so the base seed only has to be fixed.
    """
    return torch.Generator().manual_seed(seed & _MASK64)


def worker_context() -> multiprocessing.context.BaseContext | None:
    """The start method of data-loader workers: fork on Linux, the platform default elsewhere.

    `lazytrain.launch.launch` makes "spawn" the global start method (per-rank processes must not inherit CUDA
    or gloo state), and torch's DataLoader follows the global method. Spawned workers re-import torch and
    unpickle the dataset before the first batch of every loader (each evaluation included), and do not share the
    serialized records copy-on-write. Workers never touch CUDA, so forking them is safe.
    """
    return _LoaderWorkerContext() if sys.platform.startswith("linux") else None


class _LoaderWorkerContext(multiprocessing.context.ForkContext):
    """Fork, after flushing the parent's stdout/stderr (a forked worker inherits their buffers and flushes
    them when it exits, which repeats earlier output in a log redirected to a file, as under SLURM), workers
    that share `_rank_exit_flag` with their rank."""

    def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.context.ForkProcess:  # noqa: N802 (torch's name)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        _rank_exit_flag()
        return multiprocessing.context.ForkProcess(*args, **kwargs)


def outlive_job_sigterm(worker_id: int | None = None) -> None:
    """In a forked loader worker (a ``worker_init_fn``; `worker_id` is unused): ignore SIGTERM until the rank
    begins to exit.

    SLURM's preemption (like a SIGTERM to a job's process group) signals every process of the job, the
    workers included. A worker killed by it makes torch raise "DataLoader worker ... is killed by signal:
    Terminated" in its rank, at whatever line the rank is on, so the rank fails instead of finishing its step
    and writing the stop checkpoint (`lazytrain.utils.preemption`). Ignoring SIGTERM for good is no better:
    torch's loader shutdown and Python's exit end a worker that did not stop by itself with SIGTERM, and then
    wait for it. So once its rank has begun to exit, a SIGTERM ends the worker as torch's own handler (replaced
    here) ends it when the rank sends it: exit status 0, which the rank's loader does not report. A rank that
    dies without exiting is noticed by torch's workers themselves within seconds.
    """
    if _rank_exit is None or _rank_exit[0] != os.getppid():  # not forked by `worker_context()`
        return
    flag = _rank_exit[1]

    def on_sigterm(signum: int, frame: Any) -> None:
        if flag[0]:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


# (pid, flag) of the process whose workers share the flag: a process forked from it (a warm-forked command)
# makes its own, so one exiting does not change what the other's workers do.
_rank_exit: tuple[int, mmap.mmap] | None = None


def _rank_exit_flag() -> mmap.mmap:
    """A byte shared with the workers forked after this call, set to 1 when this process exits.

    Its exit function is registered when the first worker is forked, later than torch's and multiprocessing's
    (which send the workers SIGTERM), so it runs before them: exit functions run last registered first.
    """
    global _rank_exit
    if _rank_exit is None or _rank_exit[0] != os.getpid():
        _rank_exit = (os.getpid(), mmap.mmap(-1, 1))
        atexit.register(_set_rank_exit_flag, *_rank_exit)
    return _rank_exit[1]


def _set_rank_exit_flag(pid: int, flag: mmap.mmap) -> None:
    if os.getpid() == pid:  # a forked child runs its parent's exit functions too
        flag[0] = 1


def start_workers(data_loader: DataLoader) -> Iterator[Any]:
    """``iter(data_loader)``, which forks its worker processes, without their garbage collectors copying the
    parent's memory.

    Forked workers inherit the parent's objects; a garbage collection in a worker would write to every tracked
    object (the records list of the config, say) and copy its pages. Frozen objects are skipped by the workers'
    collector; the parent unfreezes right after the fork.
    """
    if data_loader.num_workers == 0:
        return iter(data_loader)
    gc.freeze()
    try:
        return iter(data_loader)
    finally:
        gc.unfreeze()
