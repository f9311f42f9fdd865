"""Matching a batch at once (`lazytrain.modeling.matching`, `match_rois`): torchvision's IoUs,
matches, labels and training RoIs, image by image, with padding and images without ground truth."""

import pytest
import torch
from pytest import param
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.roi_heads import RoIHeads as TorchvisionRoIHeads
from torchvision.ops import box_iou

from lazytrain.modeling.matching import Matcher, box_iou_padded, match_padded, match_rois, pad_boxes
from lazytrain.modeling.roi_heads import RoIHeads
from lazytrain.utils.host_syncs import HostSyncCounter

# Ground-truth and prediction counts per image: an image without ground truth, one with a single box.
GT_COUNTS = (3, 0, 7, 1)
PREDICTION_COUNTS = (50, 20, 64, 33)


def _boxes(generator: torch.Generator, count: int) -> torch.Tensor:
    # Coordinates on a coarse grid: many equal IoUs, so ties are exercised.
    corner = (torch.rand(count, 2, generator=generator) * 10).floor() * 8
    size = (torch.rand(count, 2, generator=generator) * 6).floor() * 8 + 8
    return torch.cat((corner, corner + size), dim=1)


def _batch(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    gt = [_boxes(generator, count) for count in GT_COUNTS]
    gt[2][1] = gt[2][0]  # two ground-truth boxes alike: equal IoUs with every prediction
    predictions = [_boxes(generator, count) for count in PREDICTION_COUNTS]
    predictions[0][:3] = gt[0]  # predictions on the ground truth: IoU 1
    return gt, predictions


@pytest.mark.parametrize("seed", range(3))
def test_padded_iou_is_torchvisions_box_iou_bit_for_bit_with_padding_at_minus_one(seed):
    gt, predictions = _batch(seed)
    iou = box_iou_padded(pad_boxes(gt), pad_boxes(predictions))
    assert iou.shape == (4, max(GT_COUNTS), max(PREDICTION_COUNTS))
    for image, (targets, boxes) in enumerate(zip(gt, predictions)):
        rows, columns = targets.shape[0], boxes.shape[0]
        assert torch.equal(iou[image, :rows, :columns], box_iou(targets, boxes))
        assert (iou[image, rows:] == -1).all() and (iou[image, :, columns:] == -1).all()


@pytest.mark.parametrize(
    "high, low, low_quality",
    [param(0.7, 0.3, True, id="RPN"), param(0.5, 0.5, False, id="RoI heads"), param(0.6, 0.6, False)],
)
@pytest.mark.parametrize("max_elements", [1, 300, 2**26], ids=["image by image", "chunks", "at once"])
def test_matches_are_torchvisions_image_by_image_without_host_syncs(high, low, low_quality, max_elements):
    gt, predictions = _batch(seed=1)
    matcher = Matcher(high, low, allow_low_quality_matches=low_quality)
    reference = det_utils.Matcher(high, low, allow_low_quality_matches=low_quality)
    with HostSyncCounter() as counter:
        matches = match_padded(matcher, pad_boxes(gt), pad_boxes(predictions), max_elements=max_elements)
    assert counter.total == 0, counter.format_counts()
    assert (matches == matcher.BETWEEN_THRESHOLDS).any() == (high > low)
    for image, (targets, boxes) in enumerate(zip(gt, predictions)):
        got = matches[image, : boxes.shape[0]]
        if targets.shape[0] == 0:  # torchvision's heads label such an image background without matching
            assert (got == matcher.BELOW_LOW_THRESHOLD).all()
        else:
            assert torch.equal(got, reference(box_iou(targets, boxes)))


def test_a_batch_without_any_ground_truth_matches_nothing():
    boxes = pad_boxes([torch.tensor([[0.0, 0, 8, 8]]), torch.tensor([[4.0, 4, 9, 9], [1, 1, 2, 2]])])
    empty = pad_boxes([torch.zeros(0, 4), torch.zeros(0, 4)])
    assert empty.boxes.shape == (2, 1, 4) and not empty.valid.any()  # one zero row to gather from
    matches = match_padded(Matcher(0.7, 0.3, True), empty, boxes)
    assert torch.equal(matches, torch.full((2, 2), -1))


def _roi_heads(sampler_size: int = 16) -> RoIHeads:
    return RoIHeads(None, None, None, 0.5, 0.5, sampler_size, 0.25, None, 0.05, 0.5, 100)


def test_roi_matches_and_labels_are_torchvisions_assign_targets_to_proposals():
    gt, predictions = _batch(seed=2)
    labels = [torch.arange(1, count + 1) * 3 for count in GT_COUNTS]
    heads = _roi_heads()
    rois = heads.add_gt_proposals(predictions, gt)
    match = match_rois(heads.proposal_matcher, rois, gt, labels)
    expected_index, expected_labels = TorchvisionRoIHeads.assign_targets_to_proposals(heads, rois, gt, labels)
    for image, count in enumerate(r.shape[0] for r in rois):
        assert torch.equal(match.index[image, :count], expected_index[image])
        assert torch.equal(match.labels[image, :count], expected_labels[image])


def test_training_rois_are_torchvisions_matching_of_the_rois_drawn():
    gt, predictions = _batch(seed=3)
    targets = [{"boxes": g, "labels": torch.arange(1, g.shape[0] + 1)} for g in gt]
    heads = _roi_heads()
    torch.manual_seed(0)
    samples = heads.select_training_samples(predictions, targets)
    # The reference: torchvision's matching of every RoI, then the same draws (same seed, same labels).
    rois = heads.add_gt_proposals(predictions, gt)
    matched, labels = TorchvisionRoIHeads.assign_targets_to_proposals(
        heads, rois, gt, [t["labels"] for t in targets]
    )
    torch.manual_seed(0)
    padded = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-1)
    order, num_foreground, num_sampled = heads._draw_samples(padded)
    assert samples.num_foreground == num_foreground and 0 < sum(num_foreground) < sum(num_sampled)
    coder = det_utils.BoxCoder(heads.box_coder.weights)
    for image, count in enumerate(num_sampled):
        kept = order[image, :count]
        gt_boxes = gt[image] if gt[image].shape[0] else torch.zeros(1, 4)
        assert torch.equal(samples.proposals[image], rois[image][kept])
        assert torch.equal(samples.matched_idxs[image], matched[image][kept])
        assert torch.equal(samples.labels[image], labels[image][kept])
        expected_targets = coder.encode_single(gt_boxes[matched[image][kept]], rois[image][kept])
        assert torch.equal(samples.regression_targets[image], expected_targets)
