"""Mask R-CNN R50-FPN with Repeat Factor Sampling on LVIS v1 (detectron2 parity recipe).

Command:   python -m lazytrain conf/rfs_maskrcnn.py                       (180k iterations)
           python -m lazytrain conf/rfs_maskrcnn.py train.max_iter=90000  (steps move to 60k/80k)
Hardware:  8 GPUs (one process per visible GPU; total batch 16, lr 0.02). Data under $LAZYTRAIN_DATASETS:
           lvis/lvis_v1_{train,val}.json and coco/{train2017,val2017}/ (see README "Real data").
Runtime:   about 1.5-2 days on 8 V100s for 180k iterations (detectron2's reference speed).
Expected:  mask AP ~22.5, APr ~12 on lvis_v1_val (published R50-FPN RFS reference, from an ImageNet backbone).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with the data on disk).
Weights:   ImageNet ResNet-50 by default (torchvision's IMAGENET1K_V1, 98 MB, the backbone of its own Mask
           R-CNN), downloaded once per machine into torch hub's cache ($TORCH_HOME/hub/checkpoints/, by default
           ~/.cache/torch/hub/checkpoints/). Offline: copy resnet50-0676ba61.pth there, or give
           train.init_checkpoint=PATH (a local file); train.init_checkpoint="" starts from random weights.
Losses:    losses.use=ce (softmax cross-entropy, the default), fed, eqlv2 or seesaw (recipes/losses.py).
"""

from ..recipes.data.lvis_v1 import dataloader
from ..recipes.losses import losses
from ..recipes.models.mask_rcnn_fpn import model
from ..recipes.optim import optimizer
from ..recipes.schedules import lr_multiplier
from ..recipes.train import train

model.num_classes = 1203
model.roi_heads.detections_per_img = 300
model.roi_heads.score_thresh = 0.0001
# The classification loss is losses.use (ce, fed, eqlv2, seesaw; recipes/losses.py).
model.roi_heads.box_predictor.loss = "${losses.${losses.use}}"

# torchvision's ResNet50_Weights.IMAGENET1K_V1 (as detectron2's recipes start from ImageNet): from random
# init, FrozenBN with identity statistics diverged at lr 0.02. The name's -0676ba61 is its sha256 prefix.
train.init_checkpoint = "https://download.pytorch.org/models/resnet50-0676ba61.pth"
train.max_iter = 180000
train.eval_period = 10000
train.checkpointer.period = 5000
train.device = "cuda"

# What a search sweep (hydra/sweeper=optuna) optimises: RFS is about the rare categories.
objective = dict(metric="segm/APr", direction="maximize")

launch = dict(num_gpus="auto", num_machines=1, machine_rank=0, dist_url="auto")
