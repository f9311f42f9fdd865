"""Paste the mask head's small probability maps into full images, all detections at once.

torchvision's `paste_masks_in_image` resizes and copies one detection at a time (a Python loop with an
interpolation per mask; docs/benchmarks.md has the times). Its result is separable: the image row ``y`` of a
pasted mask is a bilinear mix of two mask rows, the same for every column, so the pasted map is
``rows @ mask @ cols.T`` with per-detection interpolation matrices. `paste_masks` builds those matrices from
torchvision's own rules (1-pixel padding, box expansion, integer box corners, `interpolate` with
``align_corners=False``) and gives the same probabilities up to float rounding.

`RCNN` thresholds the pasted probabilities with a paste rule object (``model.mask_paste``):
`TorchvisionMaskPaste` (the default: `paste_masks`, pixels ``> threshold``) or `GridSampleMaskPaste`
(detectron2's rule: the mask resampled by ``grid_sample`` over the box's continuous extent, without padding,
zero outside the mask's grid, pixels ``>= threshold``). The torchvision rule's integer box and padding move
the mask edge by up to a pixel, which matters most on small boxes (issue 60's study of detectron2's weights found
~1.6% of the mask area flipped).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lazytrain.modeling.interpolation import linear_interpolation_weights

__all__ = ["GridSampleMaskPaste", "TorchvisionMaskPaste", "paste_masks", "paste_masks_continuous"]


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


def _continuous_interpolation_matrix(
    start: Tensor, end: Tensor, mask_size: int, image_size: int, dtype: torch.dtype
) -> Tensor:
    """[N, image_size, mask_size] weights of ``grid_sample(align_corners=False, padding_mode="zeros")``
    along one axis: pixel centre ``p + 0.5`` normalised to the box's extent [start, end] as
    ``(p + 0.5 - start) / (end - start) * 2 - 1`` (in the boxes' dtype), then unnormalised to a mask
    position ``((u + 1) * mask_size - 1) / 2`` in `dtype` (the masks'); positions outside the mask's grid mix in
    zeros."""
    pixels = torch.arange(image_size, device=start.device, dtype=torch.float32) + 0.5
    normalized = (pixels[None, :] - start[:, None]) / (end - start)[:, None] * 2 - 1
    positions = ((normalized.to(dtype) + 1) * mask_size - 1) / 2
    grid = torch.arange(mask_size, dtype=positions.dtype, device=positions.device)
    return (1.0 - (positions[..., None] - grid).abs()).clamp(min=0.0)


def paste_masks_continuous(masks: Tensor, boxes: Tensor, image_shape: tuple[int, int]) -> Tensor:
    """Mask probabilities pasted by detectron2's rule: each [M, M] mask resampled bilinearly over its box's
    continuous extent (no padding, no rounding of the box), zero where a pixel centre samples outside the
    mask's grid, as ``grid_sample(align_corners=False)`` (detectron2's ``paste_masks_in_image``).

    Args:
        masks: [N, 1, M, M] mask probabilities of the detections.
        boxes: [N, 4] XYXY boxes in the image's pixel coordinates, wider and higher than 0.
        image_shape: (height, width) of the image to paste into.

    Returns:
        [N, 1, height, width] probabilities in the masks' dtype (at least float32).
    """
    height, width = image_shape
    probabilities = masks[:, 0]
    if not probabilities.dtype.is_floating_point or probabilities.dtype in (torch.float16, torch.bfloat16):
        probabilities = probabilities.float()
    dtype = probabilities.dtype
    mask_size = probabilities.shape[-1]
    rows = _continuous_interpolation_matrix(boxes[:, 1], boxes[:, 3], mask_size, height, dtype)
    cols = _continuous_interpolation_matrix(boxes[:, 0], boxes[:, 2], mask_size, width, dtype)
    return (rows @ probabilities @ cols.transpose(1, 2))[:, None]


class TorchvisionMaskPaste:
    """torchvision's mask pasting (`paste_masks`: 1-pixel padding, integer box), pixels above `threshold`:
    `RCNN`'s default ``mask_paste``."""

    def __call__(
        self, masks: Tensor, boxes: Tensor, image_shape: tuple[int, int], threshold: float
    ) -> Tensor:
        """[N, height, width] bool masks from [N, 1, M, M] probabilities and their [N, 4] boxes."""
        return paste_masks(masks, boxes, image_shape)[:, 0] > threshold


class GridSampleMaskPaste:
    """detectron2's mask pasting (`paste_masks_continuous`), pixels at or above `threshold`. Set it with
    ``model.mask_paste`` (recipes/models/mask_rcnn_fpn_detectron2.py does) for detectron2's masks."""

    def __call__(
        self, masks: Tensor, boxes: Tensor, image_shape: tuple[int, int], threshold: float
    ) -> Tensor:
        """[N, height, width] bool masks from [N, 1, M, M] probabilities and their [N, 4] boxes."""
        return paste_masks_continuous(masks, boxes, image_shape)[:, 0] >= threshold
