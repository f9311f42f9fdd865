"""Models for recipes: the `RCNN` adapter over torchvision detectors, backbones, heads, weight loading."""

from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.heads import BoxPredictor, MaskPredictor
from lazytrain.modeling.poolers import MultiScaleRoIAlign
from lazytrain.modeling.rcnn import RCNN, NoResizeTransform
from lazytrain.modeling.weights import load_init_weights

__all__ = [
    "RCNN",
    "BoxPredictor",
    "MaskPredictor",
    "MultiScaleRoIAlign",
    "NoResizeTransform",
    "build_resnet_fpn_backbone",
    "load_init_weights",
]
