"""`launch`: run a function in one process per GPU (or CPU worker), on one or several machines.

World size 1 runs in-process. Otherwise processes are spawned with torch.multiprocessing (NCCL + one GPU
each, or gloo on CPU). Under torchrun or a SLURM/submitit multi-task job this process is one rank (no spawn),
placed by what `lazytrain.launch.environment` reads from the environment. A rank that raises stops the others
and the error, naming the rank, is re-raised in the parent: never a silent hang.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lazytrain.launch.environment import (
    RankInfo,
    get_attempt_prefix,
    get_env_rank_info,
    get_slurm_cpus_per_task,
)
from lazytrain.launch.rank_watch import is_peer_failure
from lazytrain.utils.preemption import StopRequest, TrainingInterrupted, signal_name

__all__ = [
    "RankFailedError",
    "find_free_port",
    "find_shared_gpus",
    "get_cpu_threads",
    "get_gpu_index",
    "is_rank_from_environment",
    "launch",
    "parse_timeout",
]

logger = logging.getLogger(__name__)
# How long a collective waits for a peer. The longest legitimate wait is the other ranks waiting while the main
# process evaluates alone: a full LVIS val evaluation measured 6 min on 2 CPU cores, 11 min under load, plus the
# wait for the slowest rank's inference (docs/benchmarks.md); the default leaves a wide margin over torch's 30 min; a rank that failed or died stops the others at once anyway (`RankWatch`).
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


def get_gpu_index(local_rank: int, local_size: int, visible: int) -> int:
    """The CUDA device of the process with `local_rank` of the `local_size` processes on its node.

    A process that sees every GPU of its node takes ``cuda:{local_rank}``; one bound to a single GPU
    (``srun --gpus-per-task=1``, ``--gpu-bind``, CUDA_VISIBLE_DEVICES set per process) takes ``cuda:0``.

    Raises:
        ValueError: when neither holds (no GPU, or fewer GPUs than processes but more than one).
    """
    if visible >= local_size > local_rank:
        return local_rank
    if visible == 1:
        return 0
    raise ValueError(
        f"launch: local rank {local_rank} of {local_size} process(es) on this node sees {visible} GPU(s) "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): one GPU per process is "
        "needed. Give every process all GPUs of its node (srun --gpus-per-node=N) or exactly one "
        "(srun --gpus-per-task=1), or start one task per node and let lazytrain spawn one process per GPU."
    )


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


def _init_process_group(
    backend: str, init_method: str, world_size: int, rank: int, timeout: timedelta
) -> None:
    """`torch.distributed.init_process_group`; under torchrun with this attempt's keys under their own prefix
    (`get_attempt_prefix`), so that a restarted worker group does not meet the failed one's keys."""
    import torch.distributed as dist

    prefix = get_attempt_prefix() if init_method == "env://" else ""
    if not prefix:
        dist.init_process_group(
            backend=backend, init_method=init_method, world_size=world_size, rank=rank, timeout=timeout
        )
        return
    host, port = _store_address(init_method)
    client = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    store = dist.PrefixStore(prefix, client)
    dist.init_process_group(backend=backend, store=store, world_size=world_size, rank=rank, timeout=timeout)


def _store_address(init_method: str) -> tuple[str, int]:
    """Host and port of the job's TCP store: ``tcp://host:port``, or MASTER_ADDR/MASTER_PORT for ``env://``."""
    if init_method.startswith("tcp://"):
        host, port = init_method[len("tcp://") :].rsplit(":", 1)
        return host.strip("[]"), int(port)
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def _tcp_url(host: str, port: str) -> str:
    """``tcp://host:port``, with an IPv6 address in brackets as URLs write it."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _get_rendezvous_url(env_info: RankInfo) -> str:
    """Where the ranks of a launched job meet, as an ``init_process_group`` init method.

    torchrun: ``env://``, the store its agent serves at the MASTER_ADDR and MASTER_PORT it exported (torch
    joins that store instead of starting one when an address equals those variables, so they are used as they
    are). SLURM and submitit: ``tcp://`` at the address `get_env_rank_info` read or derived, so that nothing
    writes it into the environment for ``env://`` to read back.
    """
    if env_info["launcher"] == "torchrun":
        return "env://"
    return _tcp_url(env_info["master_addr"], env_info["master_port"])


def _run_in_group(
    main_func: Callable,
    args: tuple,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_size: int,
    node_rank: int,
    init_method: str,
    backend: str,
    timeout: timedelta,
    cpu_threads: int,
) -> Any:
    import torch
    import torch.distributed as dist

    from lazytrain.launch.rank_watch import RankWatch
    from lazytrain.utils import comm

    torch.set_num_threads(cpu_threads)
    if backend == "nccl":
        torch.cuda.set_device(get_gpu_index(local_rank, local_size, torch.cuda.device_count()))
    _init_process_group(backend, init_method, world_size, rank, timeout)
    try:
        comm.create_local_process_group(node_rank, timeout=timeout)
        if backend == "nccl":
            _check_distinct_gpus()
        comm.synchronize()
        with RankWatch(*_store_address(init_method), rank, world_size):
            return main_func(*args)
    except Exception as e:
        if "timed out" in str(e).lower() or "timeout" in type(e).__name__.lower():
            raise RuntimeError(
                f"rank {rank}: a collective waited longer than launch.timeout ({timeout}) for the other ranks: "
                f"{str(e).strip().splitlines()[0]}. If one rank legitimately works alone that long (the main "
                "process's final evaluation on a large data set), raise launch.timeout (e.g. launch.timeout=8h)."
            ) from e
        raise
    finally:
        # Multirun jobs run back to back in one process: leave no group behind for the next job.
        if dist.is_initialized():
            dist.destroy_process_group()
        comm.reset_process_groups()


def _check_distinct_gpus() -> None:
    """Two ranks on one GPU would fail deep inside NCCL ("Duplicate GPU detected"): say which, and why."""
    import torch

    from lazytrain.utils import comm

    device = torch.cuda.current_device()
    identity = (socket.gethostname(), str(torch.cuda.get_device_properties(device).uuid))
    message = find_shared_gpus(comm.all_gather(identity))
    if message:
        raise ValueError(message)


def find_shared_gpus(identities: list[tuple[str, str]]) -> str | None:
    """A message naming the ranks that share a GPU, given every rank's (host, GPU uuid); None if none do."""
    ranks_of: dict[tuple[str, str], list[int]] = {}
    for rank, identity in enumerate(identities):
        ranks_of.setdefault(identity, []).append(rank)
    shared = [(identity, ranks) for identity, ranks in ranks_of.items() if len(ranks) > 1]
    if not shared:
        return None
    (host, uuid), ranks = shared[0]
    return (
        f"launch: ranks {', '.join(map(str, ranks))} all use GPU {uuid} on {host}: each process needs its own "
        "GPU. Give every task all GPUs of its node (srun --gpus-per-node=N) or one GPU each "
        "(srun --gpus-per-task=1), and start as many tasks per node as it has GPUs."
    )


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
) -> None:
    # Ctrl-C reaches every process of the terminal's group; only the parent reacts and forwards a SIGTERM,
    # so that each rank sees exactly one stop request (and its data-loader workers, forked later, none).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SLURM's --signal reaches every process of the job (the default action would kill a rank); the parent
    # handles it (under submitit) and forwards a SIGTERM.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    rank = machine_rank * num_per_machine + local_rank
    os.environ.update(LOCAL_RANK=str(local_rank), RANK=str(rank), LOCAL_WORLD_SIZE=str(num_per_machine))
    try:
        result = _run_in_group(
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
    return _run_in_group(
        main_func,
        args,
        **env_info_for_group(env_info),
        init_method=_get_rendezvous_url(env_info),
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
    dist_url = _tcp_url(env_info["master_addr"], env_info["master_port"])
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
    """The keys of `get_env_rank_info` that `_run_in_group` takes."""
    return {key: env_info[key] for key in ("rank", "world_size", "local_rank", "local_size", "node_rank")}


def _spawn(main_func, args, num_per_machine, world_size, machine_rank, dist_url, backend, timeout) -> Any:
    """Spawn this machine's ranks, watch them, and return local rank 0's result."""
    import multiprocessing
    import tempfile

    multiprocessing.set_start_method("spawn", force=True)
    import torch.multiprocessing as mp

    stopped_by_signal = multiprocessing.get_context("spawn").Value("i", 0)
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
    )
    context = mp.start_processes(
        _spawned_worker, args=worker_args, nprocs=num_per_machine, start_method="spawn", join=False
    )
    forwarder = _ForwardStopSignals(context.processes)
    try:
        _wait_for_ranks(context, forwarder, machine_rank, num_per_machine)
    finally:
        result = _load_result(result_path)
    if stopped_by_signal.value:
        # Ctrl-C in the parent reached the ranks as SIGTERM; report (and exit with) what the user sent.
        raise _all_ranks_interrupted(forwarder.signum or stopped_by_signal.value, world_size)
    return result


def _wait_for_ranks(
    context: Any, forwarder: _ForwardStopSignals, machine_rank: int, num_per_machine: int
) -> None:
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


class _ForwardStopSignals(StopRequest):
    """In the parent of spawned ranks: the first SIGTERM or SIGINT is passed on to every rank as SIGTERM
    (each finishes its step, they checkpoint together and exit); a second SIGINT raises KeyboardInterrupt,
    which terminates them."""

    def __init__(self, processes: list) -> None:
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


def _terminate(processes: list, grace_seconds: float = 5.0) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
