"""`AnchorGenerator`: torchvision's anchors, always in float32, and computed once per feature-map size.

torchvision's generator makes its anchors in the feature maps' dtype: under bfloat16 autocast they come out
bfloat16, whose 8-bit mantissa rounds a coordinate between 512 and 1024 px to a multiple of 4 (8 above 1024).
The RPN then trains on targets encoded against those rounded anchors and decodes its proposals from them,
while evaluation (float32) uses the exact ones. detectron2 keeps its anchors in float32 buffers and decodes in
float32; so does lazytrain (this generator, and `lazytrain.modeling.box_coding.BoxCoder`).

It also rebuilds the same anchors on every forward pass (~50 small device operations per step, and a
concatenation per image) although they depend only on the feature-map sizes: here they are computed once per
size and device and kept (the last `CACHED_SIZES` sizes), and every image of a batch gets the same tensor.

Two options give detectron2's anchors (`lazytrain.modeling.detectron2_weights`): ``round_cell_anchors=False``
keeps the cell anchors unrounded (detectron2's ``w = sqrt(size**2 / ratio)``, ``h = ratio * w``, computed in
float64 and stored in float32), and ``strides`` fixes each level's stride (detectron2's 4, 8, ..., 64), where
torchvision divides the padded image size by the grid size (61 instead of 64 for P6 of a 1344 px side whose P5
grid is odd: 42 // 22 cells of 1344 // 22 px).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.models.detection.anchor_utils import AnchorGenerator as TorchvisionAnchorGenerator
from torchvision.models.detection.image_list import ImageList

__all__ = ["CACHED_SIZES", "AnchorGenerator", "unrounded_cell_anchors"]

# Padded batch sizes whose anchors are kept: training on fixed-size or bucketed batches reuses a few.
CACHED_SIZES = 8


class AnchorGenerator(TorchvisionAnchorGenerator):
    """torchvision's `AnchorGenerator` (same arguments and anchors, bit for bit in float32), with float32
    anchors under autocast and the anchors of recent sizes kept.

    Under tracing and ``torch.export`` it is torchvision's (the sizes there may be symbolic).

    Args:
        sizes: anchor sizes per feature map, as torchvision's.
        aspect_ratios: height / width ratios per feature map, as torchvision's.
        round_cell_anchors: round the anchors around each cell's origin to whole pixels (torchvision's rule);
            False keeps them exact (detectron2's rule, computed in float64 and stored in float32). The order
            of a cell's anchors is torchvision's either way (ratio-major; detectron2's is size-major, the same
            with one size per level).
        strides: the stride of each feature map in pixels (detectron2: 4, 8, 16, 32, 64 for P2-P6); None
            (torchvision's rule) divides the padded image size by each grid size, which is not the stride
            where a grid size was rounded up (an odd P5 grid).
    """

    def __init__(
        self,
        sizes: tuple | list = ((128, 256, 512),),
        aspect_ratios: tuple | list = ((0.5, 1.0, 2.0),),
        *,
        round_cell_anchors: bool = True,
        strides: Sequence[int] | None = None,
    ) -> None:
        super().__init__(sizes, aspect_ratios)
        if strides is not None and len(strides) != len(self.sizes):
            raise ValueError(
                f"AnchorGenerator(strides=) needs one stride per feature map ({len(self.sizes)}, one per size "
                f"group); got {list(strides)}"
            )
        self.round_cell_anchors = bool(round_cell_anchors)
        self.strides = None if strides is None else [int(stride) for stride in strides]
        if not self.round_cell_anchors:
            self.cell_anchors = [
                unrounded_cell_anchors(level_sizes, level_ratios)
                for level_sizes, level_ratios in zip(self.sizes, self.aspect_ratios)
            ]
        self._anchors: dict[tuple, Tensor] = {}

    def forward(self, image_list: ImageList, feature_maps: list[Tensor]) -> list[Tensor]:
        """The anchors of every feature map, concatenated: the same [A, 4] float32 tensor for each image."""
        if self.strides is None and (
            torch.jit.is_tracing() or torch.compiler.is_exporting() or torch.compiler.is_compiling()
        ):
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
        """torchvision's `forward` for one image, in float32 (with `strides`, those strides)."""
        if self.strides is not None:
            if len(grid_sizes) != len(self.strides):
                raise ValueError(
                    f"AnchorGenerator(strides={self.strides}) has one stride per feature map; the backbone "
                    f"gave {len(grid_sizes)} maps"
                )
            self.set_cell_anchors(torch.float32, device)
            fixed = [
                [torch.empty((), dtype=torch.int64, device=device).fill_(stride)] * 2
                for stride in self.strides
            ]
            return torch.cat(self.grid_anchors([list(grid) for grid in grid_sizes], fixed))
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


def unrounded_cell_anchors(sizes: Sequence[float], aspect_ratios: Sequence[float]) -> Tensor:
    """[len(aspect_ratios) * len(sizes), 4] anchors around a cell's origin, not rounded: for ratio r = h / w
    and size s, ``w = sqrt(s * s / r)``, ``h = r * w`` (area s * s), computed in float64 and stored in
    float32, in torchvision's order (ratio-major)."""
    anchors = []
    for ratio in aspect_ratios:
        for size in sizes:
            width = math.sqrt(float(size) ** 2 / float(ratio))
            height = float(ratio) * width
            anchors.append([-width / 2.0, -height / 2.0, width / 2.0, height / 2.0])
    return torch.tensor(anchors, dtype=torch.float32)
