"""Cascade Mask R-CNN with a Swin-B + FPN backbone (timm, ImageNet-21k weights), Repeat Factor Sampling,
large-scale jitter at 1024 px and the federated loss on LVIS v1 (after detectron2's projects/ViTDet LVIS Swin-B
recipe).

Command:   python -m lazytrain conf/cascade_maskrcnn_swin_b_rfs.py                (78,125 iterations, 50 epochs)
           python -m lazytrain conf/cascade_maskrcnn_swin_b_rfs.py losses.use=ce  (softmax CE instead)
Hardware:  8 GPUs (total batch 64: 8 images of 1024 x 1024 per GPU, bf16 autocast); data as
           conf/rfs_maskrcnn.py. detectron2 reports 11.5 GB per GPU at 1 image per GPU (64 A100s); 8 per GPU
           need more (not measured: train.images_per_forward=4 or 2 trades speed for memory, the batch stays 64).
Runtime:   not measured here. detectron2 reports 0.368 s per iteration of 1 image per GPU on 64 A100s, so
           about 8 h for its 78,125 iterations; on 8 GPUs an estimate (not measured) is some 2-3 days.
Expected:  detectron2's Cascade Mask R-CNN Swin-B (IN21K, sup) on LVIS v1 val: box AP 44.0, mask AP 39.6
           (github.com/facebookresearch/detectron2, projects/ViTDet/README.md, LVIS "Cascade Mask R-CNN"
           table; config projects/ViTDet/configs/LVIS/cascade_mask_rcnn_swin_b_in21k_50ep.py). Not reproduced
           here. Same as there: Swin-B from swin_base_patch4_window7_224_22k.pth, drop path 0.3, LSJ 1024
           (scale 0.1-2.0), batch 64, AdamW lr 1e-4 wd 0.05 (no layer decay, none on norms), 78,125
           iterations with x0.1 at 69,444 and 75,231, 250 warmup iterations from x0.001, RFS t=0.001, sigmoid
           CE with the federated loss (50 classes, weights freq^0.5), IoU 0.5/0.6/0.7 stages, 300 detections
           per image, mixed precision (there fp16, here bf16). Different here: torchvision's 2-fc box heads
           (detectron2: 4conv1fc with LN), mask and RPN heads without LN and a 1-conv RPN head (detectron2:
           LN, 2 convs), score threshold 0.0001 as the other LVIS recipes (detectron2: 0.02), weight decay on
           Swin's relative_position_bias_table (detectron2: none), images padded to a multiple of 32
           (detectron2: to 1024 x 1024), and the Swin block's shift before its padding (timm's order).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu model.backbone.pretrained=False
           dataloader.train.mapper.augmentations.1.target_height=96 ...target_width=96 ...2.crop_size=[96,96]
Weights:   timm's swin_base_patch4_window7_224.ms_in22k (the ImageNet-21k file detectron2 starts from, not
           the in22k-ft-in1k one) through timm's own hub (the Hugging Face cache, once per machine). Offline:
           model.backbone.pretrained=PATH (a file or URL) or =False (random init).
How to use: model.backbone.model_name=swin_large_patch4_window7_224.ms_in22k (Swin-L: detectron2's other
           Swin row, box AP 46.0, mask AP 41.4, same settings there); optimizer.params.layer_decay=0.9 tries a
           per-stage decay (detectron2 uses none). Swin is built for model_kwargs.img_size (1024: windows of 7,
           shifted in every stage at that size) and takes any size a multiple of 32 (strict_img_size=False:
           the attention masks follow each batch's size).
"""

from lazytrain.config import LazyCall as L
from lazytrain.modeling import TimmBackbone

from ..recipes.data.lsj import use_lsj
from ..recipes.schedules import use_vitdet_lvis_schedule
from ..recipes.models.cascade_mask_rcnn_fpn import make_cascade_roi_heads
from ..recipes.optim import AdamW as optimizer
from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, train

model.backbone = L(TimmBackbone)(
    model_name="swin_base_patch4_window7_224.ms_in22k",
    pretrained=True,
    out_indices=4,  # the four stages, strides 4-32 (timm's NHWC maps, made NCHW by TimmBackbone)
    frozen_stages=-1,  # LayerNorm everywhere, as detectron2 trains the whole Swin
    out_channels=256,
    fpn_norm="LN",  # detectron2's FPN for this recipe has LN
    # img_size: window 7 and its shift in every stage at 1024 px (at 224 the last stage's 7 x 7 map would get no
    # shift); strict_img_size=False: other sizes (test images, the smoke run's 96 px) work too.
    model_kwargs=dict(img_size=1024, strict_img_size=False, drop_path_rate=0.3),
    grad_checkpointing=False,  # true: each block's activations recomputed in backward (less memory)
)
train.init_checkpoint = ""  # the backbone's weights come with it (model.backbone.pretrained)

# Cascade stages (IoU 0.5/0.6/0.7) keeping rfs_maskrcnn's LVIS test settings (300 detections, score 0.0001);
# each stage gets its own copy of losses.${losses.use}.
model.roi_heads = make_cascade_roi_heads(model.roi_heads)
losses.use = "fed"  # detectron2's ViTDet LVIS recipes: sigmoid CE with the federated loss

use_lsj(dataloader, 1024, total_batch_size=64)

# detectron2's Swin-B LVIS schedule: 50 epochs = 78,125 iterations of 64 images, x0.1 at 8/9 and 26/27 of
# training (69,444 and 75,231 there and here), 250 warmup iterations from x0.001.
use_vitdet_lvis_schedule(train, lr_multiplier, max_iter=78125)

# detectron2's Swin settings: AdamW lr 1e-4 at batch 64, wd 0.05, no decay on norms, one lr for every layer.
optimizer.lr = 1e-4
optimizer.weight_decay = 0.05
optimizer.params.layer_decay = 1.0
optimizer.params.num_layers = 4  # Swin's stages (layers.0-3), should layer_decay be set below 1
