"""Mask R-CNN, ResNet-50 + FPN, as LazyCalls of torchvision parts (torchvision's default hyper-parameters).

Every knob is a key: ``model.num_classes=1203``, ``model.roi_heads.detections_per_img=300``,
``model.roi_heads.score_thresh=0.0001``, ``model.rpn.anchor_generator.sizes=[16,32,64,128,256]``,
``model.backbone.depth=101``, ``model.backbone.norm=GN``. Widths follow ``model.backbone.out_channels`` and
``model.num_classes`` through interpolations. Images are not resized inside the model (the mapper sets the
size); ``model.pixel_mean``/``pixel_std`` are RGB on the 0-255 scale. Faster R-CNN: ``~model.roi_heads.mask_roi_pool
~model.roi_heads.mask_head ~model.roi_heads.mask_predictor``.

The model is built with random weights; its ImageNet ResNet-50 start is ``train.init_checkpoint`` (set in
``conf/rfs_maskrcnn.py``: torchvision's ``resnet50-0676ba61.pth``, loaded into ``backbone.body``). With
``model.backbone.depth=101`` give matching weights too (torchvision's ``resnet101-63fe2227.pth``, same
address): the R-50 file would fill only the blocks both depths have, and the report would list the rest.
"""

from torchvision.models.detection.faster_rcnn import TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads
from torchvision.models.detection.rpn import RPNHead

from lazytrain.config import LazyCall as L
from lazytrain.modeling import (  # MultiScaleRoIAlign: torchvision's, with a faster CPU training path
    RCNN,
    AnchorGenerator,  # torchvision's anchors, in float32 under autocast, computed once per size
    BoxPredictor,
    MaskPredictor,
    MultiScaleRoIAlign,
    RegionProposalNetwork,  # torchvision's, for the whole batch at once (one host sync per step)
    RoIHeads,  # torchvision's, with the classification loss taken from box_predictor.loss
    build_resnet_fpn_backbone,
)

model = L(RCNN)(
    backbone=L(build_resnet_fpn_backbone)(
        depth=50, norm="FrozenBN", trainable_layers=3, out_channels=256, returned_layers=[1, 2, 3, 4]
    ),
    rpn=L(RegionProposalNetwork)(
        # One size group per FPN map: len(returned_layers) + 1 (the extra max-pooled level).
        anchor_generator=L(AnchorGenerator)(sizes=[32, 64, 128, 256, 512], aspect_ratios=[0.5, 1.0, 2.0]),
        head=L(RPNHead)(in_channels="${...backbone.out_channels}", num_anchors=3),  # = len(aspect_ratios)
        fg_iou_thresh=0.7,
        bg_iou_thresh=0.3,
        batch_size_per_image=256,
        positive_fraction=0.5,
        pre_nms_top_n=dict(training=2000, testing=1000),
        post_nms_top_n=dict(training=2000, testing=1000),
        nms_thresh=0.7,
        score_thresh=0.0,
        # NMS's IoU bits in one torch.compile'd kernel per level instead of ~12 memory passes each: for GPUs
        # (a compile at the first step); the CPU's cache-sized passes are faster.
        compiled_nms=False,
    ),
    roi_heads=L(RoIHeads)(
        box_roi_pool=L(MultiScaleRoIAlign)(
            featmap_names=["0", "1", "2", "3"], output_size=7, sampling_ratio=2
        ),
        # in_channels = FPN width * 7 * 7 (the pooled box features, flattened).
        box_head=L(TwoMLPHead)(
            in_channels="${lazytrain.frac:${...backbone.out_channels},49,1}", representation_size=1024
        ),
        box_predictor=L(BoxPredictor)(
            in_channels="${..box_head.representation_size}", num_classes="${...num_classes}"
        ),
        fg_iou_thresh=0.5,
        bg_iou_thresh=0.5,
        batch_size_per_image=512,
        positive_fraction=0.25,
        bbox_reg_weights=None,  # torchvision's (10, 10, 5, 5)
        score_thresh=0.05,
        nms_thresh=0.5,
        detections_per_img=100,
        # The per-class NMS of the detections in compiled kernels where it runs grouped (on a GPU, above 100,000
        # box coordinates per image: LVIS evaluation at score_thresh=0.0001); torchvision's nms elsewhere.
        compiled_nms=False,
        # At most this many detections of each class per image (null: no limit); AP-fixed's inference sets it.
        detections_per_class=None,
        mask_roi_pool=L(MultiScaleRoIAlign)(
            featmap_names=["0", "1", "2", "3"], output_size=14, sampling_ratio=2
        ),
        mask_head=L(MaskRCNNHeads)(
            in_channels="${...backbone.out_channels}", layers=[256, 256, 256, 256], dilation=1
        ),
        mask_predictor=L(MaskPredictor)(
            in_channels=256, dim_reduced=256, num_classes="${...num_classes}"
        ),  # in = last mask_head layer
    ),
    num_classes=80,
    pixel_mean=[123.675, 116.28, 103.53],
    pixel_std=[58.395, 57.12, 57.375],
    size_divisible=32,
    mask_threshold=0.5,
    channels_last=None,  # channels-last on a GPU (faster tensor-core convolutions), NCHW on the CPU
    pad_to_sizes=None,  # [[H, W], ...]: training batches padded to fixed sizes (for train.compile)
)
# true: the trainable stages' blocks recompute their activations in backward (less memory, same gradients)
model.backbone.grad_checkpointing = False
