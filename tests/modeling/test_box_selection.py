"""Selecting scored boxes (`lazytrain.modeling.box_selection`): the RoI heads' detections for the batch at once
equal torchvision's steps image by image, with one host read; the image-by-image path (tracing, export) too."""

from unittest import mock

import pytest
import torch
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.box_selection import has_min_size, nms_in_image, select_detections
from lazytrain.utils.host_syncs import TO_HOST, HostSyncCounter

PER_IMAGE = [12, 0, 9]  # an image without RoIs
SHAPES = [(100, 120), (80, 80), (60, 90)]
SETTINGS = {"nms_thresh": 0.5, "detections_per_img": 7}


def _scored_boxes(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Decoded boxes [R, K+1, 4] and scores [R, K+1] of the RoIs of `PER_IMAGE`, some outside their image
    and some too narrow once clipped."""
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(21, 6, 2, generator=generator) * 130 - 10
    sizes = torch.rand(21, 6, 2, generator=generator) * 40
    sizes[::4, :, 0] = 0.001
    boxes = torch.cat((corners, corners + sizes), dim=2)
    scores = torch.randn(21, 6, generator=generator).mul(3).softmax(dim=1)
    return boxes, scores, [torch.zeros(count, 4) for count in PER_IMAGE]


def _torchvision_steps(boxes, scores, image_shape, score_thresh):
    """torchvision's `RoIHeads.postprocess_detections` after the decoding, for one image."""
    boxes = box_ops.clip_boxes_to_image(boxes, image_shape)
    labels = torch.arange(scores.shape[1]).view(1, -1).expand_as(scores)
    boxes, scores, labels = boxes[:, 1:].reshape(-1, 4), scores[:, 1:].reshape(-1), labels[:, 1:].reshape(-1)
    keep = torch.where(scores > score_thresh)[0]
    boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
    keep = box_ops.remove_small_boxes(boxes, min_size=1e-2)
    boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
    keep = box_ops.batched_nms(boxes, scores, labels, SETTINGS["nms_thresh"])[
        : SETTINGS["detections_per_img"]
    ]
    return boxes[keep], scores[keep], labels[keep]


@pytest.mark.parametrize("score_thresh", [0.0, 0.2, 0.99])
def test_detections_selected_for_the_batch_equal_torchvisions_image_by_image_with_one_host_read(score_thresh):
    boxes, scores, proposals = _scored_boxes()
    with HostSyncCounter() as counter:
        selected = select_detections(boxes, scores, proposals, SHAPES, score_thresh=score_thresh, **SETTINGS)
    assert counter.counts[TO_HOST] == 1 and "aten.nonzero" not in counter.counts, counter.format_counts()
    found = 0
    for image, (image_boxes, image_scores) in enumerate(zip(boxes.split(PER_IMAGE), scores.split(PER_IMAGE))):
        expected = _torchvision_steps(image_boxes, image_scores, SHAPES[image], score_thresh)
        for got, wanted in zip((values[image] for values in selected), expected):
            assert torch.equal(got, wanted)
        found += len(expected[0])
    assert (found > 0) == (score_thresh < 0.99)


@pytest.mark.parametrize("score_thresh", [0.0, 0.2])
def test_under_tracing_the_detections_are_selected_image_by_image_with_the_same_results(score_thresh):
    boxes, scores, proposals = _scored_boxes(seed=1)
    batch = select_detections(boxes, scores, proposals, SHAPES, score_thresh=score_thresh, **SETTINGS)
    with mock.patch.object(torch.jit, "is_tracing", lambda: True), HostSyncCounter() as counter:
        traced = select_detections(boxes, scores, proposals, SHAPES, score_thresh=score_thresh, **SETTINGS)
    assert TO_HOST not in counter.counts and counter.counts["aten.nonzero"] == len(SHAPES)
    for got, wanted in zip(traced, batch):
        assert all(torch.equal(g, w) for g, w in zip(got, wanted))


def test_has_min_size_is_torchvisions_remove_small_boxes_as_a_mask():
    boxes = torch.tensor([[0, 0, 1, 1], [0, 0, 0.5, 2], [1, 1, 3, 1.5], [2, 2, 2, 2], [0, 0, 0.5, 0.5]])
    for min_size in (0.5, 1.0):
        expected = box_ops.remove_small_boxes(boxes, min_size)
        assert torch.equal(torch.where(has_min_size(boxes, min_size))[0], expected)
    assert has_min_size(boxes.view(1, 5, 4), 0.5).shape == (1, 5)


def test_nms_in_image_keeps_the_best_of_each_group_up_to_the_limit():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    groups = torch.tensor([0, 0, 1, 0])
    kept_boxes, kept_scores, kept_groups = nms_in_image(boxes, scores, groups, 0.5, (40, 40), 10)
    assert kept_scores.tolist() == pytest.approx([0.9, 0.7, 0.6]) and kept_groups.tolist() == [0, 1, 0]
    assert torch.equal(kept_boxes, boxes[[0, 2, 3]])
    assert nms_in_image(boxes, scores, groups, 0.5, (40, 40), 2)[1].tolist() == pytest.approx([0.9, 0.7])


def test_nms_in_image_keeps_at_most_limit_per_group_of_each_group():
    boxes = torch.tensor([[10.0 * i, 0, 10.0 * i + 5, 5] for i in range(6)])  # no two overlap
    scores = torch.tensor([0.9, 0.8, 0.75, 0.7, 0.6, 0.5])
    groups = torch.tensor([2, 2, 1, 2, 1, 3])
    _, kept_scores, kept_groups = nms_in_image(boxes, scores, groups, 0.5, (10, 70), 10, limit_per_group=1)
    assert kept_scores.tolist() == pytest.approx([0.9, 0.75, 0.5]) and kept_groups.tolist() == [2, 1, 3]
    # Each group's best 2, then the image's best 3 of those.
    _, kept_scores, _ = nms_in_image(boxes, scores, groups, 0.5, (10, 70), 3, limit_per_group=2)
    assert kept_scores.tolist() == pytest.approx([0.9, 0.8, 0.75])


@pytest.mark.parametrize("per_class", [1, 2, 1000])
def test_detections_per_class_limits_each_class_in_each_image(per_class):
    boxes, scores, proposals = _scored_boxes(seed=2)
    settings = {**SETTINGS, "detections_per_img": 100, "score_thresh": 0.0}
    everything = select_detections(boxes, scores, proposals, SHAPES, **settings)
    limited = select_detections(boxes, scores, proposals, SHAPES, **settings, detections_per_class=per_class)
    for all_boxes, all_scores, all_labels, got_boxes, got_scores, got_labels in zip(*everything, *limited):
        keep = [
            i
            for i, label in enumerate(all_labels.tolist())
            if all_labels[:i].tolist().count(label) < per_class
        ]
        assert torch.equal(got_boxes, all_boxes[keep]) and torch.equal(got_scores, all_scores[keep])
        assert torch.equal(got_labels, all_labels[keep])
    assert sum(len(s) for s in limited[1]) < sum(len(s) for s in everything[1]) or per_class == 1000


def test_detections_per_class_must_be_positive():
    boxes, scores, proposals = _scored_boxes()
    with pytest.raises(ValueError, match=r"select_detections\(detections_per_class=\) must be >= 1"):
        select_detections(
            boxes, scores, proposals, SHAPES, score_thresh=0.0, **SETTINGS, detections_per_class=0
        )
