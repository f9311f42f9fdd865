"""`AnchorGenerator`: torchvision's anchors bit for bit in float32, float32 under bfloat16 autocast (with the
box coder decoding in float32 too), computed once per size."""

import pytest
import torch
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.anchor_utils import AnchorGenerator as TorchvisionAnchorGenerator
from torchvision.models.detection.image_list import ImageList

from lazytrain.modeling import AnchorGenerator, anchors
from lazytrain.modeling.box_coding import BoxCoder
from lazytrain.utils.host_syncs import HostSyncCounter
from tests.modeling.helpers import R50_RECIPE, build_model, make_record

SIZES, RATIOS = [32, 64, 128, 256, 512], [0.5, 1.0, 2.0]


def _inputs(height: int, width: int, images: int = 2, dtype: torch.dtype = torch.float32):
    image_list = ImageList(torch.zeros(images, 3, height, width), [(height, width)] * images)
    maps = [torch.zeros(images, 8, -(-height // s), -(-width // s), dtype=dtype) for s in (4, 8, 16, 32, 64)]
    return image_list, maps


@pytest.mark.parametrize("size", [(800, 1344), (192, 160), (1024, 1024)])
def test_anchors_are_torchvisions_bit_for_bit_and_float32_for_bfloat16_maps(size):
    expected = TorchvisionAnchorGenerator(SIZES, RATIOS)(*_inputs(*size))
    generator = AnchorGenerator(SIZES, RATIOS)
    for dtype in (torch.float32, torch.bfloat16):
        got = generator(*_inputs(*size, dtype=dtype))
        assert len(got) == 2 and all(
            a.dtype == torch.float32 and torch.equal(a, e) for a, e in zip(got, expected)
        )
    rounded = TorchvisionAnchorGenerator(SIZES, RATIOS)(*_inputs(*size, dtype=torch.bfloat16))[0]
    assert rounded.dtype == torch.bfloat16 and not torch.equal(rounded.float(), expected[0])  # what it avoids


def test_anchors_are_made_once_per_size_and_the_least_recently_used_size_goes(monkeypatch):
    monkeypatch.setattr(anchors, "CACHED_SIZES", 2)
    generator = AnchorGenerator(SIZES, RATIOS)
    first = generator(*_inputs(128, 128))[0]
    with HostSyncCounter() as counter:
        again = generator(*_inputs(128, 128, images=3))
    assert counter.operation_total == 0 and all(a is first for a in again)
    generator(*_inputs(256, 128))
    generator(*_inputs(128, 128))  # used again: now the most recent
    generator(*_inputs(64, 64))  # evicts (256, 128)
    assert generator(*_inputs(128, 128))[0] is first
    assert [key[1] for key in generator._anchors] == [(64, 64), (128, 128)]


def test_bfloat16_codes_are_decoded_in_float32():
    generator = torch.Generator().manual_seed(0)
    boxes = torch.rand(50, 4, generator=generator) * 500 + 500
    boxes[:, 2:] += boxes[:, :2]
    codes = torch.randn(50, 8, generator=generator).to(torch.bfloat16)
    coder = BoxCoder((10.0, 10.0, 5.0, 5.0))
    decoded = coder.decode_single(codes, boxes)
    assert decoded.dtype == torch.float32
    assert torch.equal(
        decoded, det_utils.BoxCoder((10.0, 10.0, 5.0, 5.0)).decode_single(codes.float(), boxes)
    )


def test_under_bfloat16_autocast_the_models_anchors_proposals_and_boxes_stay_float32():
    torch.manual_seed(0)
    # A CPU without bf16 instructions emulates bfloat16 convolutions (tens of times slower than float32), and
    # the dtypes under test depend neither on the image size nor on the convolutions' widths: a 64 px image, 10
    # detections instead of 100, and the mask head (which runs per detection) 16 channels wide instead of 256.
    overrides = (
        "model.num_classes=5",
        "model.roi_heads.score_thresh=0.0",
        "model.roi_heads.detections_per_img=10",
        "model.roi_heads.mask_head.layers=[16,16,16,16]",
        "model.roi_heads.mask_predictor.in_channels=16",
        "model.roi_heads.mask_predictor.dim_reduced=16",
    )
    model = build_model(R50_RECIPE, overrides=overrides)
    assert type(model.rpn.anchor_generator) is AnchorGenerator
    seen = {}
    filter_proposals = model.rpn.filter_proposals

    def record(proposals, *args):
        seen["proposals"] = proposals.dtype
        return filter_proposals(proposals, *args)

    model.rpn.filter_proposals = record
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        boxes = model.eval()([make_record(64, 64, seed=0)])[0]["instances"]["boxes"]
    assert seen["proposals"] == torch.float32 and boxes.dtype == torch.float32 and len(boxes) > 0
