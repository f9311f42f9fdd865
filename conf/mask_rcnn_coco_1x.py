"""Mask R-CNN R50-FPN on COCO 2017, detectron2's 1x schedule (uniform sampling, COCO evaluation).

Command:   python -m lazytrain conf/mask_rcnn_coco_1x.py
Hardware:  8 GPUs (one process per visible GPU; total batch 16, lr 0.02).
           Data: $LAZYTRAIN_DATASETS/coco/{train2017,val2017,annotations}.
Runtime:   about 6-8 hours on 8 V100s (detectron2's reference speed for R50-FPN 1x).
Expected:  box AP ~38.6, mask AP ~35.2 (detectron2's R50-FPN 1x, from an ImageNet backbone).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with the data on disk).
Weights:   ImageNet ResNet-50 by default, downloaded once per machine, as conf/rfs_maskrcnn.py (offline: copy
           resnet50-0676ba61.pth to $TORCH_HOME/hub/checkpoints/, by default ~/.cache/torch/hub/checkpoints/,
           or give train.init_checkpoint=PATH); train.init_checkpoint="" starts from random weights.
"""

from ..recipes.data.coco import dataloader
from .rfs_maskrcnn import losses, lr_multiplier, model, optimizer, train

model.num_classes = 80
model.roi_heads.detections_per_img = 100
model.roi_heads.score_thresh = 0.05

train.max_iter = 90000  # steps at 60k / 80k follow through the schedule's interpolations
train.eval_period = 10000

objective = dict(metric="segm/AP", direction="maximize")  # COCO has no frequency groups

launch = dict(num_gpus="auto", num_machines=1, machine_rank=0, dist_url="auto")
