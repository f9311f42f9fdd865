"""detectron2's COCO Mask R-CNN R50-FPN 3x model zoo checkpoint, evaluated (or fine-tuned) in lazytrain.

Command:   python -m lazytrain conf/detectron2_coco_maskrcnn_r50.py train.eval_only=true
Hardware:  1-8 GPUs for evaluation (train.device=cpu works, slowly); 8 GPUs to fine-tune (total batch 16).
           Data: $LAZYTRAIN_DATASETS/coco/{val2017,annotations}.
Runtime:   evaluation ~5 min on 8 GPUs (5,000 images).
Expected:  box AP 41.0, mask AP 37.2 (detectron2's MODEL_ZOO.md for this file): the model gives detectron2's
           detections on the same input (scripts/detectron2_parity.py); not run here (no COCO data or GPU).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with the data on disk).
Weights:   detectron2's model_final_f10217.pkl (170 MB, the zoo's COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x),
           downloaded once per machine into torch hub's cache and converted when loaded (the log says what
           changed); offline: train.init_checkpoint=PATH. Other zoo R50/R101-FPN files: the same with
           model.backbone.depth=101 for R101.
Settings:  detectron2's COCO test settings: shortest edge 800, longest 1333, score threshold 0.05, 100 detections.
"""

from ..recipes.data.coco import dataloader
from .detectron2_lvis_maskrcnn_r50 import launch, losses, lr_multiplier, model, optimizer, train

model.num_classes = 80
model.roi_heads.detections_per_img = 100
model.roi_heads.score_thresh = 0.05

train.init_checkpoint = (
    "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x/137849600/"
    "model_final_f10217.pkl"
)
train.max_iter = 270000

objective = dict(metric="segm/AP", direction="maximize")
