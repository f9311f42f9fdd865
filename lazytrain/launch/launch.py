"""`launch`: run a function in one process per GPU (or CPU worker), on one or several machines.

World size 1 runs in-process. Otherwise this machine's ranks are started with torch.multiprocessing, forked
from a process that imported torch once (`lazytrain.launch.rank_server`): NCCL and one GPU each, or gloo on
CPU. Under torchrun or a SLURM/submitit multi-task job this process is one rank (nothing is started), placed
by what `lazytrain.launch.environment` reads from the environment. A rank that raises stops the others and
the error, naming the rank, is re-raised in the parent: never a silent hang.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lazytrain.launch.environment import RankInfo, get_env_rank_info, get_slurm_cpus_per_task
from lazytrain.launch.process_group import get_rendezvous_url, get_tcp_url, run_in_group
from lazytrain.launch.rank_server import RANK_START_METHOD, enter_rank, get_rank_context, start_rank_server
from lazytrain.launch.rank_watch import is_peer_failure
from lazytrain.utils.preemption import StopForwarder, TrainingInterrupted, prepare_rank_signals, signal_name

__all__ = [
    "RankFailedError",
    "find_free_port",
    "get_cpu_threads",
    "is_rank_from_environment",
    "launch",
    "parse_timeout",
]

logger = logging.getLogger(__name__)
# How long a collective waits for a peer. The longest legitimate wait is the other ranks waiting while the main
# process evaluates alone (LVIS val: minutes on a slow machine, docs/benchmarks.md) plus the slowest rank's
# inference, so the default is far above torch's 30 minutes; a rank that failed or died stops the others at once
# anyway (`RankWatch`).
DEFAULT_TIMEOUT = timedelta(hours=4)
_TIMEOUT_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_timeout(value: int | float | str) -> timedelta:
    """``launch.timeout``: a number of minutes, or a string with a unit: ``"90s"``, ``"30m"``, ``"4h"``."""
    text = str(value).strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", text)
    if isinstance(value, bool) or match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"launch.timeout={value!r}: expected a positive number of minutes or a duration such as '90s', "
            "'30m', '4h'."
        )
    return timedelta(seconds=float(match.group(1)) * _TIMEOUT_UNITS[match.group(2) or "m"])


class RankFailedError(RuntimeError):
    """A spawned rank raised or died; the message names the rank and holds its traceback."""


def find_free_port() -> int:
    """A free TCP port on localhost (chosen per job so concurrent jobs never collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port_free(dist_url: str) -> None:
    if not dist_url.startswith("tcp://"):
        return
    host, port = dist_url[len("tcp://") :].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("" if host in ("127.0.0.1", "localhost", "0.0.0.0") else host, int(port)))
        except OSError as e:
            raise ValueError(
                f"launch.dist_url={dist_url}: port {port} is already in use ({e.strerror}). Choose another port or "
                "use launch.dist_url=auto (single machine)."
            ) from None


def _choose_backend(backend: str, use_gpu: bool | None) -> str:
    """The process-group backend: nccl for one GPU per process, gloo on CPU."""
    if backend != "auto":
        return backend
    if use_gpu is None:
        import torch

        use_gpu = torch.cuda.is_available()
    return "nccl" if use_gpu else "gloo"


def get_cpu_threads(processes_sharing: int, cpus_per_process: int | None = None) -> int:
    """Intra-op CPU threads for one rank: ``OMP_NUM_THREADS`` when set (torchrun sets it); else the CPUs this
    process may run on (its affinity mask, which follows cgroup cpusets, taskset and SLURM's binding, unlike
    ``os.cpu_count()``) divided among the `processes_sharing` ranks that share them, at most
    `cpus_per_process` (SLURM's ``--cpus-per-task``)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = available // max(1, processes_sharing)
    return max(1, min(threads, cpus_per_process) if cpus_per_process else threads)


def _spawned_worker(
    local_rank: int,
    main_func,
    args,
    world_size,
    num_per_machine,
    machine_rank,
    dist_url,
    backend,
    timeout,
    stopped_by_signal,
    result_path: str,
    cpu_threads: int,
    environment: dict[str, str],
) -> None:
    prepare_rank_signals()
    enter_rank(environment)
    rank = machine_rank * num_per_machine + local_rank
    os.environ.update(LOCAL_RANK=str(local_rank), RANK=str(rank), LOCAL_WORLD_SIZE=str(num_per_machine))
    try:
        result = run_in_group(
            main_func,
            args,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_size=num_per_machine,
            node_rank=machine_rank,
            init_method=dist_url,
            backend=backend,
            timeout=timeout,
            cpu_threads=cpu_threads,
        )
        if local_rank == 0:
            _save_result(result, result_path)
    except TrainingInterrupted as e:
        # A clean stop (checkpoint written): exit 0, so the parent does not stop the other ranks while they
        # finish theirs; the parent raises TrainingInterrupted itself.
        stopped_by_signal.value = e.signum
    except Exception as e:
        # A rank that fails only because a peer died (its collective broke) waits a moment, so that the parent
        # reports the rank that failed first, with its own traceback.
        if is_peer_failure(e):
            time.sleep(5)
        raise


def _save_result(result: Any, path: str) -> None:
    """Local rank 0's return value, for the parent (a file: a pipe could block on a large value)."""
    import pickle

    try:
        data = pickle.dumps(result)
    except Exception as e:
        logger.warning("launch: the return value of local rank 0 cannot be pickled (%s); returning None.", e)
        return
    with open(path, "wb") as f:
        f.write(data)


def _load_result(path: str) -> Any:
    """What `_save_result` wrote (None if nothing), and remove the file."""
    import pickle

    try:
        with open(path, "rb") as f:
            data = f.read()
        os.remove(path)
        return pickle.loads(data) if data else None
    except Exception as e:
        logger.warning("launch: cannot read the return value of local rank 0 from %s: %s", path, e)
        return None


def launch(
    main_func: Callable,
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: tuple = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
    backend: str = "auto",
    *,
    use_gpu: bool | None = None,
) -> Any:
    """Run ``main_func(*args)`` in every process of the job.

    Where the processes come from:
    - no launcher in the environment: `num_gpus_per_machine` processes are spawned on this machine (world
      size 1 runs in this process);
    - torchrun, or SLURM/submitit with several tasks per node: this process is one rank (nothing is spawned);
      its GPU is ``cuda:{local rank}`` when it sees all GPUs of its node, ``cuda:0`` when bound to one;
    - SLURM/submitit with one task per node and `num_gpus_per_machine` > 1: each task spawns its processes,
      and the job has ``nodes x num_gpus_per_machine`` ranks (rendezvous at MASTER_ADDR:MASTER_PORT).

    Args:
        main_func: a module-level (picklable) function.
        num_gpus_per_machine: processes per machine (GPUs, or CPU workers when `use_gpu` is False).
        num_machines: machines in the job (without a launcher in the environment).
        machine_rank: this machine's index (without a launcher in the environment).
        dist_url: ``tcp://host:port`` of machine 0, or "auto" (a free local port; one machine only).
        args: arguments of `main_func` (picklable).
        timeout: how long a collective waits for a peer (``launch.timeout``): longer than the longest
            time one rank works alone, such as the main process's final evaluation.
        backend: "auto" (nccl with one GPU per process when `use_gpu`, else gloo), or an explicit backend.
        use_gpu: one GPU per process; None: whether CUDA is available.

    Returns:
        `main_func`'s return value in this process (world size 1, torchrun/SLURM), or that of the machine's
        local rank 0 after a spawn.
    """
    backend = _choose_backend(backend, use_gpu)
    env_info = get_env_rank_info()
    if is_rank_from_environment(env_info, num_gpus_per_machine):
        return _run_as_launched_rank(main_func, args, env_info, backend, timeout)
    if env_info is not None:
        num_machines, machine_rank, dist_url = _spawn_from_task_per_node(env_info, num_gpus_per_machine)
    world_size = num_machines * num_gpus_per_machine
    if world_size <= 1:
        return main_func(*args)
    dist_url = _resolve_dist_url(dist_url, num_machines, machine_rank)
    return _spawn(main_func, args, num_gpus_per_machine, world_size, machine_rank, dist_url, backend, timeout)


def _run_as_launched_rank(
    main_func: Callable, args: tuple, env_info: RankInfo, backend: str, timeout: timedelta
) -> Any:
    """This process is one rank of a job a launcher started (torchrun, several SLURM tasks per node)."""
    logger.info("Process group from the environment: %s", env_info)
    # A SLURM task's own CPUs (--cpus-per-task) are its share; torchrun's processes share the node's.
    slurm_cpus = get_slurm_cpus_per_task()
    return run_in_group(
        main_func,
        args,
        **env_info_for_group(env_info),
        init_method=get_rendezvous_url(env_info),
        backend=backend,
        timeout=timeout,
        cpu_threads=get_cpu_threads(1, slurm_cpus)
        if slurm_cpus is not None
        else get_cpu_threads(env_info["local_size"]),
    )


def _spawn_from_task_per_node(env_info: RankInfo, num_gpus_per_machine: int) -> tuple[int, int, str]:
    """Machines, this machine's rank and the rendezvous URL when each node's single task spawns its ranks."""
    # One task per node (srun --ntasks-per-node=1, submitit tasks_per_node=1): it spawns this node's ranks.
    num_machines, machine_rank = env_info["num_nodes"], env_info["node_rank"]
    dist_url = get_tcp_url(env_info["master_addr"], env_info["master_port"])
    logger.info(
        "One task per node: spawning %d processes on node %d of %d",
        num_gpus_per_machine,
        machine_rank,
        num_machines,
    )
    return num_machines, machine_rank, dist_url


def _resolve_dist_url(dist_url: str | None, num_machines: int, machine_rank: int) -> str:
    """`dist_url`, with "auto" (or None) replaced by a free local port; machine 0 checks its port is free."""
    if dist_url in (None, "auto"):
        if num_machines > 1:
            raise ValueError(
                "launch: dist_url='auto' works on one machine only; give launch.dist_url=tcp://HOST:PORT of machine 0"
            )
        return f"tcp://127.0.0.1:{find_free_port()}"
    if machine_rank == 0:
        _check_port_free(dist_url)
    return dist_url


def is_rank_from_environment(env_info: RankInfo | None, num_per_machine: int) -> bool:
    """Whether this process is one rank started by a launcher (torchrun, several SLURM tasks per node), as
    opposed to a process that spawns the ranks of its machine (no launcher, or one task per node asking for
    several processes)."""
    return env_info is not None and not (env_info["local_size"] == 1 and num_per_machine > 1)


def env_info_for_group(env_info: RankInfo) -> dict[str, int]:
    """The keys of `get_env_rank_info` that `run_in_group` takes."""
    return {key: env_info[key] for key in ("rank", "world_size", "local_rank", "local_size", "node_rank")}


def _spawn(main_func, args, num_per_machine, world_size, machine_rank, dist_url, backend, timeout) -> Any:
    """Start this machine's ranks (forked from the rank server), watch them, and return local rank 0's
    result."""
    import multiprocessing
    import tempfile

    # What else this process or a rank starts without naming a method (e.g. a sweep's job processes) must not
    # inherit CUDA or process-group state either.
    multiprocessing.set_start_method("spawn", force=True)
    import torch.multiprocessing as mp

    start_rank_server([main_func.__module__])
    stopped_by_signal = get_rank_context().Value("i", 0)
    handle, result_path = tempfile.mkstemp(prefix="lazytrain_result_", suffix=".pkl")
    os.close(handle)
    worker_args = (
        main_func,
        args,
        world_size,
        num_per_machine,
        machine_rank,
        dist_url,
        backend,
        timeout,
        stopped_by_signal,
        result_path,
        get_cpu_threads(num_per_machine),
        dict(os.environ),
    )
    context = mp.start_processes(
        _spawned_worker, args=worker_args, nprocs=num_per_machine, start_method=RANK_START_METHOD, join=False
    )
    forwarder = StopForwarder(context.processes)
    try:
        _wait_for_ranks(context, forwarder, machine_rank, num_per_machine)
    finally:
        result = _load_result(result_path)
    if stopped_by_signal.value:
        # Ctrl-C in the parent reached the ranks as SIGTERM; report (and exit with) what the user sent.
        raise _all_ranks_interrupted(forwarder.signum or stopped_by_signal.value, world_size)
    return result


def _wait_for_ranks(context: Any, forwarder: StopForwarder, machine_rank: int, num_per_machine: int) -> None:
    """Join the spawned ranks while `forwarder` passes stop signals on; a rank that raises or dies becomes a
    `RankFailedError` naming it (the others are terminated)."""
    import torch.multiprocessing as mp

    try:
        with forwarder:
            # join() with a timeout returns regularly, so a failed rank is noticed within a second; on
            # failure it terminates the other ranks (which would otherwise wait in a collective until
            # `timeout`).
            while not context.join(timeout=1.0):
                pass
    except mp.ProcessRaisedException as e:
        rank = machine_rank * num_per_machine + e.error_index
        raise RankFailedError(
            f"rank {rank} (process {e.error_index} on machine {machine_rank}) failed:\n{e}"
        ) from None
    except mp.ProcessExitedException as e:
        rank = machine_rank * num_per_machine + e.error_index
        raise RankFailedError(
            f"rank {rank} (process {e.error_index} on machine {machine_rank}) exited with code {e.exit_code}"
        ) from None
    except BaseException:
        _terminate(context.processes)  # e.g. a second Ctrl-C in the parent: leave no orphan rank behind
        raise


def _all_ranks_interrupted(signum: int, world_size: int) -> TrainingInterrupted:
    return TrainingInterrupted(
        signum,
        f"Training stopped by {signal_name(signum)}: all {world_size} ranks saved a checkpoint and stopped at "
        "the same iteration; run the same command with train.resume=true to continue.",
    )


def _terminate(processes: list, grace_seconds: float = 5.0) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
