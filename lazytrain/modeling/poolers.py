"""RoIAlign as two small matrix products, for CPUs: same numbers as torchvision's kernel, faster on small maps.

torchvision's CPU RoIAlign visits every sample point of every box and channel one at a time, and its backward
pass is single-threaded: on small CPU models it is a large part of a training step (docs/benchmarks.md). With
a fixed ``sampling_ratio``, the bilinear samples of a box form a regular grid, so RoIAlign separates: output =
``rows @ feature @ cols.T`` per box, where ``rows`` [out_h, H] and ``cols`` [out_w, W] hold the bilinear
weights averaged over each bin's samples. Two matrix products run on BLAS in both directions.

The dense form touches every row/column of the map, so it is used only where it pays: in training (a backward
pass follows), on CPU tensors, with a fixed ``sampling_ratio``, and for an intermediate of at most
``dense_max_elements`` values (small maps, as in the demo); everything else (inference, GPU, large maps such as
800 px COCO images, ``sampling_ratio <= 0``) runs torchvision's kernel.

`MultiScaleRoIAlign` takes RoIAlign's ``aligned`` (detectron2's ROIAlignV2: boxes shifted by half a pixel, no
1-pixel minimum size; with ``sampling_ratio=0``, detectron2's adaptive sample grid) and the rule that assigns a
box to a level: ``floor(4 + log2(sqrt(area) / 224) + 1e-6)`` (torchvision) or, with ``epsilon_inside_log``,
``floor(4 + log2(sqrt(area) / 224 + 1e-8))`` (detectron2); they differ only for boxes within ~1e-6 of a level's
boundary size.

`MultiScaleRoIAlign` pools the FPN levels of torchvision's pooler from the RoIs sorted by level (one stable
sort): each level pools one slice of them, sized by a single host read of the per-level counts per call, where
one ``torch.where`` per level makes the host wait for the GPU once per level. While tracing (model export) it
keeps one ``torch.where`` per level, which records no counts in the trace.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torchvision
from torch import Tensor
from torchvision.ops import MultiScaleRoIAlign as TorchvisionMultiScaleRoIAlign
from torchvision.ops import roi_align as torchvision_roi_align
from torchvision.ops.poolers import LevelMapper, _convert_to_roi_format, _setup_scales

from lazytrain.modeling.host_values import to_device
from lazytrain.modeling.interpolation import linear_interpolation_weights

__all__ = ["EpsilonInsideLogLevelMapper", "MultiScaleRoIAlign", "roi_align", "roi_align_dense"]

# Largest [boxes x out_h x channels x width] intermediate of one image and level computed densely
# (64 MB in float32); above it, torchvision's kernel is cheaper in memory.
DENSE_MAX_ELEMENTS = 1 << 24


def _bilinear_weights(
    start: Tensor, end: Tensor, bins: int, sampling_ratio: int, size: int, aligned: bool
) -> Tensor:
    """[boxes, bins, size] weights of the positions along one axis, averaged over each bin's samples.

    Follows torchvision's RoIAlign: a sample further than one pixel outside the map contributes zero,
    one inside that margin is clamped to the border, and without ``aligned`` a box is at least 1 pixel long.
    """
    length = end - start
    if not aligned:
        length = length.clamp(min=1.0)
    offsets = (
        torch.arange(bins * sampling_ratio, dtype=start.dtype, device=start.device) + 0.5
    ) / sampling_ratio
    positions = start[:, None] + offsets[None, :] * (length / bins)[:, None]
    inside = (positions >= -1.0) & (positions <= size)
    weights = linear_interpolation_weights(positions, size) * inside[..., None]
    return weights.view(-1, bins, sampling_ratio, size).mean(2)


def roi_align_dense(
    input: Tensor,
    rois: Tensor,
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = 2,
    aligned: bool = False,
) -> Tensor:
    """`torchvision.ops.roi_align` for a fixed ``sampling_ratio`` computed as matrix products.

    Args:
        input: [N, C, H, W] feature maps (any memory format).
        rois: [K, 5] boxes as (batch index, x1, y1, x2, y2) in image coordinates.
        output_size: (height, width) of each pooled box, or one int for both.
        spatial_scale: feature map size / image size.
        sampling_ratio: bilinear samples per bin along each axis; must be > 0.
        aligned: shift boxes by -0.5 pixel (torchvision's ``aligned=True``).

    Returns:
        [K, C, out_h, out_w], equal to torchvision's result up to float rounding.
    """
    if sampling_ratio <= 0:
        raise ValueError(
            f"roi_align_dense(sampling_ratio=) must be > 0 (a fixed sample grid); got {sampling_ratio}. "
            "Use torchvision.ops.roi_align for the adaptive grid."
        )
    out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    num_images, channels, height, width = input.shape
    result = input.new_zeros((rois.shape[0], channels, out_h, out_w))
    if rois.shape[0] == 0:
        return result
    offset = 0.5 if aligned else 0.0
    boxes = rois[:, 1:].to(input.dtype) * spatial_scale - offset
    rows = _bilinear_weights(boxes[:, 1], boxes[:, 3], out_h, sampling_ratio, height, aligned)
    cols = _bilinear_weights(boxes[:, 0], boxes[:, 2], out_w, sampling_ratio, width, aligned)
    image_of_box = rois[:, 0].long()
    channels_last = input.dim() == 4 and input.is_contiguous(memory_format=torch.channels_last)
    for image in range(num_images):
        index = (image_of_box == image).nonzero().flatten()
        if index.numel() == 0:
            continue
        count = index.numel()
        if channels_last:  # [H, W*C] is a free view of a channels-last map
            feature = input[image].permute(1, 2, 0).reshape(height, width * channels)
            pooled = (rows[index].reshape(count * out_h, height) @ feature).view(
                count, out_h, width, channels
            )
            pooled = cols[index][:, None] @ pooled  # [count, out_h, out_w, C]
            result[index] = pooled.permute(0, 3, 1, 2).to(result.dtype)  # autocast: bf16 products
        else:
            feature = input[image].transpose(0, 1).reshape(height, channels * width)
            pooled = (rows[index].reshape(count * out_h, height) @ feature).view(
                count, out_h * channels, width
            )
            pooled = pooled @ cols[index].transpose(1, 2)  # [count, out_h * C, out_w]
            result[index] = pooled.view(count, out_h, channels, out_w).transpose(1, 2).to(result.dtype)
    return result


def _dense_pays(
    input: Tensor, rois: Tensor, output_height: int, sampling_ratio: int, max_elements: int
) -> bool:
    # Without a backward pass torchvision's forward kernel is the faster one (docs/benchmarks.md).
    backward = input.requires_grad and torch.is_grad_enabled()
    if not backward or input.device.type != "cpu" or sampling_ratio <= 0:
        return False
    if torchvision._is_tracing() or torch.compiler.is_exporting():  # exports keep torchvision's operator
        return False
    elements = rois.shape[0] * output_height * input.shape[1] * input.shape[-1]
    # No RoIs: nothing to gain, and torchvision's empty result stays in the autograd graph (zero gradient).
    return 0 < elements <= max_elements


def roi_align(
    input: Tensor,
    rois: Tensor,
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    *,
    dense_max_elements: int = DENSE_MAX_ELEMENTS,
) -> Tensor:
    """`torchvision.ops.roi_align` with the same arguments (rois as a [K, 5] tensor), dense where it pays."""
    size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if _dense_pays(input, rois, size[0], sampling_ratio, dense_max_elements):
        return roi_align_dense(input, rois, size, spatial_scale, sampling_ratio, aligned)
    return torchvision_roi_align(input, rois, size, spatial_scale, sampling_ratio, aligned)


def _batch_rois(boxes: list[Tensor]) -> Tensor:
    """torchvision's ``_convert_to_roi_format`` ([K, 5]: image index, box) with the image indices made for
    all images at once (torchvision: one ``full_like`` per image). Not for tracing: the counts are baked in."""
    concatenated = torch.cat(boxes)
    counts = to_device([b.shape[0] for b in boxes], concatenated.device)
    images = torch.arange(len(boxes), device=concatenated.device, dtype=concatenated.dtype)
    images = images.repeat_interleave(counts, output_size=concatenated.shape[0])
    return torch.cat((images[:, None], concatenated), dim=1)


def _level_of_rois(mapper: LevelMapper, rois: Tensor) -> Tensor:
    """torchvision's `LevelMapper` (FPN paper's Eqn. 1) for the [K, 5] RoIs of all images at once, with the
    same arithmetic (and bits); torchvision computes the areas image by image. With an
    `EpsilonInsideLogLevelMapper`, its rule."""
    areas = (rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2])
    scale = torch.sqrt(areas)
    if isinstance(mapper, EpsilonInsideLogLevelMapper):
        levels = torch.floor(mapper.lvl0 + torch.log2(scale / mapper.s0 + mapper.eps))
    else:
        eps = torch.tensor(mapper.eps, dtype=scale.dtype)
        levels = torch.floor(mapper.lvl0 + torch.log2(scale / mapper.s0) + eps)
    levels = torch.clamp(levels, min=mapper.k_min, max=mapper.k_max)
    return (levels.to(torch.int64) - mapper.k_min).to(torch.int64)


class EpsilonInsideLogLevelMapper(LevelMapper):
    """detectron2's level rule: ``floor(canonical_level + log2(sqrt(area) / canonical_scale + eps))``, eps
    1e-8 inside the log (torchvision's `LevelMapper` adds 1e-6 to the log). Same arguments as torchvision's."""

    def __init__(self, k_min: int, k_max: int, canonical_scale: int = 224, canonical_level: int = 4) -> None:
        super().__init__(k_min, k_max, canonical_scale, canonical_level, eps=1e-8)

    def __call__(self, boxlists: list[Tensor]) -> Tensor:
        scale = torch.sqrt(torch.cat([torchvision.ops.box_area(boxes) for boxes in boxlists]))
        levels = torch.floor(self.lvl0 + torch.log2(scale / self.s0 + self.eps))
        levels = torch.clamp(levels, min=self.k_min, max=self.k_max)
        return (levels.to(torch.int64) - self.k_min).to(torch.int64)


class MultiScaleRoIAlign(TorchvisionMultiScaleRoIAlign):
    """torchvision's `MultiScaleRoIAlign` (same arguments, levels and results) with `roi_align` per level.

    A drop-in for the ``box_roi_pool``/``mask_roi_pool`` of torchvision's `RoIHeads`; it has no weights, so
    checkpoints are unaffected.

    Args:
        featmap_names: the feature maps to pool from (FPN levels), as in torchvision.
        output_size: pooled size (int or (h, w)).
        sampling_ratio: bilinear samples per bin along each axis (> 0 enables the dense CPU path).
        canonical_scale: box size that maps to ``canonical_level`` (FPN paper's 224).
        canonical_level: FPN level of a ``canonical_scale`` box.
        dense_max_elements: largest intermediate computed densely per image and level; 0 always uses
            torchvision's kernel.
        aligned: RoIAlign's ``aligned`` (True: detectron2's ROIAlignV2, boxes shifted by -0.5 pixel in the
            map's coordinates and not enlarged to 1 pixel; False: torchvision's detection models).
        epsilon_inside_log: assign boxes to levels by detectron2's rule (`EpsilonInsideLogLevelMapper`)
            instead of torchvision's `LevelMapper`.
    """

    def __init__(
        self,
        featmap_names: list[str],
        output_size: int | Sequence[int],
        sampling_ratio: int,
        *,
        canonical_scale: int = 224,
        canonical_level: int = 4,
        dense_max_elements: int = DENSE_MAX_ELEMENTS,
        aligned: bool = False,
        epsilon_inside_log: bool = False,
    ) -> None:
        super().__init__(
            featmap_names, output_size, sampling_ratio,
            canonical_scale=canonical_scale, canonical_level=canonical_level,
        )  # fmt: skip
        self.dense_max_elements = int(dense_max_elements)
        self.aligned = bool(aligned)
        self.epsilon_inside_log = bool(epsilon_inside_log)

    def forward(
        self,
        x: dict[str, Tensor],
        boxes: list[Tensor],
        image_shapes: list[tuple[int, int]],
        *,
        every_level: bool = False,
    ) -> Tensor:
        """Pooled features of every box, [K, C, h, w] in the order of `boxes`; `every_level` pools every box
        from every level and keeps its own level's (L times the work, sizes that never depend on the data:
        for fixed-capacity exports)."""
        features = [x[name] for name in self.featmap_names]
        if self.scales is None or self.map_levels is None:
            self.scales, self.map_levels = _setup_scales(
                features, image_shapes, self.canonical_scale, self.canonical_level
            )
            if self.epsilon_inside_log:
                levels = self.map_levels
                self.map_levels = EpsilonInsideLogLevelMapper(
                    levels.k_min, levels.k_max, self.canonical_scale, self.canonical_level
                )
        if len(features) == 1:
            return self._pool(features[0], _convert_to_roi_format(boxes), self.scales[0])
        if every_level or torchvision._is_tracing() or torch.compiler.is_exporting():
            rois, levels = _convert_to_roi_format(boxes), self.map_levels(boxes)
            if every_level:
                return self._pool_every_level(features, rois, levels)
            return self._pool_levels_traceable(features, rois, levels)
        rois = _batch_rois(boxes)
        return self._pool_levels(features, rois, _level_of_rois(self.map_levels, rois))

    def _pool_levels(self, features: list[Tensor], rois: Tensor, levels: Tensor) -> Tensor:
        """Pools each level's RoIs as one slice of the RoIs sorted by level: one host read for all levels."""
        if rois.shape[0] == 0:  # nothing to sort and no count to read
            return self._pool(features[0], rois, self.scales[0]).to(features[0].dtype)
        # Stable: a level's RoIs keep their order, so each level pools the rows torch.where would give it
        # and the results (values and gradients) are those of the traceable path, bit for bit.
        order = torch.argsort(levels, stable=True)
        level_ids = torch.arange(len(features), device=levels.device)
        # Not torch.bincount: on CUDA it also reads the largest level from the device, a second host sync.
        counts = (levels[None, :] == level_ids[:, None]).sum(1).tolist()
        pooled = [
            self._pool(features[level], level_rois, self.scales[level]).to(features[0].dtype)
            for level, level_rois in enumerate(rois[order].split(counts))
            if counts[level] > 0  # an empty level adds no rows; skipping it saves a zero gradient of its map
        ]
        # The inverse permutation by one scatter (a second sort costs more kernels), then one gather.
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
        return torch.cat(pooled)[inverse]

    def _pool_levels_traceable(self, features: list[Tensor], rois: Tensor, levels: Tensor) -> Tensor:
        """Pools each level's RoIs found by one ``torch.where`` (a host sync) per level, for tracing and
        ``torch.export``.

        A trace records no RoI count here, so an exported model pools any number of RoIs per level, where
        `_pool_levels` would bake the example's counts into the trace (and ``torch.export`` would stop at
        its branch on them).
        """
        pooled, order = [], []
        for level, (feature, scale) in enumerate(zip(features, self.scales)):
            index = torch.where(levels == level)[0]
            pooled.append(self._pool(feature, rois[index], scale).to(features[0].dtype))
            order.append(index)
        # Back to the RoIs' order with one gather, not `result[index] = ...` per level: a trace (model
        # export) records that assignment with the example's shapes, and a level holding exactly one RoI
        # there bakes a [C, h, w] reshape that fails on any other count.
        return torch.cat(pooled)[torch.argsort(torch.cat(order))]

    def _pool_every_level(self, features: list[Tensor], rois: Tensor, levels: Tensor) -> Tensor:
        pooled = None
        for level, (feature, scale) in enumerate(zip(features, self.scales)):
            on_level = self._pool(feature, rois, scale).to(features[0].dtype)
            pooled = (
                on_level
                if pooled is None
                else torch.where((levels == level)[:, None, None, None], on_level, pooled)
            )
        return pooled

    def _pool(self, feature: Tensor, rois: Tensor, scale: float) -> Tensor:
        if (
            feature.dtype == torch.float64
        ):  # a float64 model's proposals are float32 (decoded as detectron2's)
            rois = rois.to(torch.float64)
        return roi_align(
            feature, rois, self.output_size, scale, self.sampling_ratio, self.aligned,
            dense_max_elements=self.dense_max_elements,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(featmap_names={self.featmap_names}, output_size={self.output_size}, "
            f"sampling_ratio={self.sampling_ratio}, dense_max_elements={self.dense_max_elements}, "
            f"aligned={self.aligned}, epsilon_inside_log={self.epsilon_inside_log})"
        )
