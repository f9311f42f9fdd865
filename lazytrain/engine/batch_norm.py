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

__all__ = ["average_batch_norm_statistics"]


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
    world_size = comm.get_world_size()
    if world_size == 1:
        return
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, torch.nn.SyncBatchNorm):
            for buffer in (module.running_mean, module.running_var):
                if buffer is not None:
                    groups.setdefault((buffer.device, buffer.dtype), []).append(buffer)
    with torch.no_grad():
        for buffers in groups.values():
            flat = torch.cat([buffer.reshape(-1) for buffer in buffers])
            dist.all_reduce(flat)
            flat /= world_size
            for buffer, mean in zip(buffers, flat.split([buffer.numel() for buffer in buffers])):
                buffer.copy_(mean.view_as(buffer))
