"""Box and mask predictors whose ``num_classes`` counts foreground classes only.

torchvision's predictors count the background as class 0, so a config would need ``num_classes + 1`` in two
places. These subclasses add the background themselves. Parameter names (``cls_score``, ``bbox_pred``,
``conv5_mask``, ``mask_fcn_logits``) stay torchvision's, so torchvision checkpoints load into them.

They start from small outputs (normal init with a small std, as detectron2 does). torchvision's fan-out
init of the 1x1 mask-logit conv over few classes gives logits of std ~5 and an initial mask loss ~10, which
sends a randomly initialised model at lr 0.01 to NaN within ten steps unless gradients are clipped.
"""

from __future__ import annotations

from torch import nn
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor

__all__ = ["BoxPredictor", "MaskPredictor"]


def _check_num_classes(owner: str, num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(
            f"{owner}(num_classes=) must be the number of foreground classes (an int >= 1); got {num_classes!r}"
        )


class BoxPredictor(FastRCNNPredictor):
    """Class scores and per-class box deltas for ``num_classes`` foreground classes plus the background.

    Args:
        in_channels: width of the box head output (e.g. ``TwoMLPHead``'s ``representation_size``).
        num_classes: foreground classes; the background logit is added.
    """

    def __init__(self, in_channels: int, num_classes: int) -> None:
        _check_num_classes("BoxPredictor", num_classes)
        super().__init__(in_channels, num_classes + 1)
        self.num_classes = num_classes
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        for layer in (self.cls_score, self.bbox_pred):
            nn.init.zeros_(layer.bias)


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
