"""A detectron2 Mask R-CNN R50-FPN trained on LVIS v1, evaluated (or fine-tuned) with detectron2's settings.

Command:   python -m lazytrain conf/detectron2_lvis_maskrcnn_r50.py train.eval_only=true \
               train.init_checkpoint=PATH/model_final_xxx.pkl   (detectron2's .pkl, or a .pth its training wrote)
Hardware:  1-8 GPUs for evaluation (train.device=cpu works, slowly); 8 GPUs to fine-tune (total batch 16).
           Data: $LAZYTRAIN_DATASETS/lvis/lvis_v1_val.json and coco/val2017/ (see README "Real data").
Runtime:   evaluation ~20 min on 8 GPUs (19,809 images); fine-tuning as conf/rfs_maskrcnn.py.
Expected:  the checkpoint's own numbers in detectron2: the model gives detectron2's detections on the same input
           (scripts/detectron2_parity.py); not run here on real weights (no LVIS data or GPU).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with the data on disk).
Weights:   train.init_checkpoint must name the detectron2 file; it is converted when loaded (the log says what
           changed), or once by `python -m lazytrain convert-detectron2 FILE OUT.pth`. R101: model.backbone.depth=101.
           Faster R-CNN checkpoints: drop the mask branch (recipes/models/mask_rcnn_fpn_detectron2.py).
Settings:  detectron2's LVIS test settings: shortest edge 800, longest 1333 (the data recipe's), score threshold
           1e-4, 300 detections per image. A checkpoint trained with the federated loss scores with a sigmoid:
           losses.use=fed.
"""

from ..recipes.data.lvis_v1 import dataloader
from ..recipes.losses import losses
from ..recipes.models.mask_rcnn_fpn_detectron2 import model
from ..recipes.optim import optimizer
from ..recipes.schedules import lr_multiplier
from ..recipes.train import train

model.num_classes = 1203
model.roi_heads.detections_per_img = 300
model.roi_heads.score_thresh = 0.0001
model.roi_heads.box_predictor.loss = "${losses.${losses.use}}"

train.init_checkpoint = ""  # the detectron2 file: train.init_checkpoint=PATH
train.max_iter = 180000
train.eval_period = 10000
train.checkpointer.period = 5000
train.device = "cuda"

objective = dict(metric="segm/APr", direction="maximize")

launch = dict(num_gpus="auto", num_machines=1, machine_rank=0, dist_url="auto")
