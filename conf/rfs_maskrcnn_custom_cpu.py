r"""Your own COCO- or LVIS-format data set on the CPU: conf/rfs_maskrcnn_custom.py's data keys with the demo's
CPU-sized model, image size and schedule, to try a data set before training the R50 recipe on GPUs.

Command:   python -m lazytrain conf/rfs_maskrcnn_custom_cpu.py \
               data.train.json=/data/mine/train.json data.train.images=/data/mine/images \
               data.val.json=/data/mine/val.json data.val.images=/data/mine/images
Keys:      as conf/rfs_maskrcnn_custom.py (data.*; the number of classes and the RFS threshold come from the
           train json). Images are resized to a 192 px short edge (at most 256 px), as in the demo: raise both
           for small objects, e.g. dataloader.train.mapper.augmentations.0.short_edge_length=[320]
           dataloader.train.mapper.augmentations.0.max_size=512 (and the same two of dataloader.test, a number
           for its short_edge_length), at a cost in time that grows with the pixels.
Hardware:  2 CPU cores, no GPU (one process, one loader worker).
Runtime:   the demo's 400 iterations of 4 images, each about as long as the demo's (the same model and image
           size: 0.3-0.7 s/it measured for the demo on 2 cores, docs/benchmarks.md; larger files cost the loader
           more to decode), plus the evaluation of the val images; train.max_iter=N for another length.
Expected:  depends on your data; it is a try-out (random init, ResNet-18): for results train
           conf/rfs_maskrcnn_custom.py, which starts from ImageNet weights, on GPUs.
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 (with your data.* keys).

What differs from conf/rfs_maskrcnn_custom.py: the model (conf/rfs_maskrcnn_demo.py's ResNet-18 FPN from random
init, trainable BN), the demo's 192 px images, batch 4 with its learning rate, cosine schedule and gradient
clipping, and CPU training.
"""

from ..recipes.data.custom import data, dataloader
from ..recipes.data.synthetic_lt import dataloader as demo_dataloader
from .rfs_maskrcnn_demo import launch, losses, lr_multiplier, model, objective, optimizer, train

model.num_classes = "${lazytrain.json_num_classes:${data.train.json}}"

dataloader.train.mapper.augmentations = demo_dataloader.train.mapper.augmentations
dataloader.test.mapper.augmentations = demo_dataloader.test.mapper.augmentations
dataloader.train.total_batch_size = demo_dataloader.train.total_batch_size
dataloader.train.num_workers = demo_dataloader.train.num_workers
dataloader.test.num_workers = demo_dataloader.test.num_workers

del demo_dataloader  # not a config key
