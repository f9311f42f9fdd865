"""`RegionProposalNetwork`: torchvision's RPN, giving the same proposals, without making the host wait.

torchvision's RPN makes the host wait for the accelerator (a "host sync", `lazytrain.utils.host_syncs`) many
times per image and step: per image it removes small and low-scoring boxes with ``torch.where``, runs one
``nms`` per FPN level (``batched_nms``, which above 4,000 box coordinates on the CPU and 100,000 on CUDA also
loops over the levels with ``unique`` and ``where``), samples the training anchors with ``where`` and
``randperm``, and its box coder copies Python numbers to the device on every call. This subclass does the
same work for all images at once, on tensors whose sizes do not depend on the data:

- proposals (`filter_proposals`): clip with a per-image size tensor; small and low-scoring boxes are masked,
  not removed; greedy NMS for every (image, level) group at once (`lazytrain.modeling.nms.GroupedNMS`, the
  same boxes survive as with torchvision's CPU ``nms``); the host reads one small tensor (the number of
  proposals per image) to return torchvision's per-image lists;
- training: the anchors of all images are matched to their ground truth at once
  (`assign_targets_to_anchors`, `lazytrain.modeling.matching`); `BalancedMaskSampler` draws them as masks
  and the losses are masked sums (`compute_loss`).

Where torchvision's results depend on how a sort orders equal scores, this module orders them by position
(level, then rank within the level), which is what torchvision's own ``nms`` does; see `filter_proposals`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.rpn import RegionProposalNetwork as TorchvisionRegionProposalNetwork
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.box_coding import BoxCoder, clip_to_image_sizes
from lazytrain.modeling.box_selection import has_min_size, nms_in_image
from lazytrain.modeling.host_values import to_device
from lazytrain.modeling.matching import Matcher, PaddedBoxes, gather_boxes, match_padded, pad_boxes
from lazytrain.modeling.nms import GroupedNMS
from lazytrain.modeling.sampling import BalancedMaskSampler

__all__ = ["RegionProposalNetwork"]

# NMS decides only each level's first DECIDED_PER_RESULT * post_nms_top_n() valid candidates (by score): lower
# ones rarely reach the result, which a check confirms (else every candidate is decided, at the cost of a
# second host read). 1.5 leaves a margin above the ratios the recipes need (docs/benchmarks.md).
DECIDED_PER_RESULT = 1.5


class RegionProposalNetwork(TorchvisionRegionProposalNetwork):
    """torchvision's `RegionProposalNetwork` (same arguments, attributes and state-dict keys), with proposal
    filtering, anchor sampling and losses that run on all images at once and sync the host once per call.

    In eval mode the proposals equal torchvision's box for box (see `filter_proposals` for the order of
    equal scores); in training the losses are torchvision's for the anchors drawn, but the anchors are drawn
    by `BalancedMaskSampler`, so not the ones torchvision would draw for the same seed. To sample differently,
    assign ``rpn.fg_bg_sampler`` a callable that maps labels [N, A] to ``(positive, negative)`` masks, [N, A]
    or per image (torchvision's `BalancedPositiveNegativeSampler` works, with its host syncs).
    Under tracing (model export), and by default on the CPU (``batched``), `filter_proposals` is torchvision's.

    Args:
        anchor_generator: anchors for the feature maps.
        head: objectness logits and box deltas per anchor (torchvision's `RPNHead`).
        fg_iou_thresh: IoU with a ground-truth box from which an anchor is positive.
        bg_iou_thresh: IoU below which an anchor is negative (in between: ignored).
        batch_size_per_image: anchors sampled per image for the losses.
        positive_fraction: the largest share of positives among them.
        pre_nms_top_n: ``{"training": k, "testing": k}``, proposals kept per level and image before NMS.
        post_nms_top_n: ``{"training": k, "testing": k}``, proposals kept per image after NMS.
        nms_thresh: IoU above which NMS removes the lower-scoring box, in [0, 1].
        score_thresh: proposals scoring below it (objectness probability) are dropped.
        batched: select proposals for all images at once with one host read (True), or with torchvision's
            per-image loop (False). None (the default): batched on any device but the CPU, where nothing waits
            for a device and the loop is as fast or faster (docs/benchmarks.md), and batched wherever
            `compiled_nms` is set.
        compiled_nms: in the batched selection, compute NMS's who-suppresses-whom bits with one
            ``torch.compile``d kernel per FPN level (`lazytrain.modeling.nms.GroupedNMS`'s ``compiled``)
            instead of about a dozen element-wise passes over each level's [boxes x boxes] IoUs (gigabytes of
            memory traffic per training step at large batches and images). The same proposals; the first
            forward compiles (seconds; inductor needs Triton on a GPU, a C++ compiler on the CPU). On the CPU
            it does not pay: the passes run on cache-sized tiles there.
        min_size: proposals narrower or lower than this (pixels, after clipping) are dropped before NMS
            (torchvision's 1e-3).
        strict_min_size: keep proposals wider and higher than `min_size` instead of at least as wide and
            high: detectron2's rule (``min_size=0``: only empty boxes are dropped). It selects in the batched
            path (torchvision's loop cannot apply it), which gives torchvision's proposals on any device.
    """

    def __init__(
        self,
        anchor_generator: AnchorGenerator,
        head: nn.Module,
        fg_iou_thresh: float,
        bg_iou_thresh: float,
        batch_size_per_image: int,
        positive_fraction: float,
        pre_nms_top_n: dict[str, int],
        post_nms_top_n: dict[str, int],
        nms_thresh: float,
        score_thresh: float = 0.0,
        *,
        batched: bool | None = None,
        compiled_nms: bool = False,
        min_size: float = 1e-3,
        strict_min_size: bool = False,
    ) -> None:
        if not 0.0 <= nms_thresh <= 1.0:
            raise ValueError(f"RegionProposalNetwork(nms_thresh=) must be in [0, 1]; got {nms_thresh}")
        super().__init__(
            anchor_generator, head, fg_iou_thresh, bg_iou_thresh, batch_size_per_image, positive_fraction,
            pre_nms_top_n, post_nms_top_n, nms_thresh, score_thresh,
        )  # fmt: skip
        self.box_coder = BoxCoder(weights=(1.0, 1.0, 1.0, 1.0))
        self.proposal_matcher = Matcher(fg_iou_thresh, bg_iou_thresh, allow_low_quality_matches=True)
        self.fg_bg_sampler = BalancedMaskSampler(batch_size_per_image, positive_fraction)
        if compiled_nms and batched is False:
            raise ValueError(
                "RegionProposalNetwork(compiled_nms=True, batched=False): the compiled NMS is part of the batched "
                "proposal selection, which batched=False turns off. Set batched=None (or true), or "
                "compiled_nms=false."
            )
        if strict_min_size and batched is False:
            raise ValueError(
                "RegionProposalNetwork(strict_min_size=True, batched=False): the strict rule is applied by the "
                "batched proposal selection, which batched=False turns off. Set batched=None (or true)."
            )
        self.batched = batched
        self.compiled_nms = compiled_nms
        self.min_size = float(min_size)
        self.strict_min_size = bool(strict_min_size)

    def filter_proposals(
        self,
        proposals: Tensor,
        objectness: Tensor,
        image_shapes: list[tuple[int, int]],
        num_anchors_per_level: list[int],
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Per image, the best ``post_nms_top_n()`` proposals after NMS, best first, as torchvision's.

        The steps are torchvision's (top ``pre_nms_top_n()`` per level and image, clip, drop boxes smaller
        than ``min_size`` or scoring below ``score_thresh``, NMS per level, best ``post_nms_top_n()``), and
        so are the results, with one difference: equal scores. Boxes of equal score are ordered by position
        (level, then rank in the level's top-k), as torchvision's ``nms`` orders them; torchvision's
        ``batched_nms`` re-sorts the survivors with an unstable sort when it loops over the levels (above
        4,000 coordinates per image on the CPU), so there the order of equal scores, and which of them make
        the ``post_nms_top_n()`` cut, may differ. On every device the IoUs and their comparison with
        ``nms_thresh`` are those of torchvision's CPU kernel; torchvision on CUDA offsets each level's
        coordinates by multiples of the largest one (``batched_nms``'s coordinate trick, below 100,000
        coordinates) and rounds differently in its CUDA kernel, so it may decide an IoU within float32
        rounding of ``nms_thresh`` the other way.

        Args:
            proposals: [N, A, 4] decoded boxes of every anchor.
            objectness: [N * A, 1] (or [N, A]) objectness logits.
            image_shapes: (height, width) of each image.
            num_anchors_per_level: anchors per image on each level, in the order of `proposals`.

        Returns:
            ``(boxes, scores)``: per image [K_i, 4] boxes and [K_i] objectness probabilities.
        """
        exporting = torch.compiler.is_exporting()
        batched = self.batched
        if batched is None:
            batched = proposals.device.type != "cpu" or self.compiled_nms or self.strict_min_size
        if not exporting and (torch.jit.is_tracing() or not batched):
            return super().filter_proposals(proposals, objectness, image_shapes, num_anchors_per_level)
        top, boxes, scores = self._top_scored(proposals, objectness, num_anchors_per_level)
        if exporting:
            return self._proposals_in_each_image(top, boxes, scores, image_shapes, num_anchors_per_level)
        return self._proposals_for_the_batch(
            self._candidates(boxes, scores, image_shapes, num_anchors_per_level)
        )

    def _proposals_for_the_batch(self, candidates: _Candidates) -> tuple[list[Tensor], list[Tensor]]:
        """`filter_proposals` for all images at once: NMS for every (image, level) group of the `candidates`
        by `GroupedNMS`, and one host read (two where NMS needs a second pass)."""
        limit = self.post_nms_top_n()
        decided = math.ceil(DECIDED_PER_RESULT * limit)
        nms = GroupedNMS(*candidates, self.nms_thresh, compiled=self.compiled_nms)
        keep, is_final = nms.survivors(needed=limit, decide_first=decided)
        counts = keep.sum(dim=1).clamp(max=limit)
        # The one host read: how many proposals each image returns, and whether NMS needs more work.
        *counts, is_final = torch.cat((counts, is_final.reshape(1))).tolist()
        if not is_final:
            keep, _ = nms.survivors(needed=limit, decide_first=None)
            counts = keep.sum(dim=1).clamp(max=limit).tolist()
        return _best_kept(candidates, keep, counts, limit)

    def _top_scored(
        self, proposals: Tensor, objectness: Tensor, num_anchors_per_level: list[int]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Each level's top ``pre_nms_top_n()`` anchors of each image, level after level: their indices
        [N, K], boxes [N, K, 4] and objectness probabilities [N, K] (torchvision's first step)."""
        num_images = proposals.shape[0]
        objectness = objectness.detach().reshape(num_images, -1)
        top = self._get_top_n_idx(objectness, num_anchors_per_level)
        scores = objectness.gather(1, top).sigmoid()
        boxes = proposals.gather(1, top[..., None].expand(-1, -1, 4))
        return top, boxes, scores

    def _is_valid(self, boxes: Tensor, scores: Tensor) -> Tensor:
        """Which candidates take part in NMS: at least ``min_size`` wide and high (wider and higher with
        ``strict_min_size``), scoring ``score_thresh``."""
        return has_min_size(boxes, self.min_size, strict=self.strict_min_size) & (scores >= self.score_thresh)

    def _proposals_in_each_image(
        self,
        top: Tensor,
        boxes: Tensor,
        scores: Tensor,
        image_shapes: list[tuple[int, int]],
        num_anchors_per_level: list[int],
    ) -> tuple[list[Tensor], list[Tensor]]:
        """`filter_proposals` under ``torch.export`` from the `_top_scored` candidates: torchvision's steps
        image by image, with the sizes that depend on the data (boxes left after the thresholds and NMS) left
        to the exported program, and NMS by `batched_nms`'s export form (one ``nms`` over level-offset boxes,
        as a TorchScript trace does)."""
        levels = torch.cat(
            [
                torch.full((count,), index, device=top.device)
                for index, count in enumerate(num_anchors_per_level)
            ]
        )
        kept_boxes, kept_scores = [], []
        for image_boxes, image_scores, image_levels, shape in zip(boxes, scores, levels[top], image_shapes):
            image_boxes = box_ops.clip_boxes_to_image(image_boxes, shape)
            index = torch.where(self._is_valid(image_boxes, image_scores))[0]
            image_boxes, image_scores, _ = nms_in_image(
                image_boxes[index], image_scores[index], image_levels[index], self.nms_thresh, shape,
                self.post_nms_top_n(),
            )  # fmt: skip
            kept_boxes.append(image_boxes)
            kept_scores.append(image_scores)
        return kept_boxes, kept_scores

    def _candidates(
        self,
        boxes: Tensor,
        scores: Tensor,
        image_shapes: list[tuple[int, int]],
        num_anchors_per_level: list[int],
    ) -> _Candidates:
        """The `_top_scored` candidates clipped, and which of them take part in NMS (the valid ones, first in
        each level)."""
        boxes = clip_to_image_sizes(boxes, to_device(image_shapes, boxes.device, boxes.dtype))
        valid = self._is_valid(boxes, scores)
        level_sizes = [min(self.pre_nms_top_n(), count) for count in num_anchors_per_level]
        return _valid_first(_Candidates(boxes, scores, valid, level_sizes))

    def assign_targets_to_anchors(
        self, anchors: list[Tensor], targets: list[dict[str, Tensor]]
    ) -> tuple[list[Tensor], list[Tensor]]:
        """torchvision's labels and matched ground-truth boxes per image, computed for the batch at once.

        Labels: 1 for an anchor matched to a ground-truth box, 0 below ``bg_iou_thresh`` (every anchor of an
        image without boxes), -1 in between; the matched box, zeros where none (torchvision's values).
        The similarity is IoU (torchvision's ``box_similarity``), computed by `lazytrain.modeling.matching`.

        Args:
            anchors: per image [A, 4].
            targets: per image, ``boxes`` [G_i, 4].

        Returns:
            ``(labels, matched_gt_boxes)``: per image [A] float32 and [A, 4].
        """
        gt = pad_boxes([target["boxes"] for target in targets])
        stacked = torch.stack(anchors)
        all_anchors = torch.ones(stacked.shape[:2], dtype=torch.bool, device=stacked.device)
        matches = match_padded(self.proposal_matcher, gt, PaddedBoxes(stacked, all_anchors))
        matched_gt_boxes = gather_boxes(gt.boxes, matches.clamp(min=0))
        labels = (matches >= 0).to(torch.float32)
        labels.masked_fill_(matches == self.proposal_matcher.BETWEEN_THRESHOLDS, -1.0)
        return list(labels.unbind()), list(matched_gt_boxes.unbind())

    def compute_loss(
        self,
        objectness: Tensor,
        pred_bbox_deltas: Tensor,
        labels: list[Tensor],
        regression_targets: list[Tensor],
    ) -> tuple[Tensor, Tensor]:
        """torchvision's RPN losses over the anchors that ``fg_bg_sampler`` draws, as masked sums.

        ``loss_objectness``: binary cross-entropy with logits, averaged over the drawn anchors of the batch;
        ``loss_rpn_box_reg``: smooth L1 (beta 1/9) of the drawn positives, summed and divided by the number
        of drawn anchors of the batch. Equal to torchvision's `compute_loss` for the same drawn anchors up to
        the order of float additions.

        Args:
            objectness: [N * A, 1] objectness logits, images one after the other.
            pred_bbox_deltas: [N * A, 4] predicted box deltas.
            labels: per image [A]: 1 positive, 0 negative, -1 ignored.
            regression_targets: per image [A, 4] encoded ground-truth boxes.

        Returns:
            ``(loss_objectness, loss_rpn_box_reg)``.
        """
        labels = torch.stack(labels)
        positive, negative = (_batch_mask(drawn) for drawn in self.fg_bg_sampler(labels))
        positive, drawn = positive.flatten(), (positive | negative).flatten()
        num_drawn = drawn.sum()
        # masked_fill, not a product with the mask: an anchor outside the sample may hold inf (log 0 in the
        # regression target of an image without boxes), and inf * 0 is nan; masked, its gradient is 0.
        per_anchor = F.smooth_l1_loss(
            pred_bbox_deltas, torch.cat(regression_targets), beta=1 / 9, reduction="none"
        )
        box_loss = per_anchor.sum(dim=1).masked_fill(~positive, 0.0).sum() / num_drawn
        per_anchor = F.binary_cross_entropy_with_logits(
            objectness.flatten(), labels.flatten().clamp(min=0), reduction="none"
        )
        objectness_loss = per_anchor.masked_fill(~drawn, 0.0).sum() / num_drawn
        return objectness_loss, box_loss


def _batch_mask(drawn: Tensor | list[Tensor]) -> Tensor:
    """A sampler's mask as one bool tensor: `BalancedMaskSampler` gives [N, A], torchvision's sampler a list of
    per-image uint8 masks."""
    return (torch.stack(drawn) if isinstance(drawn, (list, tuple)) else drawn).bool()


class _Candidates(NamedTuple):
    """The NMS candidates of a batch, [N, K] per image: the levels' blocks one after the other, each block
    holding its valid candidates (`valid`: large enough, scoring at least ``score_thresh``) in decreasing score
    order (top-k's order), then its invalid ones. The fields come in the order `GroupedNMS` takes them."""

    boxes: Tensor
    scores: Tensor
    valid: Tensor
    level_sizes: list[int]


def _valid_first(candidates: _Candidates) -> _Candidates:
    """The same candidates with each level's valid ones moved first, in their order. torchvision removes the
    invalid ones; here a level's first candidates, which `GroupedNMS.survivors` may decide alone, are then all
    valid."""
    boxes, scores, valid, level_sizes = candidates
    level = torch.cat(
        [torch.full((size,), index, device=valid.device) for index, size in enumerate(level_sizes)]
    )
    order = (level * 2 + ~valid).sort(dim=1, stable=True).indices
    boxes = boxes.gather(1, order[..., None].expand(-1, -1, 4))
    return _Candidates(boxes, scores.gather(1, order), valid.gather(1, order), level_sizes)


def _best_kept(
    candidates: _Candidates, keep: Tensor, counts: list[int], limit: int
) -> tuple[list[Tensor], list[Tensor]]:
    """Per image, its `counts` best kept candidates (at most `limit`), best first (equal scores by position)."""
    ranked = candidates.scores.masked_fill(~keep, -math.inf)
    order = ranked.sort(dim=1, descending=True, stable=True).indices[:, :limit]
    boxes = candidates.boxes.gather(1, order[..., None].expand(-1, -1, 4))
    scores = candidates.scores.gather(1, order)
    return [b[:count] for b, count in zip(boxes, counts)], [s[:count] for s, count in zip(scores, counts)]
