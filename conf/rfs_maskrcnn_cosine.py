"""Mask R-CNN R50-FPN on LVIS v1 with Repeat Factor Sampling and a normalised cosine classifier.

Command:   python -m lazytrain conf/rfs_maskrcnn_cosine.py
           add losses.use=fed (or eqlv2, seesaw) to pair the classifier with another loss
Hardware:  as conf/rfs_maskrcnn.py (8 GPUs, total batch 16, lr 0.02; the LVIS v1 data under
           $LAZYTRAIN_DATASETS).
Runtime:   as conf/rfs_maskrcnn.py.
Expected:  box AP 23.8, APr 12.4 on LVIS v1 val, as reported in the DisAlign model zoo for Mask R-CNN
           R50-FPN 1x, multi-scale, RFS with a cosine classifier (its RFS baseline there gains about 1 APr from
           it); not reproduced here (no GPU cluster).
Predictor: CosineBoxPredictor: class logits = scale x cosine(box feature, class weight), no bias; the scale
           is model.roi_heads.box_predictor.scale (20, as TFA).
"""

from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

model.roi_heads.box_predictor._target_ = "lazytrain.modeling.CosineBoxPredictor"
model.roi_heads.box_predictor.scale = 20.0
