"""Transforms: the mask resize gives the same bitmaps on every supported torchvision."""

import inspect

import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from lazytrain.data.transforms import ResizeTransform

# (height, width) -> (new_height, new_width): up, down, non-integer ratios both ways, one side unchanged.
SIZES = [
    pytest.param((4, 6), (9, 13), id="up"),
    pytest.param((12, 10), (5, 7), id="down"),
    pytest.param((7, 11), (10, 4), id="up-and-down"),
    pytest.param((8, 8), (8, 5), id="one-side"),
]


def random_masks(height, width, count=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(count, height, width, generator=generator) > 0.5).to(torch.uint8)


def test_mask_resize_samples_pixel_centres():
    # Values are source indices, so the output names which pixel each output pixel took. NEAREST_EXACT takes
    # source row/column floor((i + 0.5) * 2) = 1, 3, 5; NEAREST (what torchvision 0.26's resize_mask does)
    # would take 0, 2, 4, i.e. [[0, 2, 4], [12, 14, 16]].
    masks = torch.arange(24, dtype=torch.uint8).reshape(1, 4, 6)
    resized = ResizeTransform(4, 6, 2, 3).apply_masks(masks)
    assert resized.tolist() == [[[7, 9, 11], [19, 21, 23]]]
    assert resized.dtype == torch.uint8


@pytest.mark.parametrize("size,new_size", SIZES)
def test_mask_resize_equals_nearest_exact_interpolation(size, new_size):
    masks = random_masks(*size)
    expected = torch.nn.functional.interpolate(masks[None].float(), size=new_size, mode="nearest-exact")[0]
    resized = ResizeTransform(*size, *new_size).apply_masks(masks)
    assert resized.shape == (3, *new_size)
    assert torch.equal(resized, expected.to(torch.uint8))


@pytest.mark.skipif(
    "interpolation" not in inspect.signature(F.resize_mask).parameters,
    reason="this torchvision's resize_mask has no `interpolation` argument (pytorch/vision PR 9497)",
)
@pytest.mark.parametrize("size,new_size", SIZES)
def test_mask_resize_equals_torchvision_mask_kernel_where_it_takes_interpolation(size, new_size):
    masks = random_masks(*size, seed=1)
    expected = F.resize_mask(masks, list(new_size), interpolation=InterpolationMode.NEAREST_EXACT)
    assert torch.equal(ResizeTransform(*size, *new_size).apply_masks(masks), expected)


def test_resizing_no_masks_gives_no_masks_of_the_new_size():
    resized = ResizeTransform(4, 6, 8, 12).apply_masks(torch.zeros(0, 4, 6, dtype=torch.uint8))
    assert resized.shape == (0, 8, 12)
    assert resized.dtype == torch.uint8
