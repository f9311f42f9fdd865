"""lazytrain's dense RoIAlign and multi-level pooler against torchvision's: same values and gradients, same
pooled boxes, one host sync per multi-level call."""

from collections import OrderedDict

import pytest
import torch
from pytest import param
from torchvision.ops import MultiScaleRoIAlign as TorchvisionMultiScaleRoIAlign
from torchvision.ops import roi_align as torchvision_roi_align
from torchvision.ops.poolers import LevelMapper, _convert_to_roi_format

from lazytrain.modeling.poolers import (
    DENSE_MAX_ELEMENTS,
    MultiScaleRoIAlign,
    _batch_rois,
    _level_of_rois,
    roi_align,
    roi_align_dense,
)
from lazytrain.utils.host_syncs import TO_HOST, HostSyncCounter


def random_rois(num_images: int, count: int, image_size: float, generator: torch.Generator) -> torch.Tensor:
    """Boxes of every kind: inside, crossing and beyond the border, thinner than a pixel."""
    corner = torch.rand(count, 2, generator=generator) * image_size * 1.2 - 0.1 * image_size
    size = torch.rand(count, 2, generator=generator) * image_size * 0.5
    size[: count // 8] *= 0.01  # sub-pixel boxes (torchvision stretches them to 1 pixel unless aligned)
    image = torch.randint(0, num_images, (count, 1), generator=generator).float()
    return torch.cat([image, corner, corner + size], dim=1)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("output_size, sampling_ratio", [(7, 2), ((14, 10), 3)])
def test_roi_align_dense_matches_torchvision(aligned, channels_last, output_size, sampling_ratio):
    generator = torch.Generator().manual_seed(0)
    feature = torch.randn(3, 8, 24, 20, generator=generator, dtype=torch.float64)
    if channels_last:
        feature = feature.contiguous(memory_format=torch.channels_last)
    feature.requires_grad_(True)
    rois = random_rois(3, 64, 96.0, generator).double()
    expected = torchvision_roi_align(feature, rois, output_size, 0.25, sampling_ratio, aligned)
    got = roi_align_dense(feature, rois, output_size, 0.25, sampling_ratio, aligned)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    upstream = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    (expected_grad,) = torch.autograd.grad(expected, feature, upstream)
    (got_grad,) = torch.autograd.grad(got, feature, upstream)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-9, atol=1e-9)


def test_roi_align_dense_rejects_adaptive_sampling():
    with pytest.raises(ValueError, match="sampling_ratio"):
        roi_align_dense(torch.zeros(1, 1, 4, 4), torch.zeros(1, 5), 2, 1.0, 0)


def test_roi_align_uses_torchvision_in_inference_and_above_the_size_limit(monkeypatch):
    calls = []
    import lazytrain.modeling.poolers as poolers

    monkeypatch.setattr(poolers, "roi_align_dense", lambda *args: calls.append("dense"))
    feature, rois = torch.randn(1, 4, 8, 8, requires_grad=True), torch.tensor([[0.0, 1.0, 1.0, 6.0, 6.0]])
    expected = torchvision_roi_align(feature, rois, 2, 1.0, 2)
    torch.testing.assert_close(roi_align(feature, rois, 2, 1.0, 2, dense_max_elements=0), expected)
    torch.testing.assert_close(
        roi_align(feature, rois, 2, 1.0, -1), torchvision_roi_align(feature, rois, 2, 1.0, -1)
    )
    assert calls == []
    with torch.no_grad():  # inference: torchvision's forward kernel is the faster one
        roi_align(feature, rois, 2, 1.0, 2)
    assert calls == []
    roi_align(feature, rois, 2, 1.0, 2)
    assert calls == ["dense"]


def test_multiscale_roi_align_matches_torchvision_on_fpn_levels():
    generator = torch.Generator().manual_seed(1)
    features = OrderedDict(
        (name, torch.randn(2, 16, 64 // 2**i, 48 // 2**i, generator=generator, requires_grad=True))
        for i, name in enumerate("0123")
    )
    features["pool"] = torch.randn(2, 16, 2, 2, generator=generator)  # filtered out by featmap_names
    boxes = [random_rois(1, 40, 180.0, generator)[:, 1:].clamp(0, 190) for _ in range(2)]
    boxes = [torch.cat([b[:, :2], torch.maximum(b[:, 2:], b[:, :2] + 1)], dim=1) for b in boxes]
    image_shapes = [(256, 192), (256, 192)]
    ours = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    reference = TorchvisionMultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    expected = reference(features, boxes, image_shapes)
    got = ours(features, boxes, image_shapes)  # features require grad: the dense path
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), features["0"])
    (got_grad,) = torch.autograd.grad(got.square().sum(), features["0"])
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-4, atol=1e-4)
    assert ours.scales == reference.scales and expected.abs().sum() > 0
    assert "dense_max_elements" in repr(ours)


def _square_boxes(sides: list[float]) -> torch.Tensor:
    """Boxes at (10, 10) with these sides; a side s lands on FPN level floor(4 + log2(s / 224)), clamped."""
    sides = torch.tensor(sides)[:, None]
    return torch.cat([torch.full_like(sides, 10.0).expand(-1, 2), 10.0 + sides.expand(-1, 2)], dim=1)


# torchvision's level mapping warns that it freezes its scales: they are constants of the FPN.
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning:torchvision")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning:torch")
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.trace` is deprecated")  # torch's notice, expected here
def test_multiscale_roi_align_traces_with_any_number_of_boxes_per_level():
    # A trace (model export) must not freeze the example's RoI counts per level: here the example has one
    # RoI on the second level and none on the last, the other call the reverse.
    generator = torch.Generator().manual_seed(2)
    features = OrderedDict(
        (name, torch.randn(1, 8, 128 // 2**i, 128 // 2**i, generator=generator))
        for i, name in enumerate("0123")
    )
    pool = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    example = _square_boxes([50.0, 60.0, 150.0, 300.0])  # levels 0, 0, 1, 2
    other = _square_boxes([160.0, 500.0, 200.0])  # levels 1, 3, 1
    traced = torch.jit.trace(
        lambda x, boxes: pool(x, [boxes], [(512, 512)]), (features, example), check_trace=False
    )
    for boxes in (example, other, other[:0]):
        torch.testing.assert_close(
            traced(features, boxes), pool(features, [boxes], [(512, 512)]), rtol=0, atol=0
        )
    assert pool.map_levels([other]).tolist() == [1, 3, 1]


FPN_NAMES = ["0", "1", "2", "3"]
IMAGE_SIZE = 640


def _fpn_features(num_images: int, dtype: torch.dtype, generator: torch.Generator) -> OrderedDict:
    """Strides 4 to 32 on a 640 px image, 4 channels."""
    return OrderedDict(
        (name, torch.randn(num_images, 4, 160 // 2**i, 160 // 2**i, generator=generator, dtype=dtype))
        for i, name in enumerate(FPN_NAMES)
    )


def _boxes_on_levels(levels: list[int], generator: torch.Generator) -> torch.Tensor:
    """Boxes anywhere on the image with sqrt(area) in [56, 112) * 2**level: FPN level ``level`` (0 to 3)."""
    count = len(levels)
    side = 56.0 * 2.0 ** torch.tensor(levels, dtype=torch.float64)
    side = side * (1.05 + 0.9 * torch.rand(count, generator=generator, dtype=torch.float64))
    aspect = 0.7 + 0.7 * torch.rand(count, generator=generator, dtype=torch.float64)
    size = torch.stack([side * aspect, side / aspect], dim=1)
    corner = torch.rand(count, 2, generator=generator, dtype=torch.float64) * (IMAGE_SIZE - size).clamp(min=0)
    return torch.cat([corner, corner + size], dim=1)


def _pool_and_grad(pool, features: OrderedDict, boxes: list[torch.Tensor], upstream_seed: int = 3):
    # Maps that need gradients, as in training: the dense CPU path pools only then.
    for feature in features.values():
        feature.requires_grad_(True)
    pooled = pool(features, boxes, [(IMAGE_SIZE, IMAGE_SIZE)] * len(boxes))
    upstream = torch.randn(pooled.shape, generator=torch.Generator().manual_seed(upstream_seed))
    # A level without RoIs gets no gradient from lazytrain's pooler (it skips the level) and zeros from
    # torchvision's: the same numbers.
    grads = torch.autograd.grad(
        pooled, list(features.values()), upstream.to(pooled.dtype), materialize_grads=True
    )
    return pooled, grads


# The FPN level of each box, per image.
LEVEL_CASES = [
    param([[], []], id="no RoIs"),
    param([[0, 3, 1, 0, 3], [1, 1, 0]], id="a level without RoIs"),
    param([[2, 2, 2], [2, 2]], id="all RoIs on one level"),
    param([[3, 0], [2, 1]], id="one RoI per level"),
    param([[0, 1, 2, 3, 1], [], [3, 3, 0, 2]], id="an image without boxes"),
    param([[1], [3]], id="one RoI per image"),
    param([[0, 1, 2, 3, 2, 1, 0, 3, 3, 1] * 3, [2, 0, 1, 3] * 5], id="mixed"),
]


@pytest.mark.parametrize("dense_max_elements", [0, DENSE_MAX_ELEMENTS], ids=["torchvision kernel", "dense"])
@pytest.mark.parametrize("levels", LEVEL_CASES)
def test_multiscale_roi_align_matches_torchvision_for_any_rois_per_level(levels, dense_max_elements):
    generator = torch.Generator().manual_seed(4)
    features = _fpn_features(len(levels), torch.float64, generator)
    boxes = [_boxes_on_levels(image_levels, generator) for image_levels in levels]
    pool = MultiScaleRoIAlign(FPN_NAMES, 7, 2, dense_max_elements=dense_max_elements)
    reference = TorchvisionMultiScaleRoIAlign(FPN_NAMES, 7, 2)
    got, got_grads = _pool_and_grad(pool, features, boxes)
    expected, expected_grads = _pool_and_grad(reference, features, boxes)
    assert pool.map_levels(boxes).tolist() == sum(levels, [])
    assert got.shape == expected.shape == (sum(map(len, levels)), 4, 7, 7) and got.dtype == expected.dtype
    exact = dense_max_elements == 0  # the same kernel on the same rows, in the same order
    tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-9, "atol": 1e-9}
    torch.testing.assert_close(got, expected, **tolerance)
    for got_grad, expected_grad in zip(got_grads, expected_grads):
        torch.testing.assert_close(got_grad, expected_grad, **tolerance)
    # The per-level torch.where path (the one traces take, and this pooler before the level sort): bit for bit.
    pool._pool_levels = pool._pool_levels_traceable
    before, before_grads = _pool_and_grad(pool, features, boxes)
    torch.testing.assert_close(got, before, rtol=0, atol=0)
    for got_grad, before_grad in zip(got_grads, before_grads):
        torch.testing.assert_close(got_grad, before_grad, rtol=0, atol=0)


BF16, FP32 = torch.bfloat16, torch.float32


# The dense path under autocast needs bfloat16 maps: its matrix products give bfloat16, which it cannot put
# into a float32 result (an error before and after the level sort).
@pytest.mark.parametrize(
    "level_dtypes, dense_max_elements",
    [
        param([FP32] * 4, 0, id="float32 maps"),
        param([BF16] * 4, 0, id="bfloat16 maps"),
        param([BF16, BF16, BF16, FP32], 0, id="a float32 level after bfloat16 ones"),
        param([BF16] * 4, DENSE_MAX_ELEMENTS, id="bfloat16 maps, dense"),
    ],
)
def test_multiscale_roi_align_under_autocast_keeps_the_per_level_dtype_and_values(
    level_dtypes, dense_max_elements
):
    # torchvision's roi_align pools each level in float32 under autocast and casts back to the level's
    # dtype; the pooler casts every level to the first level's: the sorted path must keep both.
    generator = torch.Generator().manual_seed(5)
    features = _fpn_features(2, FP32, generator)
    features = OrderedDict(
        (name, feature.to(dtype)) for (name, feature), dtype in zip(features.items(), level_dtypes)
    )
    boxes = [_boxes_on_levels(levels, generator).float() for levels in ([0, 1, 2, 3, 3, 0], [2, 3, 1])]
    pool = MultiScaleRoIAlign(FPN_NAMES, 7, 2, dense_max_elements=dense_max_elements)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, got_grads = _pool_and_grad(pool, features, boxes)
        pool._pool_levels = pool._pool_levels_traceable  # the pooler before the level sort
        before, before_grads = _pool_and_grad(pool, features, boxes)
        expected, _ = _pool_and_grad(TorchvisionMultiScaleRoIAlign(FPN_NAMES, 7, 2), features, boxes)
    assert got.dtype == before.dtype == expected.dtype == level_dtypes[0]
    torch.testing.assert_close(got, before, rtol=0, atol=0)
    for got_grad, before_grad in zip(got_grads, before_grads):
        assert got_grad.dtype == before_grad.dtype
        torch.testing.assert_close(got_grad, before_grad, rtol=0, atol=0)
    if dense_max_elements == 0:  # torchvision's kernel, as in torchvision's pooler
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "levels, expected",
    [
        param([[0, 1, 2, 3, 1, 0], [3, 2, 0]], {TO_HOST: 1}, id="RoIs on every level"),
        param([[2, 2], [2]], {TO_HOST: 1}, id="RoIs on one level"),
        param([[], []], {}, id="no RoIs"),
    ],
)
def test_multiscale_roi_align_reads_the_device_once_per_call(levels, expected):
    # One host read (the RoI counts per level) for all levels, forward and backward; per-level torch.where
    # made it one nonzero per level (4 here).
    generator = torch.Generator().manual_seed(6)
    features = _fpn_features(2, torch.float32, generator)
    boxes = [_boxes_on_levels(image_levels, generator).float() for image_levels in levels]
    pool = MultiScaleRoIAlign(FPN_NAMES, 7, 2, dense_max_elements=0)
    _pool_and_grad(pool, features, boxes)  # the first call sets up the scales (host reads of sizes)
    with HostSyncCounter() as counter:
        _pool_and_grad(pool, features, boxes)
    assert dict(counter.counts) == expected


def test_rois_and_levels_of_a_batch_are_torchvisions_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(40, 2, generator=generator) * 300
    sizes = 2 ** (torch.rand(40, 2, generator=generator) * 9 + 1)  # 2 to 1024 px: every level
    boxes = torch.cat((corners, corners + sizes), dim=1)
    per_image = [boxes[:15], boxes[15:15], boxes[15:39], boxes[39:]]  # one image without boxes
    mapper = LevelMapper(2, 5)
    rois = _batch_rois(per_image)
    assert torch.equal(rois, _convert_to_roi_format(per_image))
    levels = _level_of_rois(mapper, rois)
    assert torch.equal(levels, mapper(per_image)) and len(levels.unique()) == 4
