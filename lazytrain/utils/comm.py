"""Process-group helpers: rank, world size, barriers, gathering and reducing across processes.

Every function works with and without an initialised `torch.distributed` process group (a single process
behaves as rank 0 of a world of size 1), so library code can call them unconditionally.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "all_gather",
    "broadcast_object",
    "create_local_process_group",
    "gather",
    "gather_in_turn",
    "get_local_process_group",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "is_main_process",
    "max_over_ranks",
    "reduce_dict",
    "reset_process_groups",
    "shared_random_seed",
    "unwrap_model",
    "synchronize",
]

_LOCAL_PROCESS_GROUP = None
_GLOO_GROUP = None
_GROUP_TIMEOUT: timedelta | None = None


def is_initialized() -> bool:
    """Whether a torch.distributed process group is up."""
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """Number of processes in the job (1 without a process group)."""
    return dist.get_world_size() if is_initialized() else 1


def get_rank() -> int:
    """Global rank of this process (0 without a process group)."""
    return dist.get_rank() if is_initialized() else 0


def create_local_process_group(node: int | str, *, timeout: timedelta | None = None) -> None:
    """Create the group of the processes on this machine, and the CPU group for Python objects (`launch`
    does it for you).

    Collective: every rank must call it. Ranks are grouped by the `node` each one gives, so any placement
    works (SLURM's block or cyclic distribution, uneven tasks per node).

    Args:
        node: this machine's id (the same for all ranks on one machine): e.g. SLURM_NODEID, torchrun's
            GROUP_RANK or launch's machine rank.
        timeout: how long collectives of these groups wait for a peer (None: torch's default, 30 minutes).
    """
    global _LOCAL_PROCESS_GROUP, _GROUP_TIMEOUT
    _GROUP_TIMEOUT = timeout
    nodes = all_gather(node)
    for machine in sorted(set(nodes), key=nodes.index):
        ranks = [rank for rank, other in enumerate(nodes) if other == machine]
        group = dist.new_group(ranks, timeout=timeout)
        if machine == node:
            _LOCAL_PROCESS_GROUP = group


def get_local_process_group() -> dist.ProcessGroup | None:
    """The group of processes on this machine (None when not created or no process group is up)."""
    return _LOCAL_PROCESS_GROUP if is_initialized() else None


def reset_process_groups() -> None:
    """Forget the groups created here; call it after `torch.distributed.destroy_process_group()`.

    Multirun jobs bring a process group up and down in one process; a group kept from a previous job would
    point at a destroyed backend.
    """
    global _LOCAL_PROCESS_GROUP, _GLOO_GROUP, _GROUP_TIMEOUT
    _LOCAL_PROCESS_GROUP = None
    _GLOO_GROUP = None
    _GROUP_TIMEOUT = None


def get_local_rank() -> int:
    """Rank of this process within its machine (0 without a process group)."""
    group = get_local_process_group()
    if group is not None:
        return dist.get_rank(group=group)
    if not is_initialized():
        return 0
    return int(os.environ.get("LOCAL_RANK", get_rank()))


def get_local_size() -> int:
    """Number of processes on this machine (1 without a process group)."""
    group = get_local_process_group()
    if group is not None:
        return dist.get_world_size(group=group)
    if not is_initialized():
        return 1
    return int(os.environ.get("LOCAL_WORLD_SIZE", get_world_size()))


def is_main_process() -> bool:
    """Whether this is global rank 0 (the process that writes files and logs to the console)."""
    return get_rank() == 0


def synchronize() -> None:
    """Barrier across all processes; a no-op for a single process."""
    if get_world_size() == 1:
        return
    if dist.get_backend() == dist.Backend.NCCL and torch.cuda.is_available():
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def _gloo_group() -> dist.ProcessGroup:
    # Python objects are gathered over gloo (CPU memory) even when training uses NCCL. Creating a group is
    # collective, so every rank reaches this point in the same order (the first gather of the job).
    global _GLOO_GROUP
    if _GLOO_GROUP is None:
        # A new group does not inherit init_process_group's timeout: pass launch.timeout on (the other ranks
        # wait here while the main process evaluates alone).
        if dist.get_backend() == "nccl":
            _GLOO_GROUP = dist.new_group(backend="gloo", timeout=_GROUP_TIMEOUT)
        else:
            _GLOO_GROUP = dist.group.WORLD
    return _GLOO_GROUP


def all_gather(data: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Gather a picklable object from every rank; every rank gets the list in rank order.

    Args:
        data: any picklable object.
        group: the group to gather over; default all ranks (over gloo, also when training uses NCCL).
    """
    if get_world_size() == 1:
        return [data]
    group = group or _gloo_group()
    output: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(output, data, group=group)
    return output


def gather(data: Any, dst: int = 0, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Gather a picklable object on rank `dst` (the list in rank order); other ranks get ``[]``.

    Args:
        data: any picklable object.
        dst: the global rank that receives the list.
        group: the group to gather over; default all ranks.
    """
    if get_world_size() == 1:
        return [data]
    group = group or _gloo_group()
    output = [None] * dist.get_world_size(group) if get_rank() == dst else None
    dist.gather_object(data, output, dst=dst, group=group)
    return output if get_rank() == dst else []


def gather_in_turn(data: Any, dst: int = 0) -> Iterator[Any]:
    """On rank `dst`, each rank's picklable object in rank order, one at a time: the next is received only
    when asked for, so `dst` holds one other rank's object at a time (`gather` holds them all at once). Other
    ranks send theirs (waiting until `dst` takes it) and get nothing. Every rank must exhaust the iterator.

    Args:
        data: any picklable object.
        dst: the global rank that receives the objects.
    """
    if get_world_size() == 1:
        yield data
        return
    group = _gloo_group()
    if get_rank() != dst:
        dist.send_object_list([data], dst=dst, group=group)
        return
    for rank in range(get_world_size()):
        if rank == dst:
            yield data
            continue
        holder: list[Any] = [None]
        dist.recv_object_list(holder, src=rank, group=group)
        yield holder.pop()


def broadcast_object(data: Any, src: int = 0) -> Any:
    """Rank `src`'s value of a picklable object, on every rank (rank `src` decides, the others follow)."""
    if get_world_size() == 1:
        return data
    holder = [data if get_rank() == src else None]
    dist.broadcast_object_list(holder, src=src, group=_gloo_group())
    return holder[0]


def max_over_ranks(value: int) -> int:
    """The largest of an integer given by every rank (over gloo: no device copy, also with NCCL)."""
    if get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_gloo_group())
    return int(tensor.item())


def shared_random_seed() -> int:
    """A random seed drawn on rank 0 and shared by all ranks."""
    seed = int(np.random.randint(2**31))
    return all_gather(seed)[0]


def reduce_dict(values: dict[str, torch.Tensor], average: bool = True) -> dict[str, torch.Tensor]:
    """Sum (or average) a dict of scalar tensors over all ranks, e.g. losses for logging.

    Args:
        values: scalar tensors with the same keys on every rank (on the device the backend uses).
        average: divide the sum by the world size.

    Returns:
        The reduced values (float32) on rank 0; other ranks get values that are not meaningful.
    """
    world_size = get_world_size()
    if world_size == 1 or not values:
        return values
    with torch.no_grad():
        names = sorted(values)
        stacked = torch.stack([values[name].detach().float() for name in names])
        dist.reduce(stacked, dst=0)
        if get_rank() == 0 and average:
            stacked /= world_size
    return dict(zip(names, stacked))


def unwrap_model(model: Any) -> Any:
    """The model inside a `DistributedDataParallel` or `DataParallel` wrapper, or `model` itself."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model
