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

from lazytrain.modeling.host_values import to_device

__all__ = ["BoxCoder", "clip_to_image_sizes"]


class BoxCoder(det_utils.BoxCoder):
    """torchvision's `BoxCoder` without the tensors it builds from Python numbers on every call
    (``torch.as_tensor(weights, device=)`` in encode, ``torch.tensor(0.5, device=)`` twice in decode): each is a
    blocking host-to-device copy on a GPU. x and y are computed as column pairs (about half the kernels);
    each element's arithmetic is the same, in the same order, so are the bits.

    ``float32_decoding`` (an attribute, False by default) decodes codes of any dtype in float32, as
    detectron2 does: only a float64 model notices (its boxes are detectron2's bits).
    """

    float32_decoding: bool = False

    def encode_single(self, reference_boxes: Tensor, proposals: Tensor) -> Tensor:
        # x and y (and width and height) as column pairs: half of torchvision's operations, each element
        # computed by the same operations in the same order.
        weight_xy, weight_wh = self._weights(proposals)
        anchor_sizes = proposals[:, 2:] - proposals[:, :2]
        anchor_centers = proposals[:, :2] + 0.5 * anchor_sizes
        sizes = reference_boxes[:, 2:] - reference_boxes[:, :2]
        centers = reference_boxes[:, :2] + 0.5 * sizes
        offsets = weight_xy * (centers - anchor_centers) / anchor_sizes
        return torch.cat((offsets, weight_wh * torch.log(sizes / anchor_sizes)), dim=1)

    def _weights(self, like: Tensor) -> tuple[float | Tensor, float | Tensor]:
        """The (x, y) and (width, height) weights: one Python number for an equal pair (every recipe's, and
        the same CUDA kernels as torchvision's numbers), else a tensor on `like`'s device, copied without
        blocking (a tensor made from Python numbers on the device waits for it)."""
        pairs = []
        for first, second in (self.weights[:2], self.weights[2:]):
            if first == second:
                pairs.append(float(first))
            else:
                pairs.append(to_device((first, second), like.device, like.dtype))
        return pairs[0], pairs[1]

    def decode(self, rel_codes: Tensor, boxes: list[Tensor]) -> Tensor:
        """[R, 4 * C] codes for the R boxes of all images (`boxes`, per image) -> [R, C, 4] boxes. torchvision's
        result, without its branch on whether R is 0 (``torch.export`` cannot take a branch on a size that
        depends on the data); for R = 0 the result is [0, C, 4] here, torchvision's [0, 4 * C]."""
        return self.decode_single(rel_codes, torch.cat(boxes)).unflatten(1, (-1, 4))

    def decode_single(self, rel_codes: Tensor, boxes: Tensor) -> Tensor:
        """torchvision's decoding, in float32 for half and bfloat16 codes (under autocast the heads give
        those): torchvision decodes in the codes' dtype, which rounds a coordinate between 512 and 1024 px to
        a multiple of 4 in bfloat16. detectron2 decodes in float32 too."""
        if rel_codes.dtype in (torch.float16, torch.bfloat16) or self.float32_decoding:
            rel_codes = rel_codes.float()
        boxes = boxes.to(rel_codes.dtype)
        weight_xy, weight_wh = self._weights(rel_codes)
        sizes = boxes[:, 2:] - boxes[:, :2]
        centers = boxes[:, :2] + 0.5 * sizes
        codes = rel_codes.unflatten(1, (-1, 4))  # [R, C, 4]; reshape(R, -1, 4) is ambiguous for R = 0
        offsets = codes[..., :2] / weight_xy
        scales = (codes[..., 2:] / weight_wh).clamp(max=self.bbox_xform_clip)
        predicted_centers = offsets * sizes[:, None] + centers[:, None]
        half_sizes = 0.5 * (torch.exp(scales) * sizes[:, None])
        corners = torch.cat((predicted_centers - half_sizes, predicted_centers + half_sizes), dim=2)
        return corners.flatten(1)


def clip_to_image_sizes(boxes: Tensor, sizes: Tensor) -> Tensor:
    """[N, K, 4] boxes clipped to [0, width] x [0, height] of their image; `sizes` [N, 2] holds (height,
    width). torchvision's ``clip_boxes_to_image`` (the same values), with one size per row."""
    heights, widths = sizes[:, None, None, 0], sizes[:, None, None, 1]
    x = boxes[..., 0::2].clamp(min=0).minimum(widths)
    y = boxes[..., 1::2].clamp(min=0).minimum(heights)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)
