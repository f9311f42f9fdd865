"""Models for recipes: the `RCNN` adapter over torchvision detectors, backbones (timm's too), the region proposal network,
RoI heads (Cascade R-CNN's too), predictors and their classification losses, the sampling of training examples, weight loading, and
export (torch.export's ExportedProgram, ONNX, AOTInductor; TorchScript, legacy) with a parity check."""

from lazytrain.modeling.anchors import AnchorGenerator
from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.cascade_roi_heads import CascadeRoIHeads
from lazytrain.modeling.classification_losses import (
    ClassificationLoss,
    EQLv2Loss,
    FederatedLoss,
    SeesawLoss,
    SoftmaxCrossEntropy,
)
from lazytrain.modeling.export import (
    ExportableRCNN,
    export_aoti,
    export_onnx,
    export_program,
    export_torchscript,
    save_program,
)
from lazytrain.modeling.export_parity import ParityReport, check_parity
from lazytrain.modeling.exported import (
    ExportedModel,
    load_aoti,
    load_exported,
    load_onnx,
    load_program,
    load_torchscript,
)
from lazytrain.modeling.fixed_shapes import FixedShapes
from lazytrain.modeling.frozen_batch_norm import (
    FoldedFrozenBatchNorm2d,
    FrozenBatchNormConv2d,
    fold_frozen_batch_norm,
)
from lazytrain.modeling.heads import BoxPredictor, CosineBoxPredictor, MaskPredictor
from lazytrain.modeling.image_batch import NoResizeTransform
from lazytrain.modeling.poolers import MultiScaleRoIAlign
from lazytrain.modeling.rcnn import RCNN
from lazytrain.modeling.roi_heads import RoIHeads
from lazytrain.modeling.rpn import RegionProposalNetwork
from lazytrain.modeling.sampling import BalancedMaskSampler
from lazytrain.modeling.timm_backbone import SimpleFeaturePyramid, TimmBackbone
from lazytrain.modeling.weights import load_init_weights

__all__ = [
    "AnchorGenerator",
    "RCNN",
    "BalancedMaskSampler",
    "BoxPredictor",
    "CascadeRoIHeads",
    "ClassificationLoss",
    "CosineBoxPredictor",
    "EQLv2Loss",
    "ExportableRCNN",
    "ExportedModel",
    "FederatedLoss",
    "FixedShapes",
    "FoldedFrozenBatchNorm2d",
    "FrozenBatchNormConv2d",
    "MaskPredictor",
    "MultiScaleRoIAlign",
    "NoResizeTransform",
    "ParityReport",
    "RegionProposalNetwork",
    "RoIHeads",
    "SeesawLoss",
    "SimpleFeaturePyramid",
    "SoftmaxCrossEntropy",
    "TimmBackbone",
    "build_resnet_fpn_backbone",
    "check_parity",
    "export_aoti",
    "export_onnx",
    "export_program",
    "export_torchscript",
    "fold_frozen_batch_norm",
    "load_init_weights",
    "load_aoti",
    "load_exported",
    "load_onnx",
    "load_program",
    "load_torchscript",
    "save_program",
]
