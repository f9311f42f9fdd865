"""The image batch a detector's backbone sees: `NoResizeTransform` normalises the mapper's images and pads them
into one tensor, without resizing them (the mapper decided their size), and in training pads to fixed sizes
(`pad_to_sizes`) for a compiled backbone."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from lazytrain.modeling.host_values import round_up

__all__ = ["IMAGENET_PIXEL_MEAN", "IMAGENET_PIXEL_STD", "NoResizeTransform"]

# ImageNet statistics of RGB images on the 0-255 scale (torchvision's 0-1 values times 255).
IMAGENET_PIXEL_MEAN = (123.675, 116.28, 103.53)
IMAGENET_PIXEL_STD = (58.395, 57.12, 57.375)


class NoResizeTransform(GeneralizedRCNNTransform):
    """torchvision's detection transform minus the resize: normalise, then pad into one batch tensor.

    Args:
        pixel_mean: per-channel mean, on the scale of the images it receives (0-255 inside `RCNN`).
        pixel_std: per-channel standard deviation, same scale.
        size_divisible: the padded batch height and width are multiples of this (32 suits FPN strides).
        pad_to_sizes: (height, width) pairs, multiples of `size_divisible`; in training each batch is padded to
            the smallest of them (by area) that holds it, so that the backbone sees a few fixed shapes (what
            a compiled backbone and CUDA graphs need). None: padded to the batch's own size.
    """

    def __init__(
        self,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        size_divisible: int = 32,
        pad_to_sizes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        # min_size/max_size are unused: `resize` below is the identity.
        super().__init__(
            min_size=0, max_size=0, image_mean=list(pixel_mean), image_std=list(pixel_std),
            size_divisible=size_divisible,
        )  # fmt: skip
        self.pad_to_sizes = _check_pad_to_sizes(pad_to_sizes, size_divisible)

        # On the model's device, moved with it: torchvision's `normalize` builds them from Python lists for
        # every image, two host-to-device copies per image that each wait for the GPU's queue. Not persistent:
        # checkpoints keep torchvision's keys.
        self.register_buffer("pixel_mean", torch.tensor(self.image_mean).view(3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(self.image_std).view(3, 1, 1), persistent=False)

    def normalize(self, image: Tensor) -> Tensor:
        if not image.is_floating_point():
            raise TypeError(f"NoResizeTransform expects float images (0-255 scale); got {image.dtype}")
        return (image - self.pixel_mean.to(image.dtype)) / self.pixel_std.to(image.dtype)

    def resize(
        self, image: Tensor, target: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        return image, target

    def normalized_batch(self, images: list[Tensor], memory_format: torch.memory_format) -> ImageList:
        """`forward` without targets, for all images at once: the same batch, bit for bit, in `memory_format`.

        torchvision normalises each image (a float conversion, a subtraction, a division: three passes over
        it), then copies it into a zero-padded batch. Here each image is copied into a batch filled with the
        mean (the copy converts uint8 to float), and the batch is normalised in place: one copy per image and
        three operations in all. The padding comes out as (mean - mean) / std = 0, torchvision's zeros.

        Args:
            images: [3, H, W] uint8 or float images on the 0-255 scale (uint8 becomes float32).
            memory_format: of the batch (channels-last for the model's convolutions on a GPU).
        """
        dtype = images[0].dtype if images[0].is_floating_point() else torch.float32
        height, width = self._batch_size_for(images)
        batch = torch.empty(
            (len(images), 3, height, width), dtype=dtype, device=images[0].device, memory_format=memory_format
        )
        mean, std = self.pixel_mean.to(dtype), self.pixel_std.to(dtype)
        batch.copy_(mean.expand_as(batch))
        for slot, image in zip(batch, images):
            slot[:, : image.shape[-2], : image.shape[-1]].copy_(image)
        batch.sub_(mean).div_(std)
        return ImageList(batch, [(image.shape[-2], image.shape[-1]) for image in images])

    def _batch_size_for(self, images: list[Tensor]) -> tuple[int, int]:
        """`batch_images`' height and width: a size of `pad_to_sizes` in training, else the largest image's
        rounded up to `size_divisible`."""
        if self.training and self.pad_to_sizes:
            return self._fixed_size_for(images)
        height = max(image.shape[-2] for image in images)
        width = max(image.shape[-1] for image in images)
        return round_up(height, self.size_divisible), round_up(width, self.size_divisible)

    def batch_images(self, images: list[Tensor], size_divisible: int = 32) -> Tensor:
        """torchvision's padding into one batch; under ``torch.export`` with integer arithmetic on the sizes,
        which keeps them symbolic (torchvision's rounds through ``float`` and ``math.ceil``, which fixes an
        exported program to the example's image size). In training with `pad_to_sizes`, to one of those."""
        if self.training and self.pad_to_sizes:
            return _pad_batch(images, *self._fixed_size_for(images))
        if not torch.compiler.is_exporting():
            return super().batch_images(images, size_divisible)
        height = functools.reduce(torch.sym_max, [image.shape[-2] for image in images])
        width = functools.reduce(torch.sym_max, [image.shape[-1] for image in images])
        return _pad_batch(images, round_up(height, size_divisible), round_up(width, size_divisible))

    def _fixed_size_for(self, images: list[Tensor]) -> tuple[int, int]:
        height = max(image.shape[-2] for image in images)
        width = max(image.shape[-1] for image in images)
        for size in self.pad_to_sizes:  # smallest area first
            if size[0] >= height and size[1] >= width:
                return size
        raise ValueError(
            f"RCNN(pad_to_sizes={[list(size) for size in self.pad_to_sizes]}): a training batch has images up to "
            f"{height} x {width} px (height x width), which fit none of these sizes. Add a size that holds them "
            f"(model.pad_to_sizes=[..., [{round_up(height, self.size_divisible)}, "
            f"{round_up(width, self.size_divisible)}]]) or make the train mapper's images smaller."
        )

    def __repr__(self) -> str:
        fixed = f", pad_to_sizes={[list(size) for size in self.pad_to_sizes]}" if self.pad_to_sizes else ""
        return (
            f"{type(self).__name__}(mean={self.image_mean}, std={self.image_std}, "
            f"size_divisible={self.size_divisible}{fixed}, no resize)"
        )


def _pad_batch(images: list[Tensor], height: Any, width: Any) -> Tensor:
    return torch.stack(
        [F.pad(image, (0, width - image.shape[-1], 0, height - image.shape[-2])) for image in images]
    )


def _check_pad_to_sizes(
    sizes: Sequence[Sequence[int]] | None, size_divisible: int
) -> tuple[tuple[int, int], ...]:
    if sizes is None:
        return ()
    is_list = isinstance(sizes, Sequence) and not isinstance(sizes, str)
    pairs = [tuple(size) if isinstance(size, Sequence) else () for size in sizes] if is_list else []
    valid = bool(pairs) and all(
        len(pair) == 2
        and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 and v % size_divisible == 0 for v in pair
        )
        for pair in pairs
    )
    if not valid:
        raise ValueError(
            f"RCNN(pad_to_sizes=) must be a list of [height, width] pairs of positive multiples of "
            f"size_divisible={size_divisible}; got {sizes!r}. E.g. model.pad_to_sizes=[[1024,1024]] for "
            "large-scale jitter at 1024 px, or a few buckets such as [[800,1344],[1344,800],[1344,1344]]."
        )
    return tuple(sorted(pairs, key=lambda pair: (pair[0] * pair[1], pair)))
