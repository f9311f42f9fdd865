"""Box coding and clipping without host syncs: torchvision's `BoxCoder` and ``clip_boxes_to_image`` with the
same results.

torchvision builds small tensors from Python numbers on every call of its box coder; on a GPU each is a wait
for the device; and it decodes half and bfloat16 codes in their own dtype (coordinates rounded to 4-8 px). The RPN and the RoI heads use this one (matching: `lazytrain.modeling.matching`).
`clip_to_image_sizes` clips boxes of many images at once, each to its own size.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection import _utils as det_utils

__all__ = ["BoxCoder", "clip_to_image_sizes"]


class BoxCoder(det_utils.BoxCoder):
    """torchvision's `BoxCoder` without the tensors it builds from Python numbers on every call
    (``torch.as_tensor(weights, device=)`` in encode, ``torch.tensor(0.5, device=)`` twice in decode): each is a
    blocking host-to-device copy on a GPU. The arithmetic is the same, in the same order, so are the bits."""

    def encode_single(self, reference_boxes: Tensor, proposals: Tensor) -> Tensor:
        weight_x, weight_y, weight_w, weight_h = self.weights
        anchor_widths = proposals[:, 2:3] - proposals[:, 0:1]
        anchor_heights = proposals[:, 3:4] - proposals[:, 1:2]
        anchor_x = proposals[:, 0:1] + 0.5 * anchor_widths
        anchor_y = proposals[:, 1:2] + 0.5 * anchor_heights
        widths = reference_boxes[:, 2:3] - reference_boxes[:, 0:1]
        heights = reference_boxes[:, 3:4] - reference_boxes[:, 1:2]
        center_x = reference_boxes[:, 0:1] + 0.5 * widths
        center_y = reference_boxes[:, 1:2] + 0.5 * heights
        return torch.cat(
            (
                weight_x * (center_x - anchor_x) / anchor_widths,
                weight_y * (center_y - anchor_y) / anchor_heights,
                weight_w * torch.log(widths / anchor_widths),
                weight_h * torch.log(heights / anchor_heights),
            ),
            dim=1,
        )

    def decode(self, rel_codes: Tensor, boxes: list[Tensor]) -> Tensor:
        """[R, 4 * C] codes for the R boxes of all images (`boxes`, per image) -> [R, C, 4] boxes. torchvision's
        result, without its branch on whether R is 0 (``torch.export`` cannot take a branch on a size that
        depends on the data); for R = 0 the result is [0, C, 4] here, torchvision's [0, 4 * C]."""
        return self.decode_single(rel_codes, torch.cat(boxes)).unflatten(1, (-1, 4))

    def decode_single(self, rel_codes: Tensor, boxes: Tensor) -> Tensor:
        """torchvision's decoding, in float32 for half and bfloat16 codes (under autocast the heads give
        those): torchvision decodes in the codes' dtype, which rounds a coordinate between 512 and 1024 px to
        a multiple of 4 in bfloat16. detectron2 decodes in float32 too."""
        if rel_codes.dtype in (torch.float16, torch.bfloat16):
            rel_codes = rel_codes.float()
        boxes = boxes.to(rel_codes.dtype)
        widths = boxes[:, 2] - boxes[:, 0]
        heights = boxes[:, 3] - boxes[:, 1]
        center_x = boxes[:, 0] + 0.5 * widths
        center_y = boxes[:, 1] + 0.5 * heights
        weight_x, weight_y, weight_w, weight_h = self.weights
        dx = rel_codes[:, 0::4] / weight_x
        dy = rel_codes[:, 1::4] / weight_y
        dw = (rel_codes[:, 2::4] / weight_w).clamp(max=self.bbox_xform_clip)
        dh = (rel_codes[:, 3::4] / weight_h).clamp(max=self.bbox_xform_clip)
        predicted_x = dx * widths[:, None] + center_x[:, None]
        predicted_y = dy * heights[:, None] + center_y[:, None]
        half_width = 0.5 * (torch.exp(dw) * widths[:, None])
        half_height = 0.5 * (torch.exp(dh) * heights[:, None])
        corners = (
            predicted_x - half_width,
            predicted_y - half_height,
            predicted_x + half_width,
            predicted_y + half_height,
        )
        return torch.stack(corners, dim=2).flatten(1)


def clip_to_image_sizes(boxes: Tensor, sizes: Tensor) -> Tensor:
    """[N, K, 4] boxes clipped to [0, width] x [0, height] of their image; `sizes` [N, 2] holds (height,
    width). torchvision's ``clip_boxes_to_image`` (the same values), with one size per row."""
    heights, widths = sizes[:, None, None, 0], sizes[:, None, None, 1]
    x = boxes[..., 0::2].clamp(min=0).minimum(widths)
    y = boxes[..., 1::2].clamp(min=0).minimum(heights)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)
