"""The RFS Mask R-CNN recipe on the embedded long-tailed data set, sized for 2 CPU cores.

Command:   python -m lazytrain conf/rfs_maskrcnn_demo.py
Sweep:     python -m lazytrain conf/rfs_maskrcnn_demo.py -m dataloader.train.sampler.repeat_thresh=0,0.1,0.3
Hardware:  2 CPU cores, no GPU.
Runtime:   4-5 minutes on 2 cores (data generation ~8 s on first use, 160 training iterations at
           1.0-1.3 s each, evaluation on 250 val images ~45 s; docs/benchmarks.md).
Expected:  a few points of box/mask AP after this short schedule; APr above the uniform-sampling run's
           (docs/results.md has the measured sweep).

What differs from conf/rfs_maskrcnn.py: data (synthetic_lt), the CPU-sized model (ResNet-18, 64-channel FPN,
narrow heads, trainable BN), a short cosine schedule, gradient clipping, and the RFS threshold. The train set
has 1000 images, so LVIS's t=0.001 (~ a category in 1 of 1000 images) would repeat almost nothing; t=0.1 gives
the rare categories (1-10 images) repeat factors of 3-10, as t=0.001 does for LVIS's rare classes.
"""

from ..recipes.data.synthetic_lt import dataloader
from ..recipes.models.mask_rcnn_r18_fpn_cpu import model
from ..recipes.schedules import cosine_lr_multiplier as lr_multiplier
from .rfs_maskrcnn import optimizer, train

model.num_classes = 30

dataloader.train.sampler.repeat_thresh = 0.1

lr_multiplier.warmup_iters = 50
train.max_iter = 160
train.eval_period = 0
train.log_period = 20
train.checkpointer.period = 100
train.checkpointer.max_to_keep = 1
train.clip_grad.enabled = True
train.clip_grad.max_norm = 10.0
train.device = "cpu"

launch = dict(num_gpus=0, num_processes=1)
