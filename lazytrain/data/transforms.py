"""Augmentations (random policies) and the deterministic transforms they produce.

An augmentation looks at an image size and returns a transform; the transform then applies the same
geometry to the image, boxes, polygon coordinates and bitmap masks. Polygons are transformed as
coordinates and rasterized once at the end (cheap for images with hundreds of instances); RLE masks are
transformed as bitmaps. Randomness comes from Python's global `random` module, which the train loader
re-seeds per sample (so a resumed run draws the same augmentations).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
from PIL import Image

__all__ = [
    "Augmentation",
    "FlipTransform",
    "RandomFlip",
    "ResizeShortestEdge",
    "ResizeTransform",
    "Transform",
]


class Transform:
    """A deterministic geometric transform of an image of a known size."""

    def apply_image(self, image: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """Transform float points [N, 2] (x, y)."""
        raise NotImplementedError

    def apply_mask(self, mask: np.ndarray) -> np.ndarray:
        """Transform a uint8 bitmap [H, W]."""
        raise NotImplementedError

    def apply_box(self, boxes: np.ndarray) -> np.ndarray:
        """Transform XYXY boxes [N, 4] (via their corners; exact for flips and resizes)."""
        if len(boxes) == 0:
            return boxes
        corners = boxes[:, [0, 1, 2, 1, 0, 3, 2, 3]].reshape(-1, 2)
        corners = self.apply_coords(corners).reshape(-1, 4, 2)
        return np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)


class ResizeTransform(Transform):
    """Resize from (height, width) to (new_height, new_width)."""

    def __init__(self, height: int, width: int, new_height: int, new_width: int) -> None:
        self.height, self.width, self.new_height, self.new_width = height, width, new_height, new_width

    def apply_image(self, image: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(image).resize((self.new_width, self.new_height), Image.BILINEAR))

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        scale = np.array([self.new_width / self.width, self.new_height / self.height])
        return coords * scale

    def apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(mask).resize((self.new_width, self.new_height), Image.NEAREST))


class FlipTransform(Transform):
    """Mirror horizontally (x -> width - x) or vertically (y -> height - y)."""

    def __init__(self, height: int, width: int, horizontal: bool = True) -> None:
        self.height, self.width, self.horizontal = height, width, horizontal

    def apply_image(self, image: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(image[:, ::-1] if self.horizontal else image[::-1])

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        coords = coords.copy()
        if self.horizontal:
            coords[:, 0] = self.width - coords[:, 0]
        else:
            coords[:, 1] = self.height - coords[:, 1]
        return coords

    def apply_mask(self, mask: np.ndarray) -> np.ndarray:
        return self.apply_image(mask)


class Augmentation:
    """A random policy: ``get_transform(height, width)`` returns a `Transform` (or None for no-op)."""

    def get_transform(self, height: int, width: int) -> Transform | None:
        raise NotImplementedError


class ResizeShortestEdge(Augmentation):
    """Resize so the short edge is a chosen length, capping the long edge at `max_size`.

    Args:
        short_edge_length: one length, or candidates: ``sample_style="choice"`` picks one of them,
            ``"range"`` draws uniformly from ``[min, max]``.
        max_size: upper bound of the long edge.
        sample_style: "choice" or "range".
    """

    def __init__(
        self, short_edge_length: int | Sequence[int], max_size: int = 10**9, sample_style: str = "choice"
    ) -> None:
        lengths = [short_edge_length] if isinstance(short_edge_length, int) else list(short_edge_length)
        if sample_style not in ("choice", "range"):
            raise ValueError(
                f"ResizeShortestEdge(sample_style=) must be 'choice' or 'range'; got {sample_style!r}"
            )
        if sample_style == "range" and len(lengths) != 2:
            raise ValueError(
                f"ResizeShortestEdge(short_edge_length=) needs [min, max] with sample_style='range'; got {lengths}"
            )
        if not lengths or min(lengths) <= 0:
            raise ValueError(f"ResizeShortestEdge(short_edge_length=) must be positive; got {lengths}")
        self.lengths, self.max_size, self.sample_style = lengths, max_size, sample_style

    def get_transform(self, height: int, width: int) -> Transform:
        if self.sample_style == "range":
            size = random.randint(self.lengths[0], self.lengths[1])
        else:
            size = random.choice(self.lengths)
        scale = size / min(height, width)
        if max(height, width) * scale > self.max_size:
            scale = self.max_size / max(height, width)
        new_height, new_width = int(height * scale + 0.5), int(width * scale + 0.5)
        return ResizeTransform(height, width, new_height, new_width)


class RandomFlip(Augmentation):
    """Flip with probability `prob`, horizontally (default) or vertically."""

    def __init__(self, prob: float = 0.5, *, horizontal: bool = True, vertical: bool = False) -> None:
        if horizontal == vertical:
            raise ValueError("RandomFlip: choose exactly one of horizontal=True or vertical=True")
        if not 0 <= prob <= 1:
            raise ValueError(f"RandomFlip(prob=) must be in [0, 1]; got {prob}")
        self.prob, self.horizontal = prob, horizontal

    def get_transform(self, height: int, width: int) -> Transform | None:
        if random.random() < self.prob:
            return FlipTransform(height, width, horizontal=self.horizontal)
        return None
