"""The step agreement: one packed all-reduce per training step carries the losses, each rank's non-finite flag
and the stop signals the ranks received, so that every rank raises the same error at the same step, stops
after the same step, and nothing hangs.

Why it is needed: a rank that raised alone on a NaN loss would leave the others waiting in DDP's gradient
all-reduce, and a rank that stopped alone on SIGTERM would leave them waiting in the collective checkpoint.
Why in one collective: the losses are reduced for the metrics anyway, so the flags ride along, and the step
waits for the device once (the ``tolist()`` that reads the reduced values).

`SimpleTrainer` calls `agree_on_step` after the forward pass of its last chunk, before the backward pass (whose
DDP collective a failing rank must not enter); `TrainerBase` reads the agreed stop signal from it instead of
asking the ranks again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from lazytrain.errors import mark_agreed
from lazytrain.utils import comm
from lazytrain.utils.preemption import REQUEST_SIGNALS

__all__ = ["StepAgreement", "agree_on_step"]


class StepAgreement(NamedTuple):
    """What all ranks agreed on after a step's forward pass.

    Attributes:
        loss_means: each loss averaged over the ranks (for the metrics).
        stop_signal: the signal to stop on after this step (the highest number any rank received), 0 to go on.
    """

    loss_means: dict[str, float]
    stop_signal: int


def agree_on_step(losses: Mapping[str, torch.Tensor], requested_signal: int, iteration: int) -> StepAgreement:
    """All ranks agree on the step in one all-reduce: the losses, which ranks got a non-finite loss, and stop
    requests. Every rank must call it once per step with the same loss names.

    Args:
        losses: this rank's scalar losses.
        requested_signal: the stop signal this rank received (0: none; see `lazytrain.utils.preemption`).
        iteration: the step, for the error message.

    Raises:
        FloatingPointError: on every rank, with the same message, when any rank's loss is not finite.
    """
    world_size, rank = comm.get_world_size(), comm.get_rank()
    names = list(losses)
    values = torch.stack([losses[name].detach().float().reshape(()) for name in names])
    non_finite = torch.zeros(world_size, device=values.device)
    non_finite[rank] = (~torch.isfinite(values).all()).float()
    # Filled on the device: torch.tensor(flags, device=...) would copy from host memory, which waits for the
    # device's queue like the tolist() below.
    requested = torch.zeros(len(REQUEST_SIGNALS), device=values.device)
    if requested_signal in REQUEST_SIGNALS:
        requested[REQUEST_SIGNALS.index(requested_signal)] = 1.0
    packed = torch.cat([values, non_finite, requested])
    if world_size > 1:
        torch.distributed.all_reduce(packed)
    reduced = packed.tolist()
    means = {name: value / world_size for name, value in zip(names, reduced)}
    failed = [r for r, flag in enumerate(reduced[len(names) : len(names) + world_size]) if flag]
    if failed:
        raise mark_agreed(FloatingPointError(_non_finite_message(means, failed, world_size, iteration)))
    requested_counts = reduced[len(names) + world_size :]
    stop_signal = max((s for s, n in zip(REQUEST_SIGNALS, requested_counts) if n), default=0)
    return StepAgreement(means, stop_signal)


def _non_finite_message(means: dict[str, float], ranks: list[int], world_size: int, iteration: int) -> str:
    values = ", ".join(f"{name}={value:.4g}" for name, value in means.items())
    where = f" on rank {', '.join(map(str, ranks))} of {world_size}" if world_size > 1 else ""
    mean = " (mean over ranks)" if world_size > 1 else ""
    return (
        f"Loss became infinite or NaN at iteration {iteration}{where}: {values}{mean}. Every rank stops here; "
        "the last checkpoint on disk is intact. Lower the learning rate, enable train.clip_grad, start from "
        "pretrained weights (train.init_checkpoint), or check the data of this batch."
    )
