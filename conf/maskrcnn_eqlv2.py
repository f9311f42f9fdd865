"""Mask R-CNN R50-FPN on LVIS v1 with Equalization Loss v2 and uniform sampling (the EQLv2 paper's setting).

Command:   python -m lazytrain conf/maskrcnn_eqlv2.py
           add dataloader.train.sampler.repeat_thresh=0.001 to combine it with Repeat Factor Sampling
Hardware:  as conf/rfs_maskrcnn.py (8 GPUs, total batch 16, lr 0.02; the LVIS v1 data under
           $LAZYTRAIN_DATASETS).
Runtime:   as conf/rfs_maskrcnn.py (EQLv2 adds a per-class gradient statistic: negligible).
Expected:  mask APr 14.9 on LVIS v1 val, as reported in the EQLv2 repository's README for Mask R-CNN R50-FPN
           1x (Tan et al. 2021), where RFS gives APr 11.5; not reproduced here (no GPU cluster).
Loss:      losses.eqlv2 (gamma 12, mu 0.8, alpha 4): sigmoid cross-entropy whose positive and negative weights
           per class follow the accumulated gradient ratio; inference scores with a sigmoid (times the
           objectness). Keys: losses.eqlv2.*.
"""

from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

dataloader.train.sampler.repeat_thresh = 0.0  # every repeat factor 1: uniform sampling
losses.use = "eqlv2"
