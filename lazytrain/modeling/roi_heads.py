"""`RoIHeads`: torchvision's RoI heads whose box branch asks the box predictor's loss how to train and score.

torchvision's `RoIHeads.forward` calls the module-level ``fastrcnn_loss`` (softmax cross-entropy) and its
``postprocess_detections`` scores with a softmax, so a sigmoid loss would train one way and rank detections
another. This subclass asks ``box_predictor.loss`` (a `ClassificationLoss`; softmax cross-entropy when the
predictor has none, as torchvision's own predictors) for the classification loss and for the scores.

Everything else is torchvision's: the constructor and attribute names (so torchvision checkpoints and
config keys such as ``model.roi_heads.score_thresh`` keep working), proposal matching and sampling
(inherited methods), the smooth L1 box loss, the postprocessing (clip, score threshold, small boxes, per-class
NMS, top detections), and the keypoint branch (torchvision's loss and inference functions). The mask branch
asks a `MaskPredictor` for the logits of one class per RoI (the ground-truth class in training, the detected
class in eval) instead of all K+1 (torchvision's predictor still gets torchvision's functions). With softmax
cross-entropy it gives torchvision's losses and detections: exactly for boxes and keypoints, within float
rounding for masks (tests/modeling/test_roi_heads.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.roi_heads import RoIHeads as TorchvisionRoIHeads
from torchvision.models.detection.roi_heads import (
    keypointrcnn_inference,
    keypointrcnn_loss,
    maskrcnn_inference,
    maskrcnn_loss,
    project_masks_on_boxes,
)
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.box_coding import BoxCoder, clip_to_image_sizes
from lazytrain.modeling.classification_losses import ClassificationLoss, SoftmaxCrossEntropy
from lazytrain.modeling.heads import MaskPredictor
from lazytrain.modeling.matching import Matcher, PaddedBoxes, gather_boxes, match_padded, pad_boxes
from lazytrain.modeling.nms import batched_nms
from lazytrain.modeling.poolers import MultiScaleRoIAlign
from lazytrain.modeling.sampling import BalancedMaskSampler

__all__ = [
    "RoIHeads",
    "RoIMatch",
    "box_losses",
    "box_regression_loss",
    "get_predictor_loss",
    "mask_loss",
    "match_rois",
]

_DEFAULT_LOSS = SoftmaxCrossEntropy()  # stateless, so one instance serves every model


class _Samples(NamedTuple):
    """The training RoIs of each image and what they were matched to."""

    proposals: list[Tensor]
    matched_idxs: list[Tensor]
    labels: list[Tensor]
    regression_targets: list[Tensor]
    # Per image, how many of its RoIs are foreground when those come first (`RoIHeads.select_training_samples`
    # with a `BalancedMaskSampler`); None when the RoIs are in torchvision's order.
    num_foreground: list[int] | None = None


class _Batch(NamedTuple):
    """What the mask and keypoint branches need of one forward pass (`samples` is None in eval, where the
    branches add their outputs to the `result` detections)."""

    features: dict[str, Tensor]
    image_shapes: list[tuple[int, int]]
    targets: list[dict[str, Tensor]] | None
    samples: _Samples | None
    result: list[dict[str, Tensor]]


def box_regression_loss(box_regression: Tensor, labels: Tensor, regression_targets: Tensor) -> Tensor:
    """Smooth L1 (beta 1/9) between the foreground RoIs' deltas for their class and their targets, summed
    and divided by the number of RoIs (torchvision's Fast R-CNN box loss).

    Args:
        box_regression: [N, (K+1) * 4] per-class deltas, or [N, 4] class-agnostic ones.
        labels: [N] classes, 0 the background.
        regression_targets: [N, 4] encoded target deltas.
    """
    # Every RoI's deltas for its class, with the background's terms zeroed instead of the foreground picked
    # out with `torch.where` (an output size read from the device, a host sync on a GPU).
    foreground = (labels > 0)[:, None]
    class_agnostic = box_regression.shape[1] == 4  # K >= 1, so per-class deltas are at least 8 wide
    index = (labels.clamp(min=0) * (0 if class_agnostic else 1))[:, None, None].expand(-1, 1, 4)
    deltas = box_regression.reshape(len(labels), -1, 4).gather(1, index)[:, 0]
    targets = regression_targets.masked_fill(~foreground, 0.0)
    per_coordinate = F.smooth_l1_loss(deltas, targets, beta=1 / 9, reduction="none")
    return per_coordinate.masked_fill(~foreground, 0.0).sum() / labels.numel()


def mask_loss(
    mask_logits: Tensor, boxes: list[Tensor], gt_masks: list[Tensor], matched: list[Tensor]
) -> Tensor:
    """Binary cross-entropy between each foreground RoI's mask logits (of its ground-truth class) and its
    target mask cropped and resized to the logits' size (torchvision's ``maskrcnn_loss`` for one channel).

    Args:
        mask_logits: [N, 1, M, M] logits of each RoI's ground-truth class, RoIs of all images in order.
        boxes: per image, the foreground RoIs [N_i, 4].
        gt_masks: per image, the ground-truth masks [G_i, H, W].
        matched: per image, the ground-truth index [N_i] each RoI was matched to.
    """
    size = mask_logits.shape[-1]
    targets = [project_masks_on_boxes(m, b, i, size) for m, b, i in zip(gt_masks, boxes, matched)]
    mask_targets = torch.cat(targets, dim=0)
    if mask_targets.numel() == 0:  # the mean of an empty tensor is NaN; keep the graph connected instead
        return mask_logits.sum() * 0
    return F.binary_cross_entropy_with_logits(mask_logits[:, 0], mask_targets)


def get_predictor_loss(box_predictor: nn.Module) -> ClassificationLoss:
    """A box predictor's ``loss``, or softmax cross-entropy for a predictor without one (torchvision's)."""
    loss = getattr(box_predictor, "loss", None)
    return _DEFAULT_LOSS if loss is None else loss


def box_losses(
    loss: ClassificationLoss,
    class_logits: Tensor,
    box_regression: Tensor,
    labels: list[Tensor],
    regression_targets: list[Tensor],
) -> dict[str, Tensor]:
    """``loss_classifier`` from `loss` and torchvision's ``loss_box_reg`` (`box_regression_loss`) of the RoIs
    of all images (`labels` and `regression_targets` per image, in the logits' order)."""
    labels_all = torch.cat(labels, dim=0)
    return {
        "loss_classifier": loss(class_logits, labels_all),
        "loss_box_reg": box_regression_loss(box_regression, labels_all, torch.cat(regression_targets)),
    }


def _check_target_types(targets: list[dict[str, Tensor]], keypoints: bool) -> None:
    for target in targets:
        if target["boxes"].dtype not in (torch.float, torch.double, torch.half):
            raise TypeError(f"RoIHeads: target boxes must be floating point; got {target['boxes'].dtype}")
        if target["labels"].dtype != torch.int64:
            raise TypeError(f"RoIHeads: target labels must be int64; got {target['labels'].dtype}")
        if keypoints and target["keypoints"].dtype != torch.float32:
            raise TypeError(f"RoIHeads: target keypoints must be float32; got {target['keypoints'].dtype}")


def _foreground(samples: _Samples) -> tuple[list[Tensor], list[Tensor]]:
    """Per image, the foreground training RoIs and their matched target index (for the mask/keypoint heads)."""
    if samples.num_foreground is not None:  # foreground first: slices, no host sync
        boxes = [proposals[:count] for proposals, count in zip(samples.proposals, samples.num_foreground)]
        matched = [index[:count] for index, count in zip(samples.matched_idxs, samples.num_foreground)]
        return boxes, matched
    boxes, matched = [], []
    for proposals, labels, matched_idxs in zip(samples.proposals, samples.labels, samples.matched_idxs):
        keep = torch.where(labels > 0)[0]
        boxes.append(proposals[keep])
        matched.append(matched_idxs[keep])
    return boxes, matched


def _branch_boxes(samples: _Samples | None, result: list[dict[str, Tensor]]) -> tuple[list[Tensor], list]:
    """The boxes a mask or keypoint branch pools: in training the foreground RoIs (and their matched target
    index), in eval the detections (no match)."""
    if samples is not None:
        return _foreground(samples)
    return [detection["boxes"] for detection in result], []


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
    """torchvision's ``assign_targets_to_proposals`` for all images at once (`lazytrain.modeling.matching`):
    the same matches and labels, without the ignored label (-1, between the thresholds) that the caller sets
    where its matcher has such a band. An image without ground truth: every RoI background, index 0.

    Args:
        matcher: IoU thresholds (`lazytrain.modeling.matching.Matcher`).
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


class RoIHeads(TorchvisionRoIHeads):
    """torchvision's `RoIHeads` (same arguments) whose classification loss and inference scores come from
    ``box_predictor.loss`` (`lazytrain.modeling.BoxPredictor(loss=...)`; softmax cross-entropy if absent).

    Training returns ``loss_classifier`` (whatever the loss), ``loss_box_reg`` and, with a mask or keypoint
    head, ``loss_mask``/``loss_keypoint``; eval returns torchvision's detections, ranked by the loss's scores.

    One argument of its own, keyword only: ``compiled_nms`` (default False), the per-class NMS of the
    detections in ``torch.compile``d kernels where it runs grouped (`lazytrain.modeling.nms.batched_nms`: on a
    device above 100,000 box coordinates per image, as LVIS's 1,203 classes at score threshold 1e-4 give;
    torchvision's ``nms`` elsewhere, unchanged). The same detections; the first such call compiles.
    """

    def __init__(self, *args: Any, compiled_nms: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compiled_nms = compiled_nms
        # Without host syncs, same results: the box coder (no tensors from Python numbers), the matcher (a
        # batch at once), the sampler (the same counts, drawn as masks; a torchvision sampler assigned here is
        # used as torchvision does).
        self.box_coder = BoxCoder(self.box_coder.weights, self.box_coder.bbox_xform_clip)
        matcher = self.proposal_matcher  # the same thresholds, matching all images at once
        self.proposal_matcher = Matcher(
            matcher.high_threshold, matcher.low_threshold, matcher.allow_low_quality_matches
        )
        sampler = self.fg_bg_sampler
        self.fg_bg_sampler = BalancedMaskSampler(sampler.batch_size_per_image, sampler.positive_fraction)

    def select_training_samples(
        self, proposals: list[Tensor], targets: list[dict[str, Tensor]] | None
    ) -> _Samples:
        """Per image, the sampled RoIs (the ground-truth boxes added to the proposals), their matched
        ground-truth index, class (0: background) and box regression target.

        With a `BalancedMaskSampler` (the default) the images are matched at once (`match_rois`), each
        image's foreground RoIs come first, then its background, each in proposal order, and the sampling
        costs one host read for the whole batch (torchvision's sampler: three per image); with torchvision's
        sampler, torchvision's method and order.
        """
        if not isinstance(self.fg_bg_sampler, BalancedMaskSampler):
            return _Samples(*super().select_training_samples(proposals, targets))
        self.check_targets(targets)
        gt_boxes = [t["boxes"].to(proposals[0].dtype) for t in targets]
        rois = self.add_gt_proposals(proposals, gt_boxes)
        match = match_rois(self.proposal_matcher, rois, gt_boxes, [t["labels"] for t in targets])
        labels = match.labels.masked_fill(match.matches == self.proposal_matcher.BETWEEN_THRESHOLDS, -1)
        order, num_foreground, num_sampled = self._draw_samples(labels.masked_fill(~match.rois.valid, -1))
        order = order[:, : max(num_sampled)]
        boxes = gather_boxes(match.rois.boxes, order)
        index = match.index.gather(1, order)
        matched_gt_boxes = gather_boxes(match.gt.boxes, index)
        regression_targets = self.box_coder.encode_single(matched_gt_boxes.flatten(0, 1), boxes.flatten(0, 1))
        per_image = (boxes, index, labels.gather(1, order), regression_targets.view_as(boxes))
        sampled = [[values[image, :count] for image, count in enumerate(num_sampled)] for values in per_image]
        return _Samples(*sampled, num_foreground)

    def _draw_samples(self, labels: Tensor) -> tuple[Tensor, list[int], list[int]]:
        """Each image's RoIs ordered foreground-sampled first, then background-sampled, then the rest (each
        in proposal order), and per image the numbers of foreground and of all sampled RoIs. `labels`:
        [N, R], -1 where a RoI is not drawn (ignored, or padding)."""
        positive, negative = self.fg_bg_sampler(labels)
        rank = positive.to(torch.uint8) * 2 + negative.to(torch.uint8)
        order = rank.sort(dim=1, descending=True, stable=True).indices
        # The one host read of the sampling: how many RoIs each image keeps.
        num_foreground, num_background = torch.stack((positive.sum(dim=1), negative.sum(dim=1))).tolist()
        num_sampled = [f + b for f, b in zip(num_foreground, num_background)]
        return order, num_foreground, num_sampled

    def get_classification_loss(self) -> ClassificationLoss:
        """The box predictor's ``loss``, or softmax cross-entropy for a predictor without one."""
        return get_predictor_loss(self.box_predictor)

    def forward(
        self,
        features: dict[str, Tensor],
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
        targets: list[dict[str, Tensor]] | None = None,
    ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        features, samples = self._prepare(features, proposals, targets)
        proposals = proposals if samples is None else samples.proposals
        box_features = self.box_head(self.box_roi_pool(features, proposals, image_shapes))
        class_logits, box_regression = self.box_predictor(box_features)
        result: list[dict[str, Tensor]] = []
        if samples is not None:
            losses = self.box_losses(class_logits, box_regression, samples.labels, samples.regression_targets)
        else:
            losses = {}
            boxes, scores, labels = self.postprocess_detections(
                class_logits, box_regression, proposals, image_shapes
            )
            result = [{"boxes": b, "labels": c, "scores": s} for b, s, c in zip(boxes, scores, labels)]
        losses.update(self._run_branches(_Batch(features, image_shapes, targets, samples, result)))
        return result, losses

    def _prepare(
        self, features: dict[str, Tensor], proposals: list[Tensor], targets: list[dict[str, Tensor]] | None
    ) -> tuple[dict[str, Tensor], _Samples | None]:
        """The maps the poolers read (`_pooled_maps_in_float32`) and, in training, the sampled RoIs."""
        if targets is not None:
            _check_target_types(targets, self.has_keypoint())
        samples = self.select_training_samples(proposals, targets) if self.training else None
        return self._pooled_maps_in_float32(features), samples

    def _run_branches(self, batch: _Batch) -> dict[str, Tensor]:
        """The mask and keypoint branches: their losses in training, their outputs added to `batch.result`
        in eval."""
        losses = {}
        if self.has_mask():
            losses.update(self._mask_branch(batch))
        if self.has_keypoint():
            losses.update(self._keypoint_branch(batch))
        return losses

    def _pooled_maps_in_float32(self, features: dict[str, Tensor]) -> dict[str, Tensor]:
        """Under autocast, the maps the RoI poolers read, cast to float32 once for both poolers.

        torchvision's ``roi_align`` has no bfloat16/float16 kernel: under autocast it casts its input map to
        float32 on every call (and the gradient back), so the box and the mask pooler each cast every FPN
        level. Casting here once gives the same values (the poolers get what autocast gave them) with half the
        casts; the pooled features are float32, which the heads' layers cast as autocast would.
        """
        device_type = next(iter(features.values())).device.type if features else "cpu"
        if not torch.is_autocast_enabled(device_type):
            return features
        names = set()
        for pool in (self.box_roi_pool, self.mask_roi_pool, self.keypoint_roi_pool):
            names.update(getattr(pool, "featmap_names", []) if pool is not None else [])
        low_precision = (torch.float16, torch.bfloat16)
        return {
            name: value.float() if name in names and value.dtype in low_precision else value
            for name, value in features.items()
        }

    def box_losses(
        self,
        class_logits: Tensor,
        box_regression: Tensor,
        labels: list[Tensor],
        regression_targets: list[Tensor],
    ) -> dict[str, Tensor]:
        """``loss_classifier`` from the predictor's loss and torchvision's ``loss_box_reg``."""
        return box_losses(
            self.get_classification_loss(), class_logits, box_regression, labels, regression_targets
        )

    def postprocess_detections(
        self,
        class_logits: Tensor,
        box_regression: Tensor,
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """Per image: boxes, scores and labels (1..K) of the kept detections, scored by the loss's `scores`."""
        scores = self.get_classification_loss().scores(class_logits)
        boxes = self.box_coder.decode(box_regression, proposals)
        return self.select_detections(boxes, scores, proposals, image_shapes)

    def select_detections(
        self, boxes: Tensor, scores: Tensor, proposals: list[Tensor], image_shapes: list[tuple[int, int]]
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """Per image: boxes, scores and labels (1..K) of the detections kept from every RoI's decoded boxes
        `boxes` [R, K+1, 4] and `scores` [R, K+1] (RoIs of all images in the order of `proposals`): score
        threshold, small boxes, per-class NMS, top `detections_per_img` (torchvision's steps and results).

        The thresholds run on the whole batch with one host read (`_candidates`; torchvision: two
        ``torch.where`` per image), NMS image by image; under tracing and ``torch.export``, everything image
        by image (`_detections_in_image`), which records no candidate count."""
        if torch.jit.is_tracing() or torch.compiler.is_exporting():
            # shape[0], not len(): a trace (model export) keeps the former dynamic and freezes the latter.
            per_image = [p.shape[0] for p in proposals]
            kept = [
                self._detections_in_image(image_boxes, image_scores, image_shape)
                for image_boxes, image_scores, image_shape in zip(
                    boxes.split(per_image), scores.split(per_image), image_shapes
                )
            ]
        else:
            kept = [
                self._nms_in_image(*candidates, image_shape)
                for *candidates, image_shape in zip(*self._candidates(boxes, scores, proposals, image_shapes))
            ]
        return [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]

    def _candidates(
        self, boxes: Tensor, scores: Tensor, proposals: list[Tensor], image_shapes: list[tuple[int, int]]
    ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...], list[tuple[int, int]]]:
        """Per image, the boxes, scores and labels of every (RoI, foreground class) scoring above
        `score_thresh` whose box, clipped to its image, is at least 0.01 px wide and high, in torchvision's
        order (RoI, then class); the host reads the number per image, once for the batch."""
        num_images, num_classes = len(proposals), scores.shape[1] - 1
        # Built on the host and copied without blocking: torch.tensor(..., device=) would wait for the device.
        counts = torch.tensor([p.shape[0] for p in proposals]).to(boxes.device, non_blocking=True)
        image_of_roi = torch.arange(num_images, device=boxes.device).repeat_interleave(
            counts, output_size=boxes.shape[0]
        )
        sizes = torch.tensor(image_shapes, dtype=boxes.dtype).to(boxes.device, non_blocking=True)
        boxes = clip_to_image_sizes(boxes[:, 1:], sizes[image_of_roi])  # column 0, the background: never
        scores = scores[:, 1:]
        widths, heights = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
        candidate = (scores > self.score_thresh) & (widths >= 1e-2) & (heights >= 1e-2)
        per_image = torch.zeros(num_images, dtype=torch.int64, device=boxes.device)
        per_image = per_image.index_add_(0, image_of_roi, candidate.sum(dim=1)).tolist()  # the host read
        index = torch.nonzero_static(candidate.flatten(), size=sum(per_image))[:, 0]
        labels = index % num_classes + 1
        found = (boxes.reshape(-1, 4)[index], scores.flatten()[index], labels)
        return (*(values.split(per_image) for values in found), image_shapes)

    def _nms_in_image(
        self, boxes: Tensor, scores: Tensor, labels: Tensor, image_shape: tuple[int, int]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-class NMS of one image's candidates and its top `detections_per_img`."""
        keep = batched_nms(boxes, scores, labels, self.nms_thresh, image_shape, compiled=self.compiled_nms)
        keep = keep[: self.detections_per_img]
        return boxes[keep], scores[keep], labels[keep]

    def _detections_in_image(
        self, boxes: Tensor, scores: Tensor, image_shape: tuple[int, int]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One detection per (RoI, foreground class) above `score_thresh`, then per-class NMS and the top
        `detections_per_img`. `boxes` [R, K+1, 4], `scores` [R, K+1]."""
        boxes = box_ops.clip_boxes_to_image(boxes, image_shape)
        labels = torch.arange(scores.shape[1], device=scores.device).view(1, -1).expand_as(scores)
        # Column 0 is the background: never a detection.
        boxes, scores, labels = boxes[:, 1:].reshape(-1, 4), scores[:, 1:].flatten(), labels[:, 1:].flatten()
        keep = torch.where(scores > self.score_thresh)[0]
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = box_ops.remove_small_boxes(boxes, min_size=1e-2)
        return self._nms_in_image(boxes[keep], scores[keep], labels[keep], image_shape)

    def _mask_branch(self, batch: _Batch) -> dict[str, Tensor]:
        """Training: ``loss_mask`` on the foreground RoIs. Eval: adds ``masks`` to each detection dict."""
        features, image_shapes, targets, samples, result = batch
        if (
            samples is None
            and torch.compiler.is_exporting()
            and isinstance(self.mask_predictor, MaskPredictor)
        ):
            return self._fixed_capacity_mask_branch(batch)
        boxes, matched = _branch_boxes(samples, result)
        mask_features = self.mask_head(self.mask_roi_pool(features, boxes, image_shapes))
        if not isinstance(self.mask_predictor, MaskPredictor):  # e.g. torchvision's: logits of every class
            return self._all_class_mask_branch(mask_features, boxes, matched, batch)
        if samples is not None:
            gt_labels = torch.cat([t["labels"][index] for t, index in zip(targets, matched)])
            mask_logits = self.mask_predictor(mask_features, gt_labels)
            return {"loss_mask": mask_loss(mask_logits, boxes, [t["masks"] for t in targets], matched)}
        labels = [detection["labels"] for detection in result]
        probabilities = self.mask_predictor(mask_features, torch.cat(labels)).sigmoid()
        for image_probabilities, detection in zip(probabilities.split([b.shape[0] for b in labels]), result):
            detection["masks"] = image_probabilities
        return {}

    def _has_fixed_capacity_masks(self) -> bool:
        return isinstance(self.mask_predictor, MaskPredictor) and isinstance(
            self.mask_roi_pool, MultiScaleRoIAlign
        )

    def _fixed_capacity_mask_branch(self, batch: _Batch) -> dict[str, Tensor]:
        """The eval mask branch under ``torch.export``: each image's detections padded to
        ``detections_per_img`` before the mask head, the masks of the real ones kept (same values).

        AOTInductor (torch 2.14.1, CPU) computes the mask head's reductions wrong when the number of RoIs
        depends on the data (logits off by ~1, while the box head's are right); on a fixed number they are
        right (the RoIs pooled from every FPN level, `MultiScaleRoIAlign`'s ``every_level``, so that no size
        depends on the data), and the other targets give the same masks either way."""
        features, image_shapes, _, _, result = batch
        capacity = self.detections_per_img
        boxes, labels = [], []
        for detection in result:
            count = detection["boxes"].shape[0]
            torch._check(count <= capacity)
            boxes.append(F.pad(detection["boxes"], (0, 0, 0, capacity - count)))
            labels.append(F.pad(detection["labels"], (0, capacity - count), value=1))
        pooled = self.mask_roi_pool(features, boxes, image_shapes, every_level=True)
        probabilities = self.mask_predictor(self.mask_head(pooled), torch.cat(labels)).sigmoid()
        for image_probabilities, detection in zip(probabilities.split(capacity), result):
            detection["masks"] = image_probabilities[: detection["boxes"].shape[0]]
        return {}

    def _all_class_mask_branch(
        self, mask_features: Tensor, boxes: list[Tensor], matched: list[Tensor], batch: _Batch
    ) -> dict[str, Tensor]:
        """The mask branch for predictors that return every class's logits (torchvision's functions)."""
        mask_logits = self.mask_predictor(mask_features)
        if batch.samples is not None:
            gt_masks = [t["masks"] for t in batch.targets]
            gt_labels = [t["labels"] for t in batch.targets]
            return {"loss_mask": maskrcnn_loss(mask_logits, boxes, gt_masks, gt_labels, matched)}
        labels = [detection["labels"] for detection in batch.result]
        for probabilities, detection in zip(maskrcnn_inference(mask_logits, labels), batch.result):
            detection["masks"] = probabilities
        return {}

    def _keypoint_branch(self, batch: _Batch) -> dict[str, Tensor]:
        """Training: ``loss_keypoint``. Eval: adds ``keypoints`` and ``keypoints_scores`` to each detection."""
        features, image_shapes, targets, samples, result = batch
        boxes, matched = _branch_boxes(samples, result)
        features = self.keypoint_head(self.keypoint_roi_pool(features, boxes, image_shapes))
        keypoint_logits = self.keypoint_predictor(features)
        if samples is not None:
            gt_keypoints = [t["keypoints"] for t in targets]
            loss = keypointrcnn_loss(keypoint_logits, boxes, gt_keypoints, matched)
            return {"loss_keypoint": loss}
        keypoints, scores = keypointrcnn_inference(keypoint_logits, boxes)
        for detection, image_keypoints, image_scores in zip(result, keypoints, scores):
            detection["keypoints"] = image_keypoints
            detection["keypoints_scores"] = image_scores
        return {}
