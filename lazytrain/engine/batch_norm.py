"""BatchNorm running statistics of every rank, in checkpoints and evaluations: `averaged_batch_norm_statistics`.

DDP with ``broadcast_buffers=False`` (the recipes' choice, as detectron2's) leaves each rank's BatchNorm
running statistics its own, computed from its own batches. The checkpointer (`Checkpointer.save`) saves, and
the evaluation hook (`EvalHook`) evaluates with, their average over the ranks, so that the saved and the
evaluated model hold the statistics of every rank's data, not rank 0's alone. The average is taken aside:
each rank trains on with its own statistics, so a run that saved or evaluated at other moments (a stop
checkpoint, an evaluation abandoned and run again after a resume) trains bit for bit as one that did not;
the trainer's per-rank checkpoint state keeps each rank's own statistics for the resumed run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from lazytrain.utils import comm

__all__ = [
    "average_over_ranks",
    "averaged_batch_norm_statistics",
    "averaged_over_ranks",
    "batch_norm_statistics_averaged",
    "get_batch_norm_statistics",
    "get_rank_local_state",
    "load_rank_local_state",
]


def get_batch_norm_statistics(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The rank-local BatchNorm statistics of `model` by state-dict name: every BatchNorm's ``running_mean``
    and ``running_var``, except those of `torch.nn.SyncBatchNorm` layers (the same on every rank already).

    Args:
        model: the model, not DDP-wrapped (the names are those of its own state dict).
    """
    statistics = {}
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, torch.nn.SyncBatchNorm):
            for key in ("running_mean", "running_var"):
                buffer = getattr(module, key)
                if buffer is not None:
                    statistics[f"{name}.{key}" if name else key] = buffer
    return statistics


def average_over_ranks(tensors: list[torch.Tensor]) -> None:
    """Replace, in place, each of `tensors` by its mean over the ranks (one all-reduce per device and dtype).

    Every rank must call it at the same moment with tensors of the same shapes; with one process or no
    process group it does nothing.
    """
    world_size = comm.get_world_size()
    if world_size == 1:
        return
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    with torch.no_grad():
        for group in groups.values():
            flat = torch.cat([tensor.reshape(-1) for tensor in group])
            dist.all_reduce(flat)
            flat /= world_size
            for tensor, mean in zip(group, flat.split([tensor.numel() for tensor in group])):
                tensor.copy_(mean.view_as(tensor))


def averaged_over_ranks(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The mean over the ranks of each of `tensors`, as new tensors by the same names (`tensors` are left as
    they are). Every rank must call it at the same moment with tensors of the same names and shapes."""
    copies = {name: tensor.detach().clone() for name, tensor in tensors.items()}
    average_over_ranks(list(copies.values()))
    return copies


def averaged_batch_norm_statistics(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every BatchNorm's ``running_mean`` and ``running_var`` averaged over the ranks, as new tensors by
    state-dict name; `model` keeps its own. Empty with one process (nothing to average).

    Every rank must call it at the same moment (one all-reduce per device and dtype). ``num_batches_tracked``
    is not included (the same on every rank: ranks take the same number of steps), nor are
    `torch.nn.SyncBatchNorm` layers (their statistics are the same everywhere already). Averaging commutes with
    BatchNorm's (linear) running updates, so the average after training does not depend, up to rounding, on
    when it was taken before.

    Args:
        model: the model, DDP-wrapped or not.
    """
    if comm.get_world_size() == 1:
        return {}
    return averaged_over_ranks(get_batch_norm_statistics(comm.unwrap_model(model)))


@contextlib.contextmanager
def batch_norm_statistics_averaged(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, `model`'s BatchNorm statistics are their average over the ranks
    (`averaged_batch_norm_statistics`); its own come back after it, also on an error."""
    averaged = averaged_batch_norm_statistics(model)
    statistics = get_batch_norm_statistics(comm.unwrap_model(model))
    own = {name: statistics[name].clone() for name in averaged}
    _copy_into(statistics, averaged)
    try:
        yield
    finally:
        _copy_into(statistics, own)


def get_rank_local_state(model: torch.nn.Module, ema_statistics: Mapping[str, torch.Tensor] | None) -> dict:
    """This rank's own BatchNorm statistics (``batch_norm``) and its EMA's (``ema_batch_norm``, given as
    `ModelEMA.rank_local_statistics`), copied to the CPU, for the trainer's per-rank checkpoint state (the
    checkpoint's model holds their average over the ranks); empty with one process."""
    if comm.get_world_size() == 1:
        return {}
    state = {"batch_norm": _cpu_copies(get_batch_norm_statistics(comm.unwrap_model(model)))}
    if ema_statistics:
        state["ema_batch_norm"] = _cpu_copies(ema_statistics)
    return state


def load_rank_local_state(
    model: torch.nn.Module, ema_statistics: Mapping[str, torch.Tensor] | None, state: Mapping[str, Any]
) -> None:
    """Put back what `get_rank_local_state` saved into `model` and the EMA's statistics (after the checkpoint's
    averaged weights were loaded), so that each rank trains on with its own statistics."""
    _copy_into(get_batch_norm_statistics(comm.unwrap_model(model)), state.get("batch_norm", {}))
    if ema_statistics is not None:
        _copy_into(ema_statistics, state.get("ema_batch_norm", {}))


def _cpu_copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()}


def _copy_into(targets: Mapping[str, torch.Tensor], values: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in values.items():
            if name in targets:
                targets[name].copy_(value)
