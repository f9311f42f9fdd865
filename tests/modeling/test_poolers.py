"""lazytrain's dense RoIAlign against torchvision's kernel: same values and gradients, same pooled boxes."""

from collections import OrderedDict

import pytest
import torch
from torchvision.ops import MultiScaleRoIAlign as TorchvisionMultiScaleRoIAlign
from torchvision.ops import roi_align as torchvision_roi_align

from lazytrain.modeling.poolers import MultiScaleRoIAlign, roi_align, roi_align_dense


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
