"""Augmentations: random policies that return deterministic geometric transforms.

An `Augmentation` looks at an image size and draws a `Transform`; the transform then applies the same
geometry to the image, the boxes, the masks and polygon vertices, so a mapper keeps them consistent. Images,
boxes and masks go through torchvision's transforms v2 kernels; polygon vertices are moved as continuous
coordinates (x -> width - x on a horizontal flip, like boxes; torchvision's KeyPoints flip uses pixel indices,
x -> width - 1 - x, which would shift polygons by one pixel against their boxes), so a mapper can rasterize
them once at the output size.

Randomness comes from Python's global `random` module, which the train loader re-seeds per sample, so a
resumed run draws the same augmentations. Plain torchvision v2 transforms (``v2.ColorJitter``,
``v2.RandomIoUCrop``, ...) may be listed among a mapper's augmentations too; they draw from torch's global RNG.
Both kinds are configured with plain values, e.g. ``L(ResizeShortestEdge)(short_edge_length=[640, 800])``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence

import numpy as np
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

__all__ = [
    "Augmentation",
    "CropTransform",
    "FixedSizeCrop",
    "FlipTransform",
    "PadTransform",
    "RandomFlip",
    "ResizeScale",
    "ResizeShortestEdge",
    "ResizeTransform",
    "Transform",
    "TransformList",
]


class Transform:
    """A deterministic geometric transform of an image of size (`height`, `width`)."""

    def __init__(self, height: int, width: int) -> None:
        self.height, self.width = height, width

    def output_size(self) -> tuple[int, int]:
        """(height, width) after the transform."""
        return self.height, self.width

    def apply_image(self, image: torch.Tensor) -> torch.Tensor:
        """Transform a uint8 image [C, H, W]."""
        raise NotImplementedError

    def apply_masks(self, masks: torch.Tensor) -> torch.Tensor:
        """Transform uint8 bitmaps [N, H, W] (nearest-neighbour when resampling)."""
        raise NotImplementedError

    def apply_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        """Transform float boxes [N, 4] in XYXY absolute coordinates."""
        raise NotImplementedError

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """Transform float points [P, 2] (x, y) in continuous pixel coordinates (polygon vertices)."""
        raise NotImplementedError


class ResizeTransform(Transform):
    """Resize from (`height`, `width`) to (`new_height`, `new_width`): bilinear with antialiasing for the image."""

    def __init__(self, height: int, width: int, new_height: int, new_width: int) -> None:
        super().__init__(height, width)
        self.new_height, self.new_width = new_height, new_width

    def output_size(self) -> tuple[int, int]:
        return self.new_height, self.new_width

    def apply_image(self, image: torch.Tensor) -> torch.Tensor:
        size = [self.new_height, self.new_width]
        return F.resize_image(image, size, interpolation=InterpolationMode.BILINEAR, antialias=True)

    def apply_masks(self, masks: torch.Tensor) -> torch.Tensor:
        if masks.shape[0] == 0:
            return masks.new_zeros((0, self.new_height, self.new_width))
        # torchvision 0.26 (the floor) has no `interpolation` argument in resize_mask (added by pytorch/vision
        # PR 9497) and resizes masks with NEAREST there, which samples at pixel corners and moves masks by half
        # an output pixel against boxes and polygons. resize_mask(interpolation=NEAREST_EXACT) only calls
        # resize_image, so calling that directly gives the same masks on every supported torchvision.
        size = [self.new_height, self.new_width]
        return F.resize_image(masks, size, interpolation=InterpolationMode.NEAREST_EXACT)

    def apply_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        size = [self.new_height, self.new_width]
        return F.resize_bounding_boxes(boxes, canvas_size=(self.height, self.width), size=size)[0]

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return coords * np.array([self.new_width / self.width, self.new_height / self.height])


class FlipTransform(Transform):
    """Mirror horizontally (x -> width - x) or vertically (y -> height - y)."""

    def __init__(self, height: int, width: int, horizontal: bool = True) -> None:
        super().__init__(height, width)
        self.horizontal = horizontal

    def apply_image(self, image: torch.Tensor) -> torch.Tensor:
        return F.horizontal_flip_image(image) if self.horizontal else F.vertical_flip_image(image)

    def apply_masks(self, masks: torch.Tensor) -> torch.Tensor:
        return F.horizontal_flip_mask(masks) if self.horizontal else F.vertical_flip_mask(masks)

    def apply_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        # by hand, in numpy: for the few boxes of one image torchvision's box flip costs more than the flip
        flipped = boxes.numpy()[:, [2, 1, 0, 3] if self.horizontal else [0, 3, 2, 1]].copy()
        axis, size = (slice(0, None, 2), self.width) if self.horizontal else (slice(1, None, 2), self.height)
        flipped[:, axis] = size - flipped[:, axis]
        return torch.from_numpy(flipped)

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        coords = coords.copy()
        if self.horizontal:
            coords[:, 0] = self.width - coords[:, 0]
        else:
            coords[:, 1] = self.height - coords[:, 1]
        return coords


class CropTransform(Transform):
    """Keep the window of `crop_height` x `crop_width` pixels whose top-left corner is (`x0`, `y0`).

    Boxes and polygon vertices are only shifted; the mapper clips boxes to the output and drops the instances
    left with an empty mask (``recompute_boxes=True`` makes boxes the extent of what stays visible).
    """

    def __init__(self, height: int, width: int, x0: int, y0: int, crop_height: int, crop_width: int) -> None:
        super().__init__(height, width)
        inside = 0 <= x0 <= width - crop_width and 0 <= y0 <= height - crop_height
        if not inside or min(crop_height, crop_width) <= 0:
            raise ValueError(
                f"CropTransform: window x0={x0}, y0={y0}, {crop_width}x{crop_height} must lie inside the "
                f"{width}x{height} image"
            )
        self.x0, self.y0, self.crop_height, self.crop_width = x0, y0, crop_height, crop_width

    def output_size(self) -> tuple[int, int]:
        return self.crop_height, self.crop_width

    def apply_image(self, image: torch.Tensor) -> torch.Tensor:
        return image[..., self.y0 : self.y0 + self.crop_height, self.x0 : self.x0 + self.crop_width]

    def apply_masks(self, masks: torch.Tensor) -> torch.Tensor:
        return self.apply_image(masks)

    def apply_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        return boxes - boxes.new_tensor([self.x0, self.y0, self.x0, self.y0])

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return coords - np.array([self.x0, self.y0])


class PadTransform(Transform):
    """Add `pad_bottom` rows and `pad_right` columns: the image filled with `value`, masks with 0."""

    def __init__(
        self, height: int, width: int, pad_bottom: int, pad_right: int, value: float = 128.0
    ) -> None:
        super().__init__(height, width)
        if pad_bottom < 0 or pad_right < 0:
            raise ValueError(f"PadTransform: pads must be >= 0; got bottom={pad_bottom}, right={pad_right}")
        self.pad_bottom, self.pad_right, self.value = pad_bottom, pad_right, value

    def output_size(self) -> tuple[int, int]:
        return self.height + self.pad_bottom, self.width + self.pad_right

    def apply_image(self, image: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(image, (0, self.pad_right, 0, self.pad_bottom), value=self.value)

    def apply_masks(self, masks: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(masks, (0, self.pad_right, 0, self.pad_bottom), value=0)

    def apply_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        return boxes

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return coords


class TransformList(Transform):
    """Several transforms applied in order, as one."""

    def __init__(self, transforms: Sequence[Transform]) -> None:
        if not transforms:
            raise ValueError("TransformList(transforms=) needs at least one transform; got none")
        super().__init__(transforms[0].height, transforms[0].width)
        self.transforms = list(transforms)

    def output_size(self) -> tuple[int, int]:
        return self.transforms[-1].output_size()

    def _apply_all(self, method: str, value):
        for transform in self.transforms:
            value = getattr(transform, method)(value)
        return value

    def apply_image(self, image: torch.Tensor) -> torch.Tensor:
        return self._apply_all("apply_image", image)

    def apply_masks(self, masks: torch.Tensor) -> torch.Tensor:
        return self._apply_all("apply_masks", masks)

    def apply_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        return self._apply_all("apply_boxes", boxes)

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        return self._apply_all("apply_coords", coords)


class Augmentation:
    """A random policy: `get_transform` draws a `Transform` for an image size (or None for "do nothing").

    Subclass it for a new geometric augmentation that keeps polygons as polygons; photometric changes that
    need no geometry can simply be torchvision v2 transforms in the mapper's list.
    """

    def get_transform(self, height: int, width: int) -> Transform | None:
        """Draw a transform for an image of size (`height`, `width`), using Python's global `random`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({arguments})"


class ResizeShortestEdge(Augmentation):
    """Resize so the short edge has a drawn length, keeping the aspect ratio, with the long edge at most `max_size`.

    Args:
        short_edge_length: one length, or several: ``sample_style="choice"`` picks one of them uniformly,
            ``"range"`` draws an integer uniformly from ``[min, max]`` (give exactly two values).
        max_size: upper bound of the long edge (the short edge is then shorter than drawn).
        sample_style: "choice" or "range".
    """

    def __init__(
        self,
        short_edge_length: int | Sequence[int],
        max_size: int = sys.maxsize,
        sample_style: str = "choice",
    ) -> None:
        lengths = (
            [short_edge_length] if isinstance(short_edge_length, int) else [int(v) for v in short_edge_length]
        )
        if sample_style not in ("choice", "range"):
            raise ValueError(
                f"ResizeShortestEdge(sample_style=) must be 'choice' or 'range'; got {sample_style!r}"
            )
        if sample_style == "range" and (len(lengths) != 2 or lengths[0] > lengths[1]):
            raise ValueError(
                f"ResizeShortestEdge(short_edge_length=) must be [min, max] with sample_style='range'; got {lengths}"
            )
        if not lengths or min(lengths) <= 0 or max_size <= 0:
            raise ValueError(
                "ResizeShortestEdge(short_edge_length=, max_size=) must be positive; "
                f"got {short_edge_length!r}, {max_size!r}"
            )
        self.short_edge_length, self.max_size, self.sample_style = lengths, max_size, sample_style

    def get_transform(self, height: int, width: int) -> ResizeTransform:
        if self.sample_style == "range":
            size = random.randint(self.short_edge_length[0], self.short_edge_length[1])
        else:
            size = random.choice(self.short_edge_length)
        scale = size / min(height, width)
        if max(height, width) * scale > self.max_size:
            scale = self.max_size / max(height, width)
        new_height, new_width = max(1, int(height * scale + 0.5)), max(1, int(width * scale + 0.5))
        return ResizeTransform(height, width, new_height, new_width)


class RandomFlip(Augmentation):
    """Flip with probability `prob`, horizontally (default) or vertically.

    Args:
        prob: probability of flipping.
        horizontal: mirror left-right.
        vertical: mirror top-bottom (set ``horizontal=False``); use two RandomFlips for both.
    """

    def __init__(self, prob: float = 0.5, *, horizontal: bool = True, vertical: bool = False) -> None:
        if horizontal == vertical:
            raise ValueError(
                f"RandomFlip(horizontal=, vertical=): choose exactly one; got horizontal={horizontal}, "
                f"vertical={vertical}"
            )
        if not 0 <= prob <= 1:
            raise ValueError(f"RandomFlip(prob=) must be in [0, 1]; got {prob}")
        self.prob, self.horizontal, self.vertical = prob, horizontal, vertical

    def get_transform(self, height: int, width: int) -> FlipTransform | None:
        if random.random() < self.prob:
            return FlipTransform(height, width, horizontal=self.horizontal)
        return None


class ResizeScale(Augmentation):
    """Resize by a random factor of a target size, keeping the aspect ratio: the image is scaled to fit in
    ``scale * (target_height, target_width)`` with `scale` drawn uniformly from [`min_scale`, `max_scale`].

    Followed by `FixedSizeCrop` this is large-scale jitter (LSJ; detectron2's ``ResizeScale`` and the
    ViTDet/new-baselines recipes use min_scale=0.1, max_scale=2.0 at 1024 x 1024).
    """

    def __init__(self, min_scale: float, max_scale: float, target_height: int, target_width: int) -> None:
        if not 0 < min_scale <= max_scale:
            raise ValueError(
                f"ResizeScale(min_scale=, max_scale=) must satisfy 0 < min_scale <= max_scale; got {min_scale}, "
                f"{max_scale}"
            )
        if target_height <= 0 or target_width <= 0:
            raise ValueError(
                f"ResizeScale(target_height=, target_width=) must be positive; got {target_height}, {target_width}"
            )
        self.min_scale, self.max_scale = min_scale, max_scale
        self.target_height, self.target_width = target_height, target_width

    def get_transform(self, height: int, width: int) -> ResizeTransform:
        scale = random.uniform(self.min_scale, self.max_scale)
        factor = min(scale * self.target_height / height, scale * self.target_width / width)
        new_height, new_width = max(1, round(height * factor)), max(1, round(width * factor))
        return ResizeTransform(height, width, new_height, new_width)


class FixedSizeCrop(Augmentation):
    """Make every image `crop_size` (height, width): a random window where the image is larger, then padding
    at the bottom and right where it is smaller (with `pad`; the image filled with `pad_value`, masks with 0).

    Instances outside the window are dropped by the mapper; use ``DatasetMapper(recompute_boxes=True)`` so
    boxes of cut instances fit their visible part.
    """

    def __init__(self, crop_size: Sequence[int], pad: bool = True, pad_value: float = 128.0) -> None:
        size = tuple(int(v) for v in crop_size)
        if len(size) != 2 or min(size) <= 0:
            raise ValueError(
                f"FixedSizeCrop(crop_size=) must be (height, width), both positive; got {crop_size!r}"
            )
        self.crop_size, self.pad, self.pad_value = size, pad, pad_value

    def get_transform(self, height: int, width: int) -> Transform | None:
        crop_height, crop_width = min(height, self.crop_size[0]), min(width, self.crop_size[1])
        transforms: list[Transform] = []
        if (crop_height, crop_width) != (height, width):
            x0 = random.randint(0, width - crop_width)
            y0 = random.randint(0, height - crop_height)
            transforms.append(CropTransform(height, width, x0, y0, crop_height, crop_width))
        pad_bottom, pad_right = self.crop_size[0] - crop_height, self.crop_size[1] - crop_width
        if self.pad and (pad_bottom or pad_right):
            transforms.append(PadTransform(crop_height, crop_width, pad_bottom, pad_right, self.pad_value))
        if not transforms:
            return None
        return transforms[0] if len(transforms) == 1 else TransformList(transforms)
