"""Joining a job's process group: a rank's GPU, where the ranks meet (the rendezvous), and running the rank's
function inside the group with the rank watch on, the group torn down after it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lazytrain.launch.environment import RankInfo, get_attempt_prefix

__all__ = ["find_shared_gpus", "get_gpu_index", "get_rendezvous_url", "get_tcp_url", "run_in_group"]


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


def get_tcp_url(host: str, port: str) -> str:
    """``tcp://host:port``, with an IPv6 address in brackets as URLs write it."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def get_rendezvous_url(env_info: RankInfo) -> str:
    """Where the ranks of a launched job meet, as an ``init_process_group`` init method.

    torchrun: ``env://``, the store its agent serves at the MASTER_ADDR and MASTER_PORT it exported (torch
    joins that store instead of starting one when an address equals those variables, so they are used as they
    are). SLURM and submitit: ``tcp://`` at the address `get_env_rank_info` read or derived, so that nothing
    writes it into the environment for ``env://`` to read back.
    """
    if env_info["launcher"] == "torchrun":
        return "env://"
    return get_tcp_url(env_info["master_addr"], env_info["master_port"])


def run_in_group(
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
