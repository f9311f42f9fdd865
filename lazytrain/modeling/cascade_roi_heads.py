"""`CascadeRoIHeads`: the box branch of Cascade R-CNN (Cai & Vasconcelos, CVPR 2018, arXiv:1712.00726).

Three box stages (by default) refine the RoIs in turn, each trained at a higher IoU (0.5, 0.6, 0.7) with its
own box head, class-agnostic predictor and finer box coder. The behaviour follows detectron2's
``CascadeROIHeads``:

- stage 1 trains on the sampled proposals (ground truth added), as `RoIHeads` does; each later stage takes the
  previous stage's regressed boxes (detached, clipped to the image) and relabels them at its own IoU, without
  sampling again;
- the losses of all stages are summed (``loss_classifier_stage0``, ``loss_box_reg_stage0``, ...), and the
  gradient each stage sends into the shared feature maps is scaled by 1 / number of stages;
- at inference the class scores are the mean of the stages' scores (each from its predictor's classification
  loss, so a sigmoid loss scores with sigmoids), the boxes the last stage's regression;
- the mask branch trains on the first stage's foreground RoIs (as detectron2 does) and predicts on the final
  detections.

Two differences from detectron2: a later stage keeps RoIs whose regressed box became empty after clipping
(they are background, IoU 0, and dropping them would make the host read how many are left), and the box
loss is `RoIHeads`'s (smooth L1 with beta 1/9, torchvision's; detectron2's cascade uses beta 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.box_coding import BoxCoder
from lazytrain.modeling.classification_losses import ClassificationLoss
from lazytrain.modeling.matching import Matcher, gather_boxes, match_rois
from lazytrain.modeling.roi_heads import BranchInputs, RoIHeads, detection_dicts
from lazytrain.modeling.roi_losses import box_losses, get_predictor_loss

__all__ = ["CascadeRoIHeads"]

# detectron2's Cascade R-CNN settings: each stage's IoU threshold and box coder weights (the finer weights
# keep the later stages' smaller deltas at about unit scale).
DEFAULT_STAGE_IOU_THRESHOLDS = (0.5, 0.6, 0.7)
DEFAULT_STAGE_BBOX_REG_WEIGHTS = ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0))


class _ScaleGradient(torch.autograd.Function):
    """The identity forward; the gradient multiplied by `scale` backward."""

    @staticmethod
    def forward(ctx, tensor: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


class _Stage(NamedTuple):
    """One stage's outputs for the RoIs it ran on; `labels` and `regression_targets` in training only."""

    class_logits: Tensor
    box_regression: Tensor
    proposals: list[Tensor]
    labels: list[Tensor] | None
    regression_targets: list[Tensor] | None


def _check_stages(
    box_heads: Sequence[nn.Module],
    box_predictors: Sequence[nn.Module],
    iou_thresholds: Sequence[float],
    bbox_reg_weights: Sequence[Sequence[float]],
) -> None:
    counts = {
        "box_heads": len(box_heads),
        "box_predictors": len(box_predictors),
        "stage_iou_thresholds": len(iou_thresholds),
        "stage_bbox_reg_weights": len(bbox_reg_weights),
    }
    if len(set(counts.values())) != 1 or not box_heads:
        raise ValueError(
            f"CascadeRoIHeads: box_heads, box_predictors, stage_iou_thresholds and stage_bbox_reg_weights need "
            f"one entry per stage (at least one); got {counts}. Give each list as many entries as stages."
        )
    for stage, weights in enumerate(bbox_reg_weights):
        if len(weights) != 4:
            raise ValueError(
                f"CascadeRoIHeads(stage_bbox_reg_weights=) needs 4 weights (x, y, w, h) per stage; stage "
                f"{stage} has {list(weights)}"
            )
    for stage, threshold in enumerate(iou_thresholds):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(
                f"CascadeRoIHeads(stage_iou_thresholds=) must be in (0, 1]; stage {stage}: {threshold}"
            )
    for stage, predictor in enumerate(box_predictors):
        _check_class_agnostic(stage, predictor)
    _check_own_losses(box_predictors)


def _check_class_agnostic(stage: int, predictor: nn.Module) -> None:
    """A predictor with a linear ``bbox_pred`` must give 4 deltas per RoI (other predictors are checked when
    they run)."""
    bbox_pred = getattr(predictor, "bbox_pred", None)
    if isinstance(bbox_pred, nn.Linear) and bbox_pred.out_features != 4:
        raise ValueError(
            f"CascadeRoIHeads(box_predictors=) stage {stage}: {type(predictor).__name__} regresses "
            f"{bbox_pred.out_features} deltas per RoI; the cascade needs class-agnostic regression (4). "
            "Build it with cls_agnostic_bbox_reg=True."
        )


def _check_own_losses(box_predictors: Sequence[nn.Module]) -> None:
    """Stateful losses (EQLv2's gradient statistics, Seesaw's class counts) must not be shared by stages."""
    seen: dict[int, int] = {}
    for stage, predictor in enumerate(box_predictors):
        loss = get_predictor_loss(predictor)
        has_state = any(True for _ in loss.buffers()) or any(True for _ in loss.parameters())
        if has_state and id(loss) in seen:
            raise ValueError(
                f"CascadeRoIHeads(box_predictors=): stages {seen[id(loss)]} and {stage} share one "
                f"{type(loss).__name__}, whose state would mix the stages' statistics. Give each stage its own "
                "loss: copy.deepcopy(loss) in Python, L(copy.deepcopy)('${losses.${losses.use}}') in a config."
            )
        seen[id(loss)] = stage


class CascadeRoIHeads(RoIHeads):
    """Cascade R-CNN box stages with `RoIHeads`'s sampling, losses, postprocessing and mask branch.

    The modules are stored as ``box_head`` and ``box_predictor`` `nn.ModuleList`s (state dict keys
    ``roi_heads.box_head.0.fc6.weight``, ``roi_heads.box_predictor.2.cls_score.weight``, ...). Training
    returns ``loss_classifier_stage{k}`` and ``loss_box_reg_stage{k}`` per stage and ``loss_mask``; eval
    returns detections as `RoIHeads` does. More or fewer stages: give every per-stage list that many entries.

    Args:
        box_roi_pool: the RoI pooler all stages share.
        box_heads: one box head per stage.
        box_predictors: one predictor per stage, with class-agnostic regression
            (``BoxPredictor(..., cls_agnostic_bbox_reg=True)``); each carries its own classification loss.
        stage_iou_thresholds: the IoU at which each stage's RoIs count as foreground.
        stage_bbox_reg_weights: each stage's box coder weights (x, y, w, h).
        batch_size_per_image, positive_fraction: the first stage's sampling (`RoIHeads`'s).
        score_thresh, nms_thresh, detections_per_img: the postprocessing (`RoIHeads`'s).
        mask_roi_pool, mask_head, mask_predictor: the mask branch (all None: no masks).
        compiled_nms: the detections' per-class NMS in compiled kernels where it runs grouped (`RoIHeads`'s).
        detections_per_class: at most that many detections of each class per image (`RoIHeads`'s; None: no
            limit).
    """

    def __init__(
        self,
        box_roi_pool: nn.Module,
        box_heads: Sequence[nn.Module],
        box_predictors: Sequence[nn.Module],
        *,
        stage_iou_thresholds: Sequence[float] = DEFAULT_STAGE_IOU_THRESHOLDS,
        stage_bbox_reg_weights: Sequence[Sequence[float]] = DEFAULT_STAGE_BBOX_REG_WEIGHTS,
        batch_size_per_image: int = 512,
        positive_fraction: float = 0.25,
        score_thresh: float = 0.05,
        nms_thresh: float = 0.5,
        detections_per_img: int = 100,
        mask_roi_pool: nn.Module | None = None,
        mask_head: nn.Module | None = None,
        mask_predictor: nn.Module | None = None,
        compiled_nms: bool = False,
        detections_per_class: int | None = None,
    ) -> None:
        _check_stages(box_heads, box_predictors, stage_iou_thresholds, stage_bbox_reg_weights)
        weights = [tuple(float(w) for w in stage_weights) for stage_weights in stage_bbox_reg_weights]
        first_iou = float(stage_iou_thresholds[0])
        super().__init__(
            box_roi_pool, nn.ModuleList(box_heads), nn.ModuleList(box_predictors),
            first_iou, first_iou, batch_size_per_image, positive_fraction, weights[0],
            score_thresh, nms_thresh, detections_per_img,
            mask_roi_pool=mask_roi_pool, mask_head=mask_head, mask_predictor=mask_predictor,
            compiled_nms=compiled_nms, detections_per_class=detections_per_class,
        )  # fmt: skip
        # Stage 0 matches and encodes with RoIHeads' own matcher and coder (the same threshold and weights).
        self.stage_box_coders = [BoxCoder(w, self.box_coder.bbox_xform_clip) for w in weights]
        self.stage_matchers = [Matcher(float(t), float(t), False) for t in stage_iou_thresholds]

    @property
    def num_stages(self) -> int:
        """How many box stages run (the length of ``box_head``)."""
        return len(self.box_head)

    def get_classification_loss(self, stage: int = -1) -> ClassificationLoss:
        """The classification loss of `stage`'s predictor (the last stage's by default)."""
        return get_predictor_loss(self.box_predictor[stage])

    def _run_box_branch(
        self, inputs: BranchInputs, proposals: list[Tensor]
    ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        """Every box stage in turn: each stage's box losses in training (no detections), the detections in
        eval (no losses)."""
        stages = self._run_box_stages(inputs, proposals)
        if inputs.samples is None:
            return detection_dicts(*self._detect(stages, inputs.image_shapes)), {}
        losses: dict[str, Tensor] = {}
        for index, stage in enumerate(stages):
            loss = self.get_classification_loss(index)
            stage_losses = box_losses(
                loss, stage.class_logits, stage.box_regression, stage.labels, stage.regression_targets
            )
            losses.update({f"{name}_stage{index}": value for name, value in stage_losses.items()})
        return [], losses

    def _run_box_stages(self, inputs: BranchInputs, proposals: list[Tensor]) -> list[_Stage]:
        """Every stage in turn, each on the previous stage's regressed boxes (the first on the sampled RoIs in
        training, on the proposals in eval)."""
        features, image_shapes, targets, samples = inputs
        labels = regression_targets = None
        if samples is not None:
            proposals, labels, regression_targets = (
                samples.proposals,
                samples.labels,
                samples.regression_targets,
            )
        stages: list[_Stage] = []
        for index in range(self.num_stages):
            if index > 0:
                proposals = self._refined_boxes(index - 1, stages[-1], image_shapes)
                if samples is not None:
                    labels, regression_targets = self.label_proposals(index, proposals, targets)
            class_logits, box_regression = self._run_box_stage(index, features, proposals, image_shapes)
            stages.append(_Stage(class_logits, box_regression, proposals, labels, regression_targets))
        return stages

    def _run_box_stage(
        self,
        index: int,
        features: dict[str, Tensor],
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
    ) -> tuple[Tensor, Tensor]:
        box_features = self.box_roi_pool(features, proposals, image_shapes)
        if self.training:
            # Summing the stages' losses would send the shared features num_stages times the gradient; the
            # paper averages the losses instead, which would also shrink the heads' own gradients.
            box_features = _ScaleGradient.apply(box_features, 1.0 / self.num_stages)
        class_logits, box_regression = self.box_predictor[index](self.box_head[index](box_features))
        # Checked in training only: a shape test in eval would be frozen into (and warned about by) an export.
        if self.training and box_regression.shape[1] != 4:
            raise ValueError(
                f"CascadeRoIHeads: box_predictors[{index}] gave {box_regression.shape[1]} box deltas per RoI; "
                "the cascade needs class-agnostic regression (4). Build it with cls_agnostic_bbox_reg=True."
            )
        return class_logits, box_regression

    def _refined_boxes(self, index: int, stage: _Stage, image_shapes: list[tuple[int, int]]) -> list[Tensor]:
        """Stage `index`'s regressed boxes, clipped to each image; no gradient flows back through them (they
        are the next stage's proposals, as the RPN's are the first stage's)."""
        boxes = self.stage_box_coders[index].decode(stage.box_regression.detach(), stage.proposals)[:, 0]
        per_image = [p.shape[0] for p in stage.proposals]
        return [
            box_ops.clip_boxes_to_image(image_boxes, shape)
            for image_boxes, shape in zip(boxes.split(per_image), image_shapes)
        ]

    @torch.no_grad()
    def label_proposals(
        self, stage: int, proposals: list[Tensor], targets: list[dict[str, Tensor]]
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Per image, each RoI's class (0: background, IoU below `stage`'s threshold with every ground-truth
        box) and its regression target under `stage`'s box coder; no sampling, no host sync.

        Args:
            stage: the stage whose IoU threshold and box coder apply.
            proposals: per image, the RoIs [R_i, 4].
            targets: per image, ``boxes`` [G_i, 4] and ``labels`` [G_i].
        """
        gt_boxes = [target["boxes"].to(proposals[0].dtype) for target in targets]
        gt_labels = [target["labels"] for target in targets]
        match = match_rois(self.stage_matchers[stage], proposals, gt_boxes, gt_labels)
        matched_boxes = gather_boxes(match.gt.boxes, match.index)
        codes = self.stage_box_coders[stage].encode_single(
            matched_boxes.flatten(0, 1), match.rois.boxes.flatten(0, 1)
        )
        codes = codes.view_as(matched_boxes)
        counts = [boxes.shape[0] for boxes in proposals]
        labels = [match.labels[image, :count] for image, count in enumerate(counts)]
        return labels, [codes[image, :count] for image, count in enumerate(counts)]

    def _detect(
        self, stages: list[_Stage], image_shapes: list[tuple[int, int]]
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """The detections: the mean of the stages' scores for the last stage's RoIs, the last stage's boxes."""
        scores = sum(
            self.get_classification_loss(index).scores(stage.class_logits)
            for index, stage in enumerate(stages)
        )
        scores = scores / len(stages)
        last = stages[-1]
        # Class-agnostic: the same box for every class.
        boxes = self.stage_box_coders[-1].decode(last.box_regression, last.proposals)
        boxes = boxes.expand(-1, scores.shape[1], -1)
        return self.select_detections(boxes, scores, last.proposals, image_shapes)
