"""Optimizer parameter groups built from a model (the program fills ``optimizer.params.model``)."""

from __future__ import annotations

import torch

__all__ = ["get_default_optimizer_params"]

_NORM_TYPES = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.GroupNorm,
    torch.nn.LayerNorm,
    torch.nn.LocalResponseNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
)


def get_default_optimizer_params(
    model: torch.nn.Module,
    *,
    weight_decay: float | None = None,
    weight_decay_norm: float | None = None,
    weight_decay_bias: float | None = None,
) -> list[dict]:
    """One param group per trainable parameter, with no (or another) weight decay for norm layers/biases.

    Args:
        model: the (unwrapped) model.
        weight_decay: decay for ordinary weights (None: the optimizer's own value).
        weight_decay_norm: decay for parameters of normalization layers (None: as ordinary weights).
        weight_decay_bias: decay for biases (None: as ordinary weights).
    """
    groups, seen = [], set()
    for module in model.modules():
        is_norm = isinstance(module, _NORM_TYPES) or type(module).__name__ == "FrozenBatchNorm2d"
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or param in seen:
                continue
            seen.add(param)
            decay = weight_decay
            if is_norm and weight_decay_norm is not None:
                decay = weight_decay_norm
            elif name == "bias" and weight_decay_bias is not None:
                decay = weight_decay_bias
            group = {"params": [param]}
            if decay is not None:
                group["weight_decay"] = decay
            groups.append(group)
    return groups
