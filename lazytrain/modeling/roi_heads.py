"""`RoIHeads`: torchvision's RoI heads whose box branch asks the box predictor's loss how to train and score.

torchvision's `RoIHeads.forward` calls the module-level ``fastrcnn_loss`` (softmax cross-entropy) and its
``postprocess_detections`` scores with a softmax, so a sigmoid loss would train one way and rank detections
another. This subclass asks ``box_predictor.loss`` (a `ClassificationLoss`; softmax cross-entropy when the
predictor has none, as torchvision's own predictors) for the classification loss and for the scores.

Everything else is torchvision's: the constructor and attribute names (so torchvision checkpoints and
config keys such as ``model.roi_heads.score_thresh`` keep working), the matching and sampling of the training
RoIs (`SampledRoIs`; for the batch at once), the smooth L1 box loss (`lazytrain.modeling.roi_losses`), the
selection of the detections (clip, score threshold, small boxes, per-class NMS, top detections;
`lazytrain.modeling.box_selection`), and the keypoint branch (torchvision's loss and inference functions). The mask branch
asks a `MaskPredictor` for the logits of one class per RoI (the ground-truth class in training, the detected
class in eval) instead of all K+1 (torchvision's predictor still gets torchvision's functions). With softmax
cross-entropy it gives torchvision's losses and detections: exactly for boxes and keypoints, within float
rounding for masks (tests/modeling/test_roi_heads.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.models.detection.roi_heads import RoIHeads as TorchvisionRoIHeads
from torchvision.models.detection.roi_heads import (
    keypointrcnn_inference,
    keypointrcnn_loss,
    maskrcnn_inference,
    maskrcnn_loss,
)

from lazytrain.modeling.box_coding import BoxCoder
from lazytrain.modeling.box_selection import DETECTION_MIN_SIZE, select_detections
from lazytrain.modeling.classification_losses import ClassificationLoss
from lazytrain.modeling.heads import MaskPredictor
from lazytrain.modeling.matching import Matcher, gather_boxes, match_rois
from lazytrain.modeling.roi_losses import box_losses, get_predictor_loss, mask_loss
from lazytrain.modeling.sampling import BalancedMaskSampler

__all__ = ["BranchInputs", "RoIHeads", "SampledRoIs", "detection_dicts"]


class SampledRoIs(NamedTuple):
    """The training RoIs of each image (proposals and ground-truth boxes, sampled) and what they were matched
    to: per image the RoIs [R_i, 4], each one's matched ground-truth index, class (0: background) and box
    regression target."""

    proposals: list[Tensor]
    matched_idxs: list[Tensor]
    labels: list[Tensor]
    regression_targets: list[Tensor]
    # Per image, how many of its RoIs are foreground when those come first (`RoIHeads.select_training_samples`
    # with a `BalancedMaskSampler`); None when the RoIs are in torchvision's order.
    num_foreground: list[int] | None = None


class BranchInputs(NamedTuple):
    """What the branches of the RoI heads (box, mask, keypoint) take of one forward pass: the feature maps the
    poolers read, the images' sizes and, in training, the targets and the sampled RoIs (both None in eval)."""

    features: dict[str, Tensor]
    image_shapes: list[tuple[int, int]]
    targets: list[dict[str, Tensor]] | None
    samples: SampledRoIs | None


def _check_target_types(targets: list[dict[str, Tensor]], keypoints: bool) -> None:
    for target in targets:
        if target["boxes"].dtype not in (torch.float, torch.double, torch.half):
            raise TypeError(f"RoIHeads: target boxes must be floating point; got {target['boxes'].dtype}")
        if target["labels"].dtype != torch.int64:
            raise TypeError(f"RoIHeads: target labels must be int64; got {target['labels'].dtype}")
        if keypoints and target["keypoints"].dtype != torch.float32:
            raise TypeError(f"RoIHeads: target keypoints must be float32; got {target['keypoints'].dtype}")


def _foreground(samples: SampledRoIs) -> tuple[list[Tensor], list[Tensor]]:
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


def _branch_boxes(samples: SampledRoIs | None, result: list[dict[str, Tensor]]) -> tuple[list[Tensor], list]:
    """The boxes a mask or keypoint branch pools: in training the foreground RoIs (and their matched target
    index), in eval the detections (no match)."""
    if samples is not None:
        return _foreground(samples)
    return [detection["boxes"] for detection in result], []


def detection_dicts(
    boxes: list[Tensor], scores: list[Tensor], labels: list[Tensor]
) -> list[dict[str, Tensor]]:
    """Per image, torchvision's detection dict (``boxes``, ``labels``, ``scores``) of the selected detections."""
    return [{"boxes": b, "labels": c, "scores": s} for b, s, c in zip(boxes, scores, labels)]


class RoIHeads(TorchvisionRoIHeads):
    """torchvision's `RoIHeads` (same arguments) whose classification loss and inference scores come from
    ``box_predictor.loss`` (`lazytrain.modeling.BoxPredictor(loss=...)`; softmax cross-entropy if absent).

    Training returns ``loss_classifier`` (whatever the loss), ``loss_box_reg`` and, with a mask or keypoint
    head, ``loss_mask``/``loss_keypoint``; eval returns torchvision's detections, ranked by the loss's scores.

    Two arguments of its own, keyword only: ``compiled_nms`` (default False), the per-class NMS of the
    detections in ``torch.compile``d kernels where it runs grouped (`lazytrain.modeling.nms.batched_nms`: on a
    device above 100,000 box coordinates per image, as LVIS's 1,203 classes at score threshold 1e-4 give;
    torchvision's ``nms`` elsewhere, unchanged; the same detections, the first such call compiles); and
    ``detections_per_class`` (default None: no limit), at most that many detections of each class per image
    before the ``detections_per_img`` cut, the per-class top-k of AP-fixed's inference (Dave et al.);
    ``detection_min_size`` (default torchvision's 0.01 px), detections narrower or lower are dropped before
    NMS (detectron2 keeps them: 0).
    """

    def __init__(
        self,
        *args: Any,
        compiled_nms: bool = False,
        detections_per_class: int | None = None,
        detection_min_size: float = DETECTION_MIN_SIZE,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if detections_per_class is not None and (
            not isinstance(detections_per_class, int)
            or isinstance(detections_per_class, bool)
            or detections_per_class < 1
        ):
            raise ValueError(
                "RoIHeads(detections_per_class=) (model.roi_heads.detections_per_class) must be an integer >= 1, "
                f"or null for no limit; got {detections_per_class!r}"
            )
        self.compiled_nms = compiled_nms
        self.detections_per_class = detections_per_class
        self.detection_min_size = float(detection_min_size)
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
    ) -> SampledRoIs:
        """Per image, the sampled RoIs (the ground-truth boxes added to the proposals), their matched
        ground-truth index, class (0: background) and box regression target.

        With a `BalancedMaskSampler` (the default) the images are matched at once (`match_rois`), each
        image's foreground RoIs come first, then its background, each in proposal order, and the sampling
        costs one host read for the whole batch (torchvision's sampler: three per image); with torchvision's
        sampler, torchvision's method and order.
        """
        if not isinstance(self.fg_bg_sampler, BalancedMaskSampler):
            return SampledRoIs(*super().select_training_samples(proposals, targets))
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
        return SampledRoIs(*sampled, num_foreground)

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
        if targets is not None:
            _check_target_types(targets, self.has_keypoint())
        samples = self.select_training_samples(proposals, targets) if self.training else None
        inputs = BranchInputs(self._pooled_maps_in_float32(features), image_shapes, targets, samples)
        result, losses = self._run_box_branch(inputs, proposals)
        # The mask branch trains on the sampled foreground RoIs (a cascade's: its first stage's, as detectron2).
        losses.update(self._run_branches(inputs, result))
        return result, losses

    def _run_box_branch(
        self, inputs: BranchInputs, proposals: list[Tensor]
    ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        """The box head and predictor on the sampled RoIs (training: the box losses, no detections) or on the
        proposals (eval: the detections, no losses)."""
        features, image_shapes, _, samples = inputs
        proposals = proposals if samples is None else samples.proposals
        box_features = self.box_head(self.box_roi_pool(features, proposals, image_shapes))
        class_logits, box_regression = self.box_predictor(box_features)
        if samples is not None:
            return [], self.box_losses(
                class_logits, box_regression, samples.labels, samples.regression_targets
            )
        boxes, scores, labels = self.postprocess_detections(
            class_logits, box_regression, proposals, image_shapes
        )
        return detection_dicts(boxes, scores, labels), {}

    def _run_branches(self, inputs: BranchInputs, result: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        """The mask and keypoint branches: their losses in training, their outputs added to the detections
        `result` in eval."""
        losses = {}
        if self.has_mask():
            losses.update(self._mask_branch(inputs, result))
        if self.has_keypoint():
            losses.update(self._keypoint_branch(inputs, result))
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
        [R, K+1, 4] and scores [R, K+1] (`lazytrain.modeling.box_selection.select_detections` with these
        heads' ``score_thresh``, ``nms_thresh``, ``detections_per_img``, ``detections_per_class`` and
        ``compiled_nms``)."""
        return select_detections(
            boxes, scores, proposals, image_shapes, score_thresh=self.score_thresh, nms_thresh=self.nms_thresh,
            detections_per_img=self.detections_per_img, compiled_nms=self.compiled_nms,
            detections_per_class=self.detections_per_class, min_size=self.detection_min_size,
        )  # fmt: skip

    def _mask_branch(self, inputs: BranchInputs, result: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        """Training: ``loss_mask`` on the foreground RoIs. Eval: adds ``masks`` to each detection dict."""
        features, image_shapes, targets, samples = inputs
        if (
            samples is None
            and torch.compiler.is_exporting()
            and isinstance(self.mask_predictor, MaskPredictor)
        ):
            return self._fixed_capacity_mask_branch(inputs, result)
        boxes, matched = _branch_boxes(samples, result)
        mask_features = self.mask_head(self.mask_roi_pool(features, boxes, image_shapes))
        if not isinstance(self.mask_predictor, MaskPredictor):  # e.g. torchvision's: logits of every class
            return self._all_class_mask_branch(mask_features, boxes, matched, inputs, result)
        if samples is not None:
            gt_labels = torch.cat([t["labels"][index] for t, index in zip(targets, matched)])
            mask_logits = self.mask_predictor(mask_features, gt_labels)
            return {"loss_mask": mask_loss(mask_logits, boxes, [t["masks"] for t in targets], matched)}
        labels = [detection["labels"] for detection in result]
        probabilities = self.mask_predictor(mask_features, torch.cat(labels)).sigmoid()
        for image_probabilities, detection in zip(probabilities.split([b.shape[0] for b in labels]), result):
            detection["masks"] = image_probabilities
        return {}

    def _fixed_capacity_mask_branch(
        self, inputs: BranchInputs, result: list[dict[str, Tensor]]
    ) -> dict[str, Tensor]:
        """The eval mask branch under ``torch.export``: each image's detections padded to
        ``detections_per_img`` before the mask head, the masks of the real ones kept (same values).

        AOTInductor on the CPU computes the mask head's reductions wrong when the number of RoIs depends on
        the data (docs/benchmarks.md, "modeling"), while the box head's are right; on a fixed number they are
        right (the RoIs pooled from every FPN level, `MultiScaleRoIAlign`'s ``every_level``, so that no size
        depends on the data), and the other targets give the same masks either way."""
        features, image_shapes = inputs.features, inputs.image_shapes
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
        self,
        mask_features: Tensor,
        boxes: list[Tensor],
        matched: list[Tensor],
        inputs: BranchInputs,
        result: list[dict[str, Tensor]],
    ) -> dict[str, Tensor]:
        """The mask branch for predictors that return every class's logits (torchvision's functions)."""
        mask_logits = self.mask_predictor(mask_features)
        if inputs.samples is not None:
            gt_masks = [t["masks"] for t in inputs.targets]
            gt_labels = [t["labels"] for t in inputs.targets]
            return {"loss_mask": maskrcnn_loss(mask_logits, boxes, gt_masks, gt_labels, matched)}
        labels = [detection["labels"] for detection in result]
        for probabilities, detection in zip(maskrcnn_inference(mask_logits, labels), result):
            detection["masks"] = probabilities
        return {}

    def _keypoint_branch(self, inputs: BranchInputs, result: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        """Training: ``loss_keypoint``. Eval: adds ``keypoints`` and ``keypoints_scores`` to each detection."""
        features, image_shapes, targets, samples = inputs
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
