"""Loader workers: how their processes start, and how they and the samples they map are seeded.

Random augmentation must be a function of the sample, not of the worker that maps it or of the run's history,
so that a resumed run sees the same augmented images whatever the worker count. Every sample gets a seed from
(seed, global stream position) (`sample_seed`), with which `MapDataset` seeds the global RNGs before mapping;
each worker is seeded at start from (seed, rank, worker id) (`WorkerSeeder`), and torch's own base seed for the
workers comes from a generator of the loader's, never from the global RNG (`make_base_seed_generator`).

Workers are forked on Linux (`worker_context`): they never touch CUDA, and forking spares them re-importing
torch and unpickling the records, and shares the parent's records copy-on-write (`start_workers` keeps the
garbage collector from writing to them). Forked workers also outlive a SIGTERM sent to every process of a job
until their rank exits (`lazytrain.utils.preemption`, which owns what every process does on a stop signal).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from lazytrain.data.common import seed_sample_rngs
from lazytrain.utils.preemption import outlive_job_sigterm, share_rank_exit_flag

__all__ = [
    "WorkerSeeder",
    "cap_num_workers",
    "make_base_seed_generator",
    "sample_seed",
    "start_workers",
    "worker_context",
]

logger = logging.getLogger(__name__)

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
    SIGTERM to the whole job (`lazytrain.utils.preemption.outlive_job_sigterm`).

    Args:
        seed: the loader's seed.
        rank: this process's rank.
    """

    def __init__(self, seed: int, rank: int) -> None:
        self.seed, self.rank = seed, rank

    def __call__(self, worker_id: int) -> None:
        outlive_job_sigterm(worker_id)
        seed_sample_rngs(sample_seed(self.seed ^ 0x5EED, self.rank * 4096 + worker_id))


# (loader, workers asked, CPUs) already logged by `cap_num_workers`: one line per process.
_reported_caps: set[tuple[str, int, int]] = set()


def _available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (cgroups, ``taskset``, SLURM's ``--cpus-per-task``),
    else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cap_num_workers(num_workers: int, component: str) -> int:
    """`num_workers`, at most the CPUs this process may use, with one log line (once per process) when it
    lowers it.

    More worker processes than CPUs only make them take turns (and torch warns about it): a recipe's 4
    workers on a 2-core machine run as 2. Batches do not depend on the worker count (every sample is seeded by
    its stream position), so the cap changes speed only.

    Args:
        num_workers: the loader's ``num_workers`` (>= 0).
        component: the loader, named in the log line (e.g. ``dataloader.train``).
    """
    if num_workers < 0:
        raise ValueError(f"{component}.num_workers must be >= 0; got {num_workers}")
    available = _available_cpus()
    if num_workers <= available:
        return num_workers
    if (component, num_workers, available) in _reported_caps:  # the test loader is built for every evaluation
        return available
    _reported_caps.add((component, num_workers, available))
    logger.info(
        "%s.num_workers=%d but this process may use %d CPUs: starting %d workers (set %s.num_workers to "
        "choose fewer).",
        component,
        num_workers,
        available,
        available,
        component,
    )
    return available


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
    that share their rank's exit flag (`lazytrain.utils.preemption.share_rank_exit_flag`)."""

    def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.context.ForkProcess:  # noqa: N802 (torch's name)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        share_rank_exit_flag()
        return multiprocessing.context.ForkProcess(*args, **kwargs)


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
