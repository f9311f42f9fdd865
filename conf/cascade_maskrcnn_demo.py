"""Cascade Mask R-CNN on the embedded long-tailed data set, sized for 2 CPU cores: conf/rfs_maskrcnn_demo.py
with three cascade box stages (recipes/models/cascade_mask_rcnn_fpn.py).

Command:   python -m lazytrain conf/cascade_maskrcnn_demo.py
           python -m lazytrain conf/cascade_maskrcnn_demo.py losses.use=seesaw    (a loss per stage)
Hardware:  2 CPU cores, no GPU.
Runtime:   about 5 min on 2 CPU cores (400 iterations and inference on 250 val images), about a third longer
           than conf/rfs_maskrcnn_demo.py on the same machine (docs/benchmarks.md has the timings).
Expected:  mask AP 53.7 (APr 29.0), box AP 61.0 (APr 31.8): mean of seeds 0 and 1 (one thread each; seed 0:
           mask AP 56.2, APr 30.3; seed 1: 51.1, 27.8). conf/rfs_maskrcnn_demo.py with the same seeds: mask AP 36.0
           (APr 21.5), box AP 37.0 (APr 18.2). docs/results.md has the 2-seed sweep with uniform sampling too;
           the synthetic shapes reward precise boxes, so the gap says little about LVIS.
Smoke:     train.max_iter=2 (tests/conf/test_configs.py runs it on a tiny copy of the data).
How to use: every key of conf/rfs_maskrcnn_demo.py works; the stages are model.roi_heads.box_heads.{0,1,2} and
           model.roi_heads.box_predictors.{0,1,2}, their IoUs model.roi_heads.stage_iou_thresholds.
"""

from ..recipes.models.cascade_mask_rcnn_fpn import make_cascade_roi_heads
from .rfs_maskrcnn_demo import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

# The CPU model's narrow heads, batch of 128 RoIs and score threshold 0.001 carry over to every stage.
model.roi_heads = make_cascade_roi_heads(model.roi_heads)
