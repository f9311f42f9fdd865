"""The RoI heads' training losses: the classification loss a box predictor carries (`get_predictor_loss`),
torchvision's Fast R-CNN box regression loss without host syncs (`box_regression_loss`), both together per box
stage (`box_losses`), and the mask loss on one class's logits per RoI (`mask_loss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.roi_heads import project_masks_on_boxes

from lazytrain.modeling.classification_losses import ClassificationLoss, SoftmaxCrossEntropy

__all__ = ["box_losses", "box_regression_loss", "get_predictor_loss", "mask_loss"]

_DEFAULT_LOSS = SoftmaxCrossEntropy()  # stateless, so one instance serves every model


def box_regression_loss(
    box_regression: Tensor, labels: Tensor, regression_targets: Tensor, *, normalizer: Tensor | None = None
) -> Tensor:
    """Smooth L1 (beta 1/9) between the foreground RoIs' deltas for their class and their targets, summed
    and divided by the number of RoIs (torchvision's Fast R-CNN box loss), or by `normalizer` (the number of
    valid RoIs, where padding rows labelled 0 are among them: `lazytrain.modeling.fixed_shapes`).

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
    total = per_coordinate.masked_fill(~foreground, 0.0).sum()
    return total / (labels.numel() if normalizer is None else normalizer)


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
