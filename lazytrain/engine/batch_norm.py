"""BatchNorm running statistics made the same on every rank: `average_batch_norm_statistics`.

DDP with ``broadcast_buffers=False`` (the recipes' choice, as detectron2's) leaves each rank's BatchNorm
running statistics its own, computed from its own batches. The checkpointer (`Checkpointer.save`) and the
evaluation hook (`EvalHook`) average them over the ranks first, so that the saved model and the evaluated
model hold the statistics of every rank's data, not rank 0's alone.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from lazytrain.utils import comm

__all__ = ["average_batch_norm_statistics", "average_over_ranks", "get_batch_norm_statistics"]


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


def average_batch_norm_statistics(model: torch.nn.Module) -> None:
    """Replace, in place, every BatchNorm's ``running_mean`` and ``running_var`` by their mean over the ranks.

    Every rank must call it at the same moment (it is one all-reduce per device and dtype); with one process or
    no process group it does nothing. ``num_batches_tracked`` is left as it is (the same on every rank: ranks
    take the same number of steps), and `torch.nn.SyncBatchNorm` layers are skipped (their statistics are
    already the same everywhere). Averaging commutes with BatchNorm's (linear) running updates, so the
    statistics after training do not depend, up to rounding, on when they were averaged before.

    Args:
        model: the model, DDP-wrapped or not.
    """
    if comm.get_world_size() > 1:
        average_over_ranks(list(get_batch_norm_statistics(model).values()))
