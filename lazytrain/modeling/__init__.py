"""Models for recipes: the `RCNN` adapter over torchvision detectors, backbones, RoI heads, predictors and
their classification losses, weight loading."""

from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.classification_losses import (
    CLASSIFICATION_LOSSES,
    ClassificationLoss,
    EQLv2Loss,
    FederatedLoss,
    SeesawLoss,
    SoftmaxCrossEntropy,
    build_classification_loss,
)
from lazytrain.modeling.heads import BoxPredictor, CosineBoxPredictor, MaskPredictor
from lazytrain.modeling.poolers import MultiScaleRoIAlign
from lazytrain.modeling.rcnn import RCNN, NoResizeTransform
from lazytrain.modeling.roi_heads import RoIHeads
from lazytrain.modeling.weights import load_init_weights

__all__ = [
    "CLASSIFICATION_LOSSES",
    "RCNN",
    "BoxPredictor",
    "ClassificationLoss",
    "CosineBoxPredictor",
    "EQLv2Loss",
    "FederatedLoss",
    "MaskPredictor",
    "MultiScaleRoIAlign",
    "NoResizeTransform",
    "RoIHeads",
    "SeesawLoss",
    "SoftmaxCrossEntropy",
    "build_classification_loss",
    "build_resnet_fpn_backbone",
    "load_init_weights",
]
