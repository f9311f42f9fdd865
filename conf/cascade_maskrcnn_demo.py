"""Cascade Mask R-CNN on the embedded long-tailed data set, sized for 2 CPU cores: conf/rfs_maskrcnn_demo.py
with three cascade box stages (recipes/models/cascade_mask_rcnn_fpn.py).

Command:   python -m lazytrain conf/cascade_maskrcnn_demo.py
           python -m lazytrain conf/cascade_maskrcnn_demo.py losses.use=seesaw    (a loss per stage)
Hardware:  2 CPU cores, no GPU.
Runtime:   see the measured line below (conf/rfs_maskrcnn_demo.py's plus the two extra box heads).
Expected:  see the measured line below; compare with conf/rfs_maskrcnn_demo.py's mask AP 40.0 (APr 25.2).
Smoke:     train.max_iter=2 (tests/conf/test_configs.py runs it on a tiny copy of the data).
How to use: every key of conf/rfs_maskrcnn_demo.py works; the stages are model.roi_heads.box_heads.{0,1,2} and
           model.roi_heads.box_predictors.{0,1,2}, their IoUs model.roi_heads.stage_iou_thresholds.
"""

from ..recipes.models.cascade_mask_rcnn_fpn import make_cascade_roi_heads
from .rfs_maskrcnn_demo import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

# The CPU model's narrow heads, batch of 128 RoIs and score threshold 0.001 carry over to every stage.
model.roi_heads = make_cascade_roi_heads(model.roi_heads)
