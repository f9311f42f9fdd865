"""Cascade Mask R-CNN R50-FPN with Repeat Factor Sampling on LVIS v1: conf/rfs_maskrcnn.py with cascade heads.

Command:   python -m lazytrain conf/cascade_maskrcnn_rfs.py                   (180k iterations)
           python -m lazytrain conf/cascade_maskrcnn_rfs.py losses.use=eqlv2  (any losses.use, one per stage)
Hardware:  as conf/rfs_maskrcnn.py (8 GPUs, total batch 16, lr 0.02; the LVIS v1 data under
           $LAZYTRAIN_DATASETS).
Runtime:   not measured here (no GPU cluster); three box heads instead of one, so somewhat longer per
           iteration than conf/rfs_maskrcnn.py's 1.5-2 days on 8 V100s.
Expected:  no published number found for this exact recipe (R50-FPN, 1x 180k, softmax CE, RFS, single scale):
           detectron2's LVIS v1 model zoo has Mask R-CNN only (configs/LVISv1-InstanceSegmentation: R50, R101,
           X101), the EQLv2 repository's LVIS table is Mask R-CNN only, CenterNet2's LVIS v1 zoo is CenterNet2.
           The nearest verified number, not comparable: mask AP 29.3 (box 30.0) for Cascade Mask R-CNN
           R-101-FPN, 2x, multi-scale, RFS 1e-3, Seesaw loss (mmdetection configs/seesaw_loss/README.md, Wang
           et al. CVPR 2021). Expect at least conf/rfs_maskrcnn.py's mask AP ~22.5; not reproduced here.
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with the data on disk).
Weights:   as conf/rfs_maskrcnn.py (ImageNet ResNet-50 into backbone.body; the cascade heads start random).
How to use: every key of conf/rfs_maskrcnn.py works; the stages are model.roi_heads.box_heads.{0,1,2} and
           model.roi_heads.box_predictors.{0,1,2} (each with its own copy of losses.${losses.use}).
"""

from ..recipes.models.cascade_mask_rcnn_fpn import make_cascade_roi_heads
from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

# detectron2's Cascade R-CNN heads (IoU 0.5/0.6/0.7), keeping rfs_maskrcnn's settings (300 detections, score
# 0.0001) and its classification loss, copied per stage.
model.roi_heads = make_cascade_roi_heads(model.roi_heads)
