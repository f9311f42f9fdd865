"""Mask R-CNN with a plain ViT-B (timm, MAE weights) and a ViTDet-style simple feature pyramid, Repeat Factor
Sampling, large-scale jitter at 1024 px on LVIS v1 (after detectron2's projects/ViTDet LVIS recipe).

Command:   python -m lazytrain conf/maskrcnn_vitdet_b_rfs.py
Hardware:  8 GPUs (total batch 64: 8 images of 1024 x 1024 per GPU, bf16 autocast); data as conf/rfs_maskrcnn.py.
           detectron2 reports 14.4 GB per GPU for its windowed ViTDet-B; global attention here needs more
           (docs/benchmarks.md has a step's peak): model.backbone.grad_checkpointing=true recomputes the blocks'
           activations in backward instead, train.images_per_forward=4 halves the activations.
Runtime:   not measured. detectron2's ViTDet-B LVIS recipe reports 0.317 s per image to train (156,250 iterations
           of 64 images, 100 epochs).
Expected:  detectron2's ViTDet, ViT-B Mask R-CNN on LVIS v1 (IN1K MAE): box AP 40.2, mask AP 38.2 (detectron2
           projects/ViTDet/README.md, LVIS table). Not reproduced here, and this recipe differs: timm's ViT has global
           attention in every block (ViTDet: windowed attention with relative positions, 4 global blocks), the
           box head is torchvision's 2-fc head and the mask and RPN heads have no LayerNorm (ViTDet: 4conv1fc box
           head, LN heads, 2-conv RPN), and the classification loss is softmax CE (ViTDet: sigmoid CE with the
           federated loss, losses.use=fed is the nearest here).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu model.backbone.pretrained=False
           dataloader.train.mapper.augmentations.1.target_height=96 ...target_width=96 ...2.crop_size=[96,96]
Weights:   timm's vit_base_patch16_224.mae through timm's own hub (the Hugging Face cache, once per machine); its
           224-px position embedding is resampled to 64 x 64 patches at load, and interpolated to each batch's size
           in training (dynamic_img_size). Offline: model.backbone.pretrained=PATH (a file or URL) or =False.
How to use: model.backbone.model_name=vit_large_patch16_224.mae with optimizer.params.num_layers=24 and
           optimizer.params.layer_decay=0.8 (ViTDet-L's); other patch-16 ViTs the same way (patch-14 models, as
           eva02_*, make strides 3.5-28, which the anchors' integer strides do not fit: untested).
"""

from lazytrain.config import LazyCall as L
from lazytrain.modeling import TimmBackbone

from ..recipes.data.lsj import use_lsj
from ..recipes.schedules import use_vitdet_lvis_schedule
from ..recipes.optim import AdamW as optimizer
from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, train

model.backbone = L(TimmBackbone)(
    model_name="vit_base_patch16_224.mae",
    pretrained=True,
    out_indices=[-1],  # the last block's stride-16 map; the pyramid makes strides 4-32 from it
    out_channels=256,
    fpn_norm="LN",
    # dynamic_img_size: the position embedding follows each batch's size (images are padded to a multiple of
    # model.size_divisible=32, itself a multiple of the patch size 16).
    model_kwargs=dict(img_size=1024, dynamic_img_size=True, drop_path_rate=0.1),
    grad_checkpointing=False,  # true: each block's activations recomputed in backward (less memory)
)
train.init_checkpoint = ""  # the backbone's weights come with it (model.backbone.pretrained)

use_lsj(dataloader, 1024, total_batch_size=64)

# detectron2's ViTDet-B LVIS schedule: 100 epochs = 156,250 iterations of 64 images, x0.1 at 8/9 and 26/27 of
# training (its 138,889 and 150,463; one less here, rounding down), 250 warmup iterations.
use_vitdet_lvis_schedule(train, lr_multiplier, max_iter=156250)
optimizer.lr = 2e-4  # ViTDet-B LVIS: lr 2e-4 at batch 64, wd 0.1, layer decay 0.7 over 12 blocks
optimizer.params.layer_decay = 0.7
optimizer.params.num_layers = 12
