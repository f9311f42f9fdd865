"""The RFS Mask R-CNN recipe on the embedded long-tailed data set, sized for 2 CPU cores.

Command:   python -m lazytrain conf/rfs_maskrcnn_demo.py
Sweep:     python -m lazytrain conf/rfs_maskrcnn_demo.py -m dataloader.train.sampler.repeat_thresh=0,0.3 hydra/launcher=joblib
           (RFS against uniform sampling, the two jobs side by side with one core each)
Copy-Paste: dataloader.train.mapper.copy_paste.mode=none|uniform|rare (off by default; lazytrain/data/copy_paste.py);
           -m ...copy_paste.mode=none,uniform,rare dataloader.train.sampler.repeat_thresh=0,0.3 is the README's sweep.
Hardware:  2 CPU cores, no GPU.
Runtime:   about 3-5 min on 2 CPU cores (start-up and data generation a few seconds, 400 training iterations,
           inference on 250 val images); the machine's own speed varies (scripts/machine_speed.py shows it),
           and on a busy machine the job takes twice as long. docs/benchmarks.md has the timings.
Expected:  box AP 40.8 (APr 22.7), mask AP 40.0 (APr 25.2) (2 threads, seed 0; two runs gave exactly these)
           on an AVX-512 AMD EPYC; other CPUs round differently: mask AP 37.0-40.4, APr 24.9-26.6, box AP
           37.5-41.4 measured (README).
           The README sweep (one thread per job), RFS t=0.3 against uniform, seeds 0 / 1: mask APr 20.5 / 22.5
           vs 5.3 / 5.6, box APr 18.2 / 18.3 vs 3.7 / 3.1, mask AP 35.4 / 36.6 vs 27.3 / 27.0
           (docs/results.md).

What differs from conf/rfs_maskrcnn.py: data (synthetic_lt, 192 px images kept at their size), the CPU-sized
model (ResNet-18, 64-channel FPN, narrow heads, trainable BN), a short cosine schedule, gradient clipping,
detections down to score 0.001, and the RFS threshold. The train set has 1000 images, so LVIS's t=0.001
(~ a category in 1 of 1000 images) would repeat almost nothing; t=0.3 gives the rare categories (1-10 images)
repeat factors of 5.5-17, the common ones 1.7-5.2 (epoch 2018 samples for 1000 images). t=0.1 and 0.6 gave
lower mean APr over the same two seeds (docs/results.md).
"""

from lazytrain.config import LazyCall as L
from lazytrain.data.copy_paste import CopyPaste

from ..recipes.data.synthetic_lt import dataloader
from ..recipes.models.mask_rcnn_r18_fpn_cpu import model
from ..recipes.schedules import cosine_lr_multiplier as lr_multiplier
from .rfs_maskrcnn import losses, objective, optimizer, train

model.num_classes = 30
model.roi_heads.box_predictor.loss = "${losses.${losses.use}}"  # losses.use=ce|fed|eqlv2|seesaw

dataloader.train.sampler.repeat_thresh = 0.3
# Off ("none") unless mode=uniform or rare. The rare-aware weights r_c take their own threshold, the sampler's
# t=0.3, written out so that they stay rare-aware when the sampler is uniform (repeat_thresh=0).
dataloader.train.mapper.copy_paste = L(CopyPaste)(
    mode="none", prob=1.0, max_objects=20, min_area=1, repeat_thresh=0.3
)
# LVIS evaluates up to 300 detections per image, so low-scoring ones still count toward AP (0.01 -> 0.001:
# +0.4 box AP, +1.7 box APr on the same weights; docs/results.md).
model.roi_heads.score_thresh = 0.001

lr_multiplier.warmup_iters = 50
# Random init on purpose (ResNet-18 with trainable BN), not the ImageNet ResNet-50 of conf/rfs_maskrcnn.py.
train.init_checkpoint = ""
train.max_iter = 400
train.eval_period = 0
train.log_period = 20
train.checkpointer.period = 100
train.checkpointer.max_to_keep = 1
train.clip_grad.enabled = True
train.clip_grad.max_norm = 10.0
train.device = "cpu"
train.auto_scale_lr.base_batch_size = 4  # the batch its lr 0.02 was chosen for (synthetic_lt's total batch)

launch = dict(num_gpus=0, num_processes=1)
