"""Box and mask predictors whose ``num_classes`` counts foreground classes only.

torchvision's predictors count the background as class 0, so a config would need ``num_classes + 1`` in two
places. These subclasses add the background themselves. Parameter names (``cls_score``, ``bbox_pred``,
``conv5_mask``, ``mask_fcn_logits``) stay torchvision's, so torchvision checkpoints load into them.

A box predictor carries the classification ``loss`` (`lazytrain.modeling.classification_losses`) that
`lazytrain.modeling.RoIHeads` trains its class logits with and scores detections with; the default, softmax
cross-entropy, has no state, so the state dict stays torchvision's. `CosineBoxPredictor` is the normalised
cosine classifier.

They start from small outputs (normal init with a small std, as detectron2 does). torchvision's fan-out
init of the 1x1 mask-logit conv over few classes gives logits of std ~5 and an initial mask loss ~10, which
sends a randomly initialised model at lr 0.01 to NaN within ten steps unless gradients are clipped.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor

from lazytrain.modeling.classification_losses import ClassificationLoss, SoftmaxCrossEntropy

__all__ = ["BoxPredictor", "CosineBoxPredictor", "MaskPredictor"]


def _check_num_classes(owner: str, num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(
            f"{owner}(num_classes=) must be the number of foreground classes (an int >= 1); got {num_classes!r}"
        )


def _check_loss(owner: str, loss: ClassificationLoss | None, num_classes: int) -> ClassificationLoss:
    if loss is None:
        return SoftmaxCrossEntropy()
    if not isinstance(loss, ClassificationLoss):
        raise ValueError(
            f"{owner}(loss=) must be a ClassificationLoss (lazytrain.modeling.classification_losses, e.g. "
            f"L(FederatedLoss)(...), or losses.use=NAME in a recipe); got {type(loss).__name__}"
        )
    if loss.num_classes is not None and loss.num_classes != num_classes:
        raise ValueError(
            f"{owner}(num_classes={num_classes}) disagrees with its loss {type(loss).__name__}(num_classes="
            f"{loss.num_classes}); set the loss's from the predictor's (num_classes='${{..num_classes}}')."
        )
    return loss


class BoxPredictor(FastRCNNPredictor):
    """Class scores and per-class box deltas for ``num_classes`` foreground classes plus the background.

    Args:
        in_channels: width of the box head output (e.g. ``TwoMLPHead``'s ``representation_size``).
        num_classes: foreground classes; the background logit is added.
        loss: the classification loss and inference scoring (`SoftmaxCrossEntropy` when None); used by
            `lazytrain.modeling.RoIHeads` (torchvision's `RoIHeads` always uses softmax cross-entropy).
        cls_agnostic_bbox_reg: one set of 4 box deltas per RoI instead of one per class (detectron2's
            name); `lazytrain.modeling.CascadeRoIHeads` requires it.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        loss: ClassificationLoss | None = None,
        *,
        cls_agnostic_bbox_reg: bool = False,
    ) -> None:
        _check_num_classes("BoxPredictor", num_classes)
        super().__init__(in_channels, num_classes + 1)
        if cls_agnostic_bbox_reg:
            self.bbox_pred = nn.Linear(in_channels, 4)
        self.num_classes = num_classes
        self.loss = _check_loss("BoxPredictor", loss, num_classes)
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        for layer in (self.cls_score, self.bbox_pred):
            nn.init.zeros_(layer.bias)


class CosineBoxPredictor(nn.Module):
    """`BoxPredictor` with a normalised cosine classifier: class logits ``scale * cos(x, w_c)``.

    The RoI feature x and each class's weight row w_c (the background's too) are divided by their L2 norm,
    so a class's logit depends on the feature's direction only and no class wins by a larger weight norm,
    which long-tailed training gives the frequent classes (DisAlign, Zhang et al. 2021, arXiv:2103.16370;
    "Frustratingly Simple Few-Shot Object Detection" (TFA), Wang et al. 2020, arXiv:2003.06957). As in TFA's
    ``CosineSimOutputLayers`` ``cls_score`` has no bias, and the gradient flows through the normalisation
    (as mmdetection's ``NormedLinear``; TFA normalises the stored weights in place instead). Box regression
    is `BoxPredictor`'s. Parameter names are torchvision's, so a torchvision checkpoint loads except
    ``cls_score.bias``.

    Args:
        in_channels: width of the box head output.
        num_classes: foreground classes; the background logit is added.
        scale: the temperature multiplying the cosine, bounding the logits to [-scale, scale] (TFA: 20;
            mmdetection's ``NormedLinear(tempearture=20)``).
        loss: the classification loss (`SoftmaxCrossEntropy` when None), as for `BoxPredictor`.
        cls_agnostic_bbox_reg: 4 box deltas per RoI instead of one set per class, as for `BoxPredictor`.
    """

    eps = 1e-6  # added to the norms: a zero feature (all ReLUs off) gives logits 0, not NaN

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        scale: float = 20.0,
        loss: ClassificationLoss | None = None,
        *,
        cls_agnostic_bbox_reg: bool = False,
    ) -> None:
        _check_num_classes("CosineBoxPredictor", num_classes)
        if not float(scale) > 0:
            raise ValueError(f"CosineBoxPredictor(scale=) must be > 0 (TFA uses 20); got {scale!r}")
        super().__init__()
        self.cls_score = nn.Linear(in_channels, num_classes + 1, bias=False)
        self.bbox_pred = nn.Linear(in_channels, 4 if cls_agnostic_bbox_reg else (num_classes + 1) * 4)
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.bbox_pred.bias)
        self.num_classes = num_classes
        self.scale = float(scale)
        self.loss = _check_loss("CosineBoxPredictor", loss, num_classes)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = x.flatten(start_dim=1)
        features = x / (x.norm(dim=1, keepdim=True) + self.eps)
        weight = self.cls_score.weight
        weight = weight / (weight.norm(dim=1, keepdim=True) + self.eps)
        return self.scale * (features @ weight.t()), self.bbox_pred(x)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, scale={self.scale}"


class MaskPredictor(MaskRCNNPredictor):
    """Per-class mask logits (upsampling deconv + 1x1 conv) for ``num_classes`` foreground classes.

    Args:
        in_channels: channels of the mask head output (the last entry of ``MaskRCNNHeads(layers=)``).
        dim_reduced: channels after the 2x upsampling deconvolution.
        num_classes: foreground classes; the background channel is added.
    """

    def __init__(self, in_channels: int, dim_reduced: int, num_classes: int) -> None:
        _check_num_classes("MaskPredictor", num_classes)
        super().__init__(in_channels, dim_reduced, num_classes + 1)
        self.num_classes = num_classes
        nn.init.normal_(self.mask_fcn_logits.weight, std=0.001)
        nn.init.zeros_(self.mask_fcn_logits.bias)

    def forward(self, x: Tensor, classes: Tensor | None = None) -> Tensor:
        """Mask logits of every class [N, K+1, M, M], or with `classes` only those classes' [N, 1, M, M].

        The loss reads one class per RoI (its ground-truth class) and inference one (the detected class), so
        `lazytrain.modeling.RoIHeads` passes `classes` and the 1x1 logit convolution becomes a per-RoI dot
        product with that class's weights: same values as the all-class output's channel, and K+1 times
        fewer logits (and logit gradients) to compute. With LVIS's 1203 classes the all-class output was
        ~1 G logits per training step at batch 8.

        Args:
            x: [N, in_channels, m, m] mask head features.
            classes: [N] class index per RoI (0 is the background), or None for every class.
        """
        if classes is None:
            return super().forward(x)
        features = self.relu(self.conv5_mask(x))
        logits = self.mask_fcn_logits
        weight = logits.weight[classes, :, 0, 0]
        selected = torch.einsum("nchw,nc->nhw", features, weight.to(features.dtype))
        if logits.bias is not None:
            selected = selected + logits.bias[classes].to(selected.dtype)[:, None, None]
        return selected[:, None]
