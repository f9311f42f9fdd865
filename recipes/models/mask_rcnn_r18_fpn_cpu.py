"""CPU-sized Mask R-CNN for the embedded demo and tests: ResNet-18, 64-channel FPN, narrow heads.

Expect about 0.6 s per training iteration at batch 4, 192 px, on 2 CPU cores.
Trainable BatchNorm everywhere (random init, no frozen stages); anchors 16-256 for ~200 px images.
"""

from .mask_rcnn_fpn import model

model.backbone.depth = 18
model.backbone.norm = "BN"
model.backbone.trainable_layers = 5
model.backbone.out_channels = 64  # the FPN width dominates CPU cost at small image sizes
model.channels_last = True  # oneDNN runs channels-last convolutions faster on the CPU too
model.rpn.anchor_generator.sizes = [16, 32, 64, 128, 256]
model.rpn.pre_nms_top_n = dict(training=600, testing=600)
model.rpn.post_nms_top_n = dict(training=300, testing=300)
model.roi_heads.batch_size_per_image = 128
model.roi_heads.box_head.representation_size = 256
model.roi_heads.mask_head.layers = [64, 64]
model.roi_heads.mask_predictor.in_channels = 64
model.roi_heads.mask_predictor.dim_reduced = 64
