"""`AnchorGenerator`: torchvision's anchors, always in float32, and computed once per feature-map size.

torchvision's generator makes its anchors in the feature maps' dtype: under bfloat16 autocast they come out
bfloat16, whose 8-bit mantissa rounds a coordinate between 512 and 1024 px to a multiple of 4 (8 above 1024).
The RPN then trains on targets encoded against those rounded anchors and decodes its proposals from them,
while evaluation (float32) uses the exact ones. detectron2 keeps its anchors in float32 buffers and decodes in
float32; so does lazytrain (this generator, and `lazytrain.modeling.box_coding.BoxCoder`).

It also rebuilds the same anchors on every forward pass (~50 small device operations per step, and a
concatenation per image) although they depend only on the feature-map sizes: here they are computed once per
size and device and kept (the last `CACHED_SIZES` sizes), and every image of a batch gets the same tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection.anchor_utils import AnchorGenerator as TorchvisionAnchorGenerator
from torchvision.models.detection.image_list import ImageList

__all__ = ["CACHED_SIZES", "AnchorGenerator"]

# Padded batch sizes whose anchors are kept: training on fixed-size or bucketed batches reuses a few.
CACHED_SIZES = 8


class AnchorGenerator(TorchvisionAnchorGenerator):
    """torchvision's `AnchorGenerator` (same arguments and anchors, bit for bit in float32), with float32
    anchors under autocast and the anchors of recent sizes kept.

    Under tracing and ``torch.export`` it is torchvision's (the sizes there may be symbolic).

    Args:
        sizes: anchor sizes per feature map, as torchvision's.
        aspect_ratios: height / width ratios per feature map, as torchvision's.
    """

    def __init__(
        self, sizes: tuple | list = ((128, 256, 512),), aspect_ratios: tuple | list = ((0.5, 1.0, 2.0),)
    ) -> None:
        super().__init__(sizes, aspect_ratios)
        self._anchors: dict[tuple, Tensor] = {}

    def forward(self, image_list: ImageList, feature_maps: list[Tensor]) -> list[Tensor]:
        """The anchors of every feature map, concatenated: the same [A, 4] float32 tensor for each image."""
        if torch.jit.is_tracing() or torch.compiler.is_exporting() or torch.compiler.is_compiling():
            return super().forward(image_list, feature_maps)
        grid_sizes = tuple(tuple(feature_map.shape[-2:]) for feature_map in feature_maps)
        image_size = tuple(image_list.tensors.shape[-2:])
        key = (grid_sizes, image_size, feature_maps[0].device)
        anchors = self._anchors.pop(key, None)
        if anchors is None:
            anchors = self._make_anchors(grid_sizes, image_size, feature_maps[0].device)
        self._anchors[key] = anchors  # last used last: the first entry is the least recently used
        if len(self._anchors) > CACHED_SIZES:
            del self._anchors[next(iter(self._anchors))]
        return [anchors] * len(image_list.image_sizes)

    def _make_anchors(
        self, grid_sizes: tuple[tuple[int, int], ...], image_size: tuple[int, int], device: torch.device
    ) -> Tensor:
        """torchvision's `forward` for one image, in float32."""
        strides = [
            # Filled on the device, as torchvision does: a tensor from Python data would wait for the device.
            [
                torch.empty((), dtype=torch.int64, device=device).fill_(image_size[0] // grid[0]),
                torch.empty((), dtype=torch.int64, device=device).fill_(image_size[1] // grid[1]),
            ]
            for grid in grid_sizes
        ]
        self.set_cell_anchors(torch.float32, device)
        return torch.cat(self.grid_anchors([list(grid) for grid in grid_sizes], strides))
