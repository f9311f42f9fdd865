"""Cascade Mask R-CNN, ResNet-50 + FPN: `mask_rcnn_fpn.py` with three cascade box stages (detectron2's settings).

``make_cascade_roi_heads(model.roi_heads)`` turns any Mask R-CNN recipe's ``roi_heads`` into cascade heads: its
box pooler, mask branch, sampling and postprocessing settings are kept; its box head (a ``TwoMLPHead`` of the
same width) and its box predictor (same type and keys, e.g. ``CosineBoxPredictor``) are repeated per stage with
class-agnostic regression, and a predictor's ``loss`` becomes one copy per stage (stateful losses keep
statistics per stage). Keys per stage: ``model.roi_heads.box_heads.0.representation_size``,
``model.roi_heads.box_predictors.2.loss``, ``model.roi_heads.stage_iou_thresholds=[0.5,0.6,0.7]``.
"""

import copy

from omegaconf import OmegaConf
from torchvision.models.detection.faster_rcnn import TwoMLPHead

from lazytrain.config import LazyCall as L
from lazytrain.modeling import CascadeRoIHeads

from .mask_rcnn_fpn import model

# detectron2's Cascade R-CNN: IoU 0.5/0.6/0.7, box coder weights finer at each stage.
_STAGE_IOU_THRESHOLDS = [0.5, 0.6, 0.7]
_STAGE_BBOX_REG_WEIGHTS = [[10.0, 10.0, 5.0, 5.0], [20.0, 20.0, 10.0, 10.0], [30.0, 30.0, 15.0, 15.0]]


def _stage_predictor(predictor, stage: int):
    """A copy of a Mask R-CNN ``box_predictor`` node for `stage`, its interpolations one list level deeper."""
    node = copy.deepcopy(predictor)
    node.in_channels = f"${{...box_heads[{stage}].representation_size}}"
    node.num_classes = "${....num_classes}"
    node.cls_agnostic_bbox_reg = True
    if "loss" in node:
        # Built once per config, an interpolated loss (``${losses.${losses.use}}``) would be shared by the
        # stages; a copy each keeps their statistics apart (CascadeRoIHeads refuses a shared stateful loss).
        raw_loss = OmegaConf.to_container(node, resolve=False)["loss"]
        node.loss = L(copy.deepcopy)(raw_loss)
    return node


def make_cascade_roi_heads(roi_heads):
    """The `CascadeRoIHeads` config node made from a Mask R-CNN recipe's ``roi_heads`` node (see above)."""
    width = roi_heads.box_head.representation_size
    return L(CascadeRoIHeads)(
        box_roi_pool=roi_heads.box_roi_pool,
        # in_channels = FPN width * 7 * 7, as in mask_rcnn_fpn.py (one level deeper: a list item).
        box_heads=[
            L(TwoMLPHead)(
                in_channels="${lazytrain.frac:${....backbone.out_channels},49,1}", representation_size=width
            )
            for _ in _STAGE_IOU_THRESHOLDS
        ],
        box_predictors=[
            _stage_predictor(roi_heads.box_predictor, stage) for stage in range(len(_STAGE_IOU_THRESHOLDS))
        ],
        stage_iou_thresholds=list(_STAGE_IOU_THRESHOLDS),
        stage_bbox_reg_weights=copy.deepcopy(_STAGE_BBOX_REG_WEIGHTS),
        batch_size_per_image=roi_heads.batch_size_per_image,
        positive_fraction=roi_heads.positive_fraction,
        score_thresh=roi_heads.score_thresh,
        nms_thresh=roi_heads.nms_thresh,
        detections_per_img=roi_heads.detections_per_img,
        mask_roi_pool=roi_heads.mask_roi_pool,
        mask_head=roi_heads.mask_head,
        mask_predictor=roi_heads.mask_predictor,
        compiled_nms=roi_heads.compiled_nms,
        detections_per_class=roi_heads.detections_per_class,
    )


model.roi_heads = make_cascade_roi_heads(model.roi_heads)
