"""Mask R-CNN R50-FPN on LVIS v1 with Repeat Factor Sampling and the Seesaw loss, 2x schedule.

Command:   python -m lazytrain conf/rfs_maskrcnn_seesaw.py                      (360k iterations)
Hardware:  as conf/rfs_maskrcnn.py (8 GPUs, total batch 16, lr 0.02; the LVIS v1 data under
           $LAZYTRAIN_DATASETS).
Runtime:   twice conf/rfs_maskrcnn.py's (a 2x schedule).
Expected:  mask AP 26.4 on LVIS v1 val, as reported in mmdetection's Seesaw loss model zoo for Mask R-CNN
           R50-FPN with RFS, 2x (Wang et al. 2021); mmdetection's recipe also trains multi-scale and with a
           normalised mask head, which this one does not. Not reproduced here (no GPU cluster).
Loss:      losses.seesaw (p 0.8, q 2): softmax cross-entropy whose penalties on rarer classes shrink with
           the online instance counts (mitigation) and grow for confused classes (compensation); the
           background is the objectness. Keys: losses.seesaw.*.
"""

from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

train.max_iter = 360000  # the LR steps follow at 2/3 and 8/9
losses.use = "seesaw"
