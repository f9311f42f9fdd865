"""Matching boxes to ground truth for a whole batch at once, with torchvision's rules and results.

torchvision's RPN and RoI heads match each image's anchors or RoIs to its ground-truth boxes in a Python loop:
an IoU matrix, the `Matcher`'s thresholds and the labels cost a few dozen device operations (kernel launches)
per image and loop. Here the images' ground-truth boxes are padded to the batch's largest count, every
image's matrix is one slice of a [N, G, P] tensor (padding at IoU -1, below every real IoU, never matched),
and the operations run once per batch: the same IoUs bit for bit, the same matches. `match_rois` adds the
matched classes of the RoI heads' RoIs.

The IoU matrices of a batch take N times the memory of one image's, so the images go through in chunks of
at most `MAX_IOU_ELEMENTS` IoUs (one image at least): an R50-FPN batch of 8 at 800 x 1344 px (~270,000
anchors) with 30 ground-truth boxes per image is one chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.models.detection import _utils as det_utils

from lazytrain.modeling.host_values import to_device

__all__ = [
    "MAX_IOU_ELEMENTS",
    "Matcher",
    "PaddedBoxes",
    "RoIMatch",
    "box_iou_padded",
    "gather_boxes",
    "match_padded",
    "match_rois",
    "pad_boxes",
]

# IoUs per chunk of images in `match_padded`: 2**26 float32 values are 256 MiB, and the computation holds
# about four arrays of that size at once (torchvision's `box_iou` holds about nine for one image).
MAX_IOU_ELEMENTS = 2**26


class Matcher(det_utils.Matcher):
    """torchvision's `Matcher`, adding the low-quality matches with a mask instead of ``torch.where(cond)``
    (whose output size the host reads), and matching a padded batch at once (`match_batch`): the same
    matches."""

    def set_low_quality_matches_(
        self, matches: Tensor, all_matches: Tensor, match_quality_matrix: Tensor
    ) -> None:
        # Every prediction that is some ground truth's best (ties included) takes its own best match.
        best_per_target = match_quality_matrix.max(dim=1).values
        is_a_best = (match_quality_matrix == best_per_target[:, None]).any(dim=0)
        matches.copy_(torch.where(is_a_best, all_matches, matches))

    def match_batch(self, quality: Tensor, target_valid: Tensor) -> Tensor:
        """Each image's matches, as `__call__` gives them for that image's matrix.

        Args:
            quality: [N, G, P] IoUs of each image's G (padded) targets with its P (padded) predictions;
                padded entries hold a value below every real one (`box_iou_padded` gives -1).
            target_valid: [N, G] which targets are real. An image without any: every prediction is below
                the low threshold (torchvision's RPN and RoI heads label those background).

        Returns:
            [N, P] int64: the matched target index, or `BELOW_LOW_THRESHOLD` (-1) / `BETWEEN_THRESHOLDS` (-2).
        """
        num_images, num_targets, num_predictions = quality.shape
        if num_targets == 0:
            return quality.new_full(
                (num_images, num_predictions), self.BELOW_LOW_THRESHOLD, dtype=torch.int64
            )
        matched_vals, matches = quality.max(dim=1)
        all_matches = matches.clone() if self.allow_low_quality_matches else None
        below_low_threshold = matched_vals < self.low_threshold
        between_thresholds = (matched_vals >= self.low_threshold) & (matched_vals < self.high_threshold)
        matches.masked_fill_(below_low_threshold, self.BELOW_LOW_THRESHOLD)
        matches.masked_fill_(between_thresholds, self.BETWEEN_THRESHOLDS)
        if all_matches is None:
            return matches
        # As set_low_quality_matches_ per image; a padded target has no best prediction.
        best_per_target = quality.max(dim=2, keepdim=True).values
        is_a_best = ((quality == best_per_target) & target_valid[..., None]).any(dim=1)
        return torch.where(is_a_best, all_matches, matches)


class PaddedBoxes(NamedTuple):
    """Per-image boxes stacked into one tensor: `boxes` [N, M, 4] (zeros where padded), `valid` [N, M]."""

    boxes: Tensor
    valid: Tensor


def pad_boxes(boxes: list[Tensor]) -> PaddedBoxes:
    """Each image's [M_i, 4] boxes, padded with zeros to the largest M_i (to one row if every M_i is 0, so
    that `gather_boxes` finds a zero box for the images without a match)."""
    padded = torch.nn.utils.rnn.pad_sequence(boxes, batch_first=True)
    if padded.shape[1] == 0:
        padded = padded.new_zeros((padded.shape[0], 1, 4))
    counts = to_device([b.shape[0] for b in boxes], padded.device)
    valid = torch.arange(padded.shape[1], device=padded.device) < counts[:, None]
    return PaddedBoxes(padded, valid)


def _area(boxes: Tensor) -> Tensor:
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def _overlap(first: Tensor, second: Tensor, low: int, high: int) -> Tensor:
    """The overlap of the boxes' [low, high] extents along one axis (x: 0, 2; y: 1, 3), [N, G, P]."""
    top = torch.minimum(first[..., :, None, high], second[..., None, :, high])
    return top.sub_(torch.maximum(first[..., :, None, low], second[..., None, :, low])).clamp_(min=0)


@torch.no_grad()
def box_iou_padded(targets: PaddedBoxes, boxes: PaddedBoxes) -> Tensor:
    """[N, G, P] IoUs of each image's targets with its boxes, -1 where either is padding.

    The arithmetic is torchvision's ``box_iou`` for each element, in the same order (so are the bits), with
    the x and y overlaps computed apart to hold fewer arrays at once."""
    intersection = _overlap(targets.boxes, boxes.boxes, 0, 2).mul_(_overlap(targets.boxes, boxes.boxes, 1, 3))
    union = _area(targets.boxes)[..., :, None] + _area(boxes.boxes)[..., None, :] - intersection
    iou = intersection.div_(union)
    return iou.masked_fill_(~(targets.valid[..., :, None] & boxes.valid[..., None, :]), -1.0)


@torch.no_grad()
def match_padded(
    matcher: Matcher, targets: PaddedBoxes, boxes: PaddedBoxes, max_elements: int = MAX_IOU_ELEMENTS
) -> Tensor:
    """[N, P] `matcher`'s matches of each image's boxes to its targets (torchvision's, image by image), in
    chunks of images of at most `max_elements` IoUs."""
    num_images, num_targets = targets.valid.shape
    per_image = max(1, num_targets * boxes.valid.shape[1])
    chunk = max(1, max_elements // per_image)
    matches = []
    for start in range(0, num_images, chunk):
        part = slice(start, start + chunk)
        chunk_targets = PaddedBoxes(targets.boxes[part], targets.valid[part])
        quality = box_iou_padded(chunk_targets, PaddedBoxes(boxes.boxes[part], boxes.valid[part]))
        matches.append(matcher.match_batch(quality, chunk_targets.valid))
    return matches[0] if len(matches) == 1 else torch.cat(matches)


def gather_boxes(boxes: Tensor, index: Tensor) -> Tensor:
    """[N, P, 4]: for each image, the rows of `boxes` [N, M, 4] at `index` [N, P]."""
    return boxes.gather(1, index[..., None].expand(-1, -1, 4))


class RoIMatch(NamedTuple):
    """The RoIs of a batch matched to their images' ground truth (`match_rois`), padded per image."""

    rois: PaddedBoxes  # [N, R, 4]
    gt: PaddedBoxes  # [N, G, 4]
    matches: Tensor  # [N, R]: the matcher's output (-1 below the low threshold, -2 between)
    index: Tensor  # [N, R]: the matched ground-truth index, 0 where none (torchvision's clamped index)
    labels: Tensor  # [N, R]: the matched ground truth's class, 0 (background) below the low threshold


def match_rois(
    matcher: Matcher, rois: list[Tensor], gt_boxes: list[Tensor], gt_labels: list[Tensor]
) -> RoIMatch:
    """torchvision's ``assign_targets_to_proposals`` for all images at once (`match_padded`):
    the same matches and labels, without the ignored label (-1, between the thresholds) that the caller sets
    where its matcher has such a band. An image without ground truth: every RoI background, index 0.

    Args:
        matcher: IoU thresholds (`Matcher`).
        rois: per image [R_i, 4].
        gt_boxes: per image [G_i, 4], in the dtype of `rois`.
        gt_labels: per image [G_i] int64 classes (1..K).
    """
    rois_padded, gt = pad_boxes(rois), pad_boxes(gt_boxes)
    matches = match_padded(matcher, gt, rois_padded)
    index = matches.clamp(min=0)
    padded_labels = torch.nn.utils.rnn.pad_sequence(gt_labels, batch_first=True)
    padded_labels = F.pad(padded_labels, (0, gt.boxes.shape[1] - padded_labels.shape[1]))
    labels = padded_labels.gather(1, index).masked_fill(matches == matcher.BELOW_LOW_THRESHOLD, 0)
    return RoIMatch(rois_padded, gt, matches, index, labels)
