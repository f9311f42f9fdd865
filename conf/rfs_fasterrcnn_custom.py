r"""Faster R-CNN (boxes only) R50-FPN with Repeat Factor Sampling on your own COCO- or LVIS-format data set.

Command:   python -m lazytrain conf/rfs_fasterrcnn_custom.py \
               data.train.json=/data/mine/train.json data.train.images=/data/mine/images \
               data.val.json=/data/mine/val.json data.val.images=/data/mine/images
Hardware:  as conf/rfs_maskrcnn_custom.py (GPUs; train.device=cpu on CPU).
Runtime:   a little faster per iteration than conf/rfs_maskrcnn_custom.py (no mask head).
Expected:  depends on your data; metrics.json has bbox/ AP, APr, APc, APf.
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with your data.* keys).
Weights:   as conf/rfs_maskrcnn_custom.py: ImageNet ResNet-50 by default (downloaded once per machine into
           torch hub's cache), train.init_checkpoint=PATH for a file, train.init_checkpoint="" for random init.

The same recipe as conf/rfs_maskrcnn_custom.py without the mask branch, for exports whose annotations have
boxes but no 'segmentation' (the mask recipe stops before starting and points here).
"""

from .rfs_maskrcnn_custom import data, dataloader, launch, losses, lr_multiplier, model, optimizer, train

model.roi_heads.mask_roi_pool = None
model.roi_heads.mask_head = None
model.roi_heads.mask_predictor = None
dataloader.train.mapper.use_instance_mask = False
dataloader.evaluator.tasks = ["bbox"]
