"""lazytrain's `BoxCoder` (x and y as column pairs, no tensors from Python numbers) gives torchvision's codes
and boxes bit for bit, with equal and unequal weight pairs, for class-specific codes too."""

import pytest
import torch
from pytest import param
from torchvision.models.detection import _utils as det_utils
from torchvision.ops import clip_boxes_to_image

from lazytrain.modeling.box_coding import BoxCoder, clip_to_image_sizes
from lazytrain.utils.host_syncs import HostSyncCounter


def _boxes(generator: torch.Generator, count: int, dtype: torch.dtype) -> torch.Tensor:
    corners = torch.rand(count, 2, generator=generator, dtype=dtype) * 900
    return torch.cat((corners, corners + torch.rand(count, 2, generator=generator, dtype=dtype) * 300 + 1), 1)


@pytest.mark.parametrize(
    "weights",
    [
        param((1.0, 1.0, 1.0, 1.0), id="RPN"),
        param((10.0, 10.0, 5.0, 5.0), id="RoI"),
        param((1.0, 2.0, 3.0, 4.0)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_codes_and_boxes_are_torchvisions_bit_for_bit(weights, dtype):
    generator = torch.Generator().manual_seed(0)
    reference, proposals = _boxes(generator, 300, dtype), _boxes(generator, 300, dtype)
    coder, expected = BoxCoder(weights), det_utils.BoxCoder(weights)
    with HostSyncCounter() as counter:
        codes = coder.encode_single(reference, proposals)
    assert counter.total == 0 and torch.equal(codes, expected.encode_single(reference, proposals))
    deltas = torch.randn(300, 4 * 7, generator=generator, dtype=dtype)  # 7 classes' codes per box
    with HostSyncCounter() as counter:
        boxes = coder.decode_single(deltas, proposals)
    assert counter.total == 0 and torch.equal(boxes, expected.decode_single(deltas, proposals))


def test_boxes_are_clipped_to_their_own_images_as_torchvision_clips_one():
    generator = torch.Generator().manual_seed(1)
    boxes = torch.rand(3, 20, 4, generator=generator) * 300 - 50
    sizes = [(100, 200), (250, 80), (60, 60)]
    clipped = clip_to_image_sizes(boxes, torch.tensor(sizes, dtype=boxes.dtype))
    for image, size in enumerate(sizes):
        assert torch.equal(clipped[image], clip_boxes_to_image(boxes[image], size))
