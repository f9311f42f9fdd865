"""Linear interpolation as a matrix: the weights that mix grid values into values at arbitrary positions.

RoIAlign (`poolers`) and mask pasting (`mask_paste`) are both separable bilinear resamplings; each builds its
row and column matrices from this one function and applies them with matrix products.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linear_interpolation_weights"]


def linear_interpolation_weights(positions: Tensor, size: int) -> Tensor:
    """[..., size] weights of grid points ``0 .. size - 1`` for values at ``positions`` (any shape).

    Positions are clamped to the grid first, so a position past an end takes the end value (the border rule
    of torchvision's RoIAlign and of ``interpolate(align_corners=False)``). Each row sums to 1.
    """
    positions = positions.clamp(0, size - 1)
    grid = torch.arange(size, dtype=positions.dtype, device=positions.device)
    return (1.0 - (positions[..., None] - grid).abs()).clamp(min=0.0)
