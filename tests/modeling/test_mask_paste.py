"""`paste_masks` against torchvision's per-detection loop."""

import pytest
import torch
from torchvision.models.detection.roi_heads import paste_masks_in_image

from lazytrain.modeling.mask_paste import paste_masks


@pytest.mark.parametrize("mask_size, image_shape", [(28, (96, 128)), (14, (50, 31))])
def test_paste_masks_matches_torchvision(mask_size, image_shape):
    generator = torch.Generator().manual_seed(0)
    height, width = image_shape
    count = 60
    masks = torch.rand(count, 1, mask_size, mask_size, generator=generator)
    corner = torch.rand(count, 2, generator=generator) * torch.tensor([width, height]) * 0.9
    size = torch.rand(count, 2, generator=generator) * torch.tensor([width, height]) * 0.6
    size[:5] = 0.3  # boxes smaller than a pixel
    boxes = torch.cat([corner, corner + size], dim=1)  # expanded by the padding, some cross the border
    boxes[-1] = torch.tensor([-20.0, -20.0, width + 20.0, height + 20.0])  # larger than the image
    expected = paste_masks_in_image(masks, boxes, image_shape)
    got = paste_masks(masks, boxes, image_shape)
    assert got.shape == expected.shape == (count, 1, height, width)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert expected.sum() > 0 and ((got > 0.5) == (expected > 0.5)).float().mean() > 0.9999


def test_paste_masks_of_no_detection_is_empty():
    assert paste_masks(torch.zeros(0, 1, 28, 28), torch.zeros(0, 4), (10, 12)).shape == (0, 1, 10, 12)
