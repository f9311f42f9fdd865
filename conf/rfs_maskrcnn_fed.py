"""Mask R-CNN R50-FPN on LVIS v1 with Repeat Factor Sampling and the federated loss (detectron2's pairing).

Command:   python -m lazytrain conf/rfs_maskrcnn_fed.py
Hardware:  as conf/rfs_maskrcnn.py (8 GPUs, total batch 16, lr 0.02; the LVIS v1 data under
           $LAZYTRAIN_DATASETS).
Runtime:   as conf/rfs_maskrcnn.py; the loss costs little beside the model. Building the model reads the
           train set's image counts per category (the LVIS json's class_image_count).
Expected:  +1.8 box AP over RFS with softmax cross-entropy, as reported for Mask R-CNN R50-FPN on LVIS v1 in
           the CenterNet2 model zoo (Zhou et al. 2021, "Probabilistic two-stage detection"); not reproduced
           here (no GPU cluster).
Loss:      losses.fed: sigmoid cross-entropy on 50 classes per iteration (those in the batch, the others drawn
           with probability ~ train images^0.5); inference scores with a sigmoid. Keys: losses.fed.*.
"""

from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

losses.use = "fed"
