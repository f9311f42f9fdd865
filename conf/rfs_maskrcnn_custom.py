r"""Mask R-CNN R50-FPN with Repeat Factor Sampling on your own COCO- or LVIS-format data set.

Command:   python -m lazytrain conf/rfs_maskrcnn_custom.py \
               data.train.json=/data/mine/train.json data.train.images=/data/mine/images \
               data.val.json=/data/mine/val.json data.val.images=/data/mine/images
Keys:      data.train.json, data.train.images, data.val.json, data.val.images (required; images = the folder
           the json's file_name entries are relative to). Optional: data.frequency_thresholds=[10,100].
           From the train json: model.num_classes (its categories) and dataloader.train.sampler.repeat_thresh
           (100 / train images with annotations); the evaluation protocol comes from the val json.
Hardware:  GPUs (one process per visible GPU; total batch 16, lr 0.02). On CPU add train.device=cpu (and
           launch.num_processes=N for N processes). Box-only data: conf/rfs_fasterrcnn_custom.py.
Runtime:   as conf/rfs_maskrcnn.py per iteration (180k iterations by default; about 24 epochs, i.e.
           train.max_iter = 24 x train images / 16, is a reasonable start for a small set).
Expected:  depends on your data. The log names the evaluation protocol and how categories were binned;
           metrics.json has bbox/ and segm/ AP, APr, APc, APf and eval_protocol/exhaustive or /federated.
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu (with your data.* keys).
Weights:   ImageNet ResNet-50 by default, downloaded once per machine, as conf/rfs_maskrcnn.py (offline: copy
           resnet50-0676ba61.pth to $TORCH_HOME/hub/checkpoints/, by default ~/.cache/torch/hub/checkpoints/).
           train.init_checkpoint=PATH fine-tunes from a file (a COCO Mask R-CNN: its predictors are
           re-initialised for your classes, and the log names them); train.init_checkpoint="" starts from
           random weights.

Before any process starts, the files are checked (json syntax, image folders, every image present, val
categories = train categories, masks present); each problem is one line naming the file and the fix.
"""

from ..recipes.data.custom import data, dataloader
from .rfs_maskrcnn import launch, losses, lr_multiplier, model, optimizer, train

model.num_classes = "${lazytrain.json_num_classes:${data.train.json}}"
