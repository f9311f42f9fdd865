"""Models for recipes: the `RCNN` adapter over torchvision detectors, backbones, RoI heads, predictors and
their classification losses, the sampling of training examples, weight loading."""

from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.classification_losses import (
    ClassificationLoss,
    EQLv2Loss,
    FederatedLoss,
    SeesawLoss,
    SoftmaxCrossEntropy,
)
from lazytrain.modeling.heads import BoxPredictor, CosineBoxPredictor, MaskPredictor
from lazytrain.modeling.poolers import MultiScaleRoIAlign
from lazytrain.modeling.rcnn import RCNN, NoResizeTransform
from lazytrain.modeling.roi_heads import RoIHeads
from lazytrain.modeling.sampling import BalancedMaskSampler
from lazytrain.modeling.weights import load_init_weights

__all__ = [
    "RCNN",
    "BalancedMaskSampler",
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
    "build_resnet_fpn_backbone",
    "load_init_weights",
]
