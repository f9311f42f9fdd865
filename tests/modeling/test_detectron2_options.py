"""The model options that give detectron2's detections, each against detectron2's formula written here from its
definition (detectron2 is not installable in CI; scripts/detectron2_parity.py runs its code)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torchvision.models.detection.image_list import ImageList
from torchvision.ops import roi_align as torchvision_roi_align

from lazytrain.modeling.anchors import AnchorGenerator
from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.box_selection import has_min_size, select_detections
from lazytrain.modeling.mask_paste import GridSampleMaskPaste, TorchvisionMaskPaste, paste_masks_continuous
from lazytrain.modeling.poolers import MultiScaleRoIAlign


def _detectron2_cell_anchors(size: float, ratios: list[float]) -> torch.Tensor:
    # detectron2: area = size^2; w = sqrt(area / ratio); h = ratio * w; box centred on the cell's origin.
    rows = []
    for ratio in ratios:
        w = math.sqrt(size**2 / ratio)
        h = ratio * w
        rows.append([-w / 2, -h / 2, w / 2, h / 2])
    return torch.tensor(rows)


def test_unrounded_anchors_with_fixed_strides_are_detectron2s_on_an_odd_p5_grid():
    sizes, ratios, strides = [32, 64, 128, 256, 512], [0.5, 1.0, 2.0], [4, 8, 16, 32, 64]
    generator = AnchorGenerator(
        [(s,) for s in sizes], [ratios] * 5, round_cell_anchors=False, strides=strides
    )
    height, width = 352, 544  # P5 11 x 17, P6 6 x 9: torchvision's stride for P6 would be 58 / 60
    grids = [(height // s, width // s) for s in strides[:4]] + [(6, 9)]
    maps = [torch.zeros(1, 1, *grid) for grid in grids]
    anchors = generator(ImageList(torch.zeros(1, 3, height, width), [(height, width)]), maps)[0]
    expected = []
    for size, stride, (grid_h, grid_w) in zip(sizes, strides, grids):
        # detectron2: shifts = arange(0, grid * stride, stride) (offset 0), anchors = shift + cell anchor.
        ys, xs = torch.meshgrid(
            torch.arange(0, grid_h * stride, stride, dtype=torch.float32),
            torch.arange(0, grid_w * stride, stride, dtype=torch.float32),
            indexing="ij",
        )
        shifts = torch.stack((xs.flatten(), ys.flatten()) * 2, dim=1)
        expected.append((shifts[:, None] + _detectron2_cell_anchors(size, ratios)[None]).reshape(-1, 4))
    assert torch.equal(anchors, torch.cat(expected))
    rounded = AnchorGenerator([(s,) for s in sizes], [ratios] * 5)  # the default: torchvision's, unchanged
    default = rounded(ImageList(torch.zeros(1, 3, height, width), [(height, width)]), maps)[0]
    assert not torch.equal(default, anchors) and default[0].tolist() == [-23.0, -11.0, 23.0, 11.0]


def test_stride_in_1x1_downsamples_in_the_first_1x1_conv_as_detectron2s_msra_resnet():
    backbone = build_resnet_fpn_backbone(50, stride_in_1x1=True, fold_frozen_bn=False).eval()
    block = backbone.body.layer2[0]
    assert block.conv1.stride == (2, 2) and block.conv2.stride == (1, 1)
    x = torch.randn(1, 256, 16, 16)
    with torch.no_grad():
        # detectron2's BottleneckBlock(stride_in_1x1=True): 1x1 conv with the stride, then the 3x3 with stride 1.
        out = F.relu(block.bn1(F.conv2d(x, block.conv1.weight, stride=2)))
        out = F.relu(block.bn2(F.conv2d(out, block.conv2.weight, stride=1, padding=1)))
        out = block.bn3(F.conv2d(out, block.conv3.weight))
        shortcut = block.downsample(x)
        assert torch.allclose(block(x), F.relu(out + shortcut), atol=1e-5)
    default = build_resnet_fpn_backbone(50).body.layer2[0]
    assert default.conv1.stride == (1, 1) and default.conv2.stride == (2, 2)
    with pytest.raises(ValueError, match="stride_in_1x1=True.*depth 50"):
        build_resnet_fpn_backbone(18, stride_in_1x1=True)


def _detectron2_levels(boxes: torch.Tensor) -> torch.Tensor:
    # detectron2's assign_boxes_to_levels: floor(4 + log2(sqrt(area) / 224 + 1e-8)), clamped to P2-P5.
    sizes = torch.sqrt((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
    return torch.clamp(torch.floor(4 + torch.log2(sizes / 224 + 1e-8)), 2, 5).long() - 2


def test_poolers_align_with_adaptive_sampling_and_detectron2s_level_rule():
    torch.manual_seed(0)
    features = {str(k): torch.randn(1, 2, 64 // 2**k, 96 // 2**k, dtype=torch.float64) for k in range(4)}
    # A box just below a level boundary (sqrt(area) = 112 * (1 - 1e-7)): torchvision's 1e-6 added to the log
    # lifts it to P3, detectron2's rule keeps it on P2.
    edge = 112 * (1 - 1e-7)
    boxes = torch.tensor(
        [[10.0, 10.0, 10.0 + edge, 10.0 + edge], [3.3, 4.1, 30.7, 60.2], [0.0, 0.0, 250.0, 250.0]],
        dtype=torch.float64,
    )
    pooler = MultiScaleRoIAlign(
        ["0", "1", "2", "3"], 7, sampling_ratio=0, aligned=True, epsilon_inside_log=True
    )
    pooled = pooler(features, [boxes], [(256, 384)])
    levels = _detectron2_levels(boxes)
    for index, level in enumerate(levels.tolist()):
        rois = torch.cat((torch.zeros(1, 1, dtype=torch.float64), boxes[index : index + 1]), dim=1)
        expected = torchvision_roi_align(
            features[str(level)], rois, 7, spatial_scale=1 / 4 / 2**level, sampling_ratio=0, aligned=True
        )
        assert torch.equal(pooled[index : index + 1], expected), index
    torchvision_rule = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, sampling_ratio=0, aligned=True)
    assert levels[0] == 0
    assert not torch.equal(torchvision_rule(features, [boxes], [(256, 384)])[0], pooled[0])


def _detectron2_paste(mask: torch.Tensor, box: list[float], height: int, width: int) -> torch.Tensor:
    # detectron2's _do_paste_mask: pixel centres normalised to the box's extent as (p + 0.5 - x0) / (x1 - x0) * 2
    # - 1, sampled by grid_sample(align_corners=False) with zero padding; kept where >= 0.5.
    x0, y0, x1, y1 = box
    ys = (torch.arange(height, dtype=torch.float32) + 0.5 - y0) / (y1 - y0) * 2 - 1
    xs = (torch.arange(width, dtype=torch.float32) + 0.5 - x0) / (x1 - x0) * 2 - 1
    grid = torch.stack((xs[None, :].expand(height, width), ys[:, None].expand(height, width)), dim=-1)[
        None
    ].to(mask.dtype)
    return F.grid_sample(mask[None, None], grid, align_corners=False)[0, 0]


def test_grid_sample_paste_is_detectron2s_and_the_torchvision_rule_differs():
    torch.manual_seed(0)
    masks = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    boxes = torch.tensor([[5.3, 7.9, 40.2, 30.6], [0.0, 0.0, 63.0, 47.0], [20.5, 3.25, 24.75, 9.5]])
    probabilities = paste_masks_continuous(masks, boxes, (48, 64))
    for index in range(3):
        expected = _detectron2_paste(masks[index, 0], boxes[index].tolist(), 48, 64)
        assert torch.allclose(probabilities[index, 0], expected, atol=1e-12), index
    binary = GridSampleMaskPaste()(masks, boxes, (48, 64), 0.5)
    assert torch.equal(binary, probabilities[:, 0] >= 0.5)
    torchvision_binary = TorchvisionMaskPaste()(masks, boxes, (48, 64), 0.5)
    assert (binary != torchvision_binary).sum() > 0  # the integer box and padding move the edges


def test_strict_min_size_drops_only_empty_boxes_as_detectron2s_nonempty():
    boxes = torch.tensor([[0.0, 0.0, 0.0, 5.0], [1.0, 1.0, 1.0005, 2.0], [1.0, 1.0, 3.0, 4.0]])
    # detectron2's Boxes.nonempty(threshold=0): width > 0 and height > 0.
    assert has_min_size(boxes, 0.0, strict=True).tolist() == [False, True, True]
    assert has_min_size(boxes, 1e-3).tolist() == [False, False, True]  # torchvision's rule, the default


def test_detection_min_size_zero_keeps_boxes_torchvision_drops():
    boxes = torch.zeros(1, 2, 4)
    boxes[0, 1] = torch.tensor([10.0, 10.0, 10.005, 20.0])  # 0.005 px wide: below torchvision's 0.01
    scores = torch.tensor([[0.1, 0.9]])
    kept = select_detections(
        boxes,
        scores,
        [torch.zeros(1, 4)],
        [(32, 32)],
        score_thresh=0.05,
        nms_thresh=0.5,
        detections_per_img=10,
    )
    assert kept[0][0].shape[0] == 0
    kept = select_detections(
        boxes, scores, [torch.zeros(1, 4)], [(32, 32)], score_thresh=0.05, nms_thresh=0.5,
        detections_per_img=10, min_size=0.0,
    )  # fmt: skip
    assert kept[0][0].shape[0] == 1
