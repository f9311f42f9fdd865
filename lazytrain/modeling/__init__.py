"""Models for recipes: the `RCNN` adapter over torchvision detectors, backbones, the region proposal network,
RoI heads, predictors and their classification losses, the sampling of training examples, weight loading."""

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
from lazytrain.modeling.rpn import RegionProposalNetwork
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
    "RegionProposalNetwork",
    "RoIHeads",
    "SeesawLoss",
    "SoftmaxCrossEntropy",
    "build_resnet_fpn_backbone",
    "load_init_weights",
]
