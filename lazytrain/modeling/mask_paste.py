"""Paste the mask head's small probability maps into full images, all detections at once.

torchvision's `paste_masks_in_image` resizes and copies one detection at a time (a Python loop with an
interpolation per mask; docs/benchmarks.md has the times). Its result is separable: the image row ``y`` of a
pasted mask is a bilinear mix of two mask rows, the same for every column, so the pasted map is
``rows @ mask @ cols.T`` with per-detection interpolation matrices. `paste_masks` builds those matrices from
torchvision's own rules (1-pixel padding, box expansion, integer box corners, `interpolate` with
``align_corners=False``) and gives the same probabilities up to float rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lazytrain.modeling.interpolation import linear_interpolation_weights

__all__ = ["paste_masks"]


def _interpolation_matrix(start: Tensor, length: Tensor, mask_size: int, image_size: int) -> Tensor:
    """[N, image_size, mask_size] weights: image pixel ``start + j`` (0 <= j < length) samples mask position
    ``(j + 0.5) * mask_size / length - 0.5`` bilinearly (torch's ``align_corners=False``); other pixels get 0."""
    pixels = torch.arange(image_size, device=start.device)
    offset = pixels[None, :] - start[:, None]  # position inside the pasted box
    inside = (offset >= 0) & (offset < length[:, None])
    scale = mask_size / length.to(torch.float32)
    source = (offset.to(torch.float32) + 0.5) * scale[:, None] - 0.5
    return linear_interpolation_weights(source, mask_size) * inside[..., None]


def paste_masks(masks: Tensor, boxes: Tensor, image_shape: tuple[int, int], padding: int = 1) -> Tensor:
    """Same result as torchvision's ``paste_masks_in_image(masks, boxes, image_shape, padding)``.

    Args:
        masks: [N, 1, M, M] mask probabilities of the detections (the mask head's output for its class).
        boxes: [N, 4] XYXY boxes in the image's pixel coordinates.
        image_shape: (height, width) of the image to paste into.
        padding: zero border added around each mask before resizing (torchvision's 1).

    Returns:
        [N, 1, height, width] probabilities, 0 outside each detection's box.
    """
    height, width = image_shape
    # No early return for zero detections: the products below give [0, 1, height, width] by themselves, and
    # a trace (model export) would freeze such a branch to the example's case.
    mask_size = masks.shape[-1]
    padded = torch.nn.functional.pad(masks[:, 0].float(), (padding,) * 4)
    scale = (mask_size + 2 * padding) / mask_size
    half_width = (boxes[:, 2] - boxes[:, 0]) * 0.5 * scale
    half_height = (boxes[:, 3] - boxes[:, 1]) * 0.5 * scale
    center_x = (boxes[:, 2] + boxes[:, 0]) * 0.5
    center_y = (boxes[:, 3] + boxes[:, 1]) * 0.5
    x0, x1 = (center_x - half_width).long(), (center_x + half_width).long()  # truncation, as torchvision
    y0, y1 = (center_y - half_height).long(), (center_y + half_height).long()
    size = padded.shape[-1]
    rows = _interpolation_matrix(y0, (y1 - y0 + 1).clamp(min=1), size, height)
    cols = _interpolation_matrix(x0, (x1 - x0 + 1).clamp(min=1), size, width)
    pasted = rows @ padded @ cols.transpose(1, 2)
    return pasted[:, None].to(masks.dtype)
