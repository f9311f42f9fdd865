"""Mask R-CNN ConvNeXt-T + FPN with Repeat Factor Sampling on LVIS v1: conf/rfs_maskrcnn.py with timm's ConvNeXt-T
(ImageNet-1k weights through timm's hub), AdamW and layer-wise LR decay by stage.

Command:   python -m lazytrain conf/rfs_maskrcnn_convnext_t.py
Hardware:  8 GPUs (total batch 16, lr 1e-4), data as conf/rfs_maskrcnn.py.
Runtime:   not measured.
Expected:  not verified: no published LVIS v1 number for Mask R-CNN ConvNeXt-T was found. For scale only, on COCO
           mmdetection's Mask R-CNN ConvNeXt-T (3x, multi-scale crop, AdamW lr 1e-4, wd 0.05, layer-wise decay
           0.95) reports box AP 46.2, mask AP 41.7 (mmdetection configs/convnext/metafile.yml).
Smoke:     train.max_iter=2 dataloader.train.total_batch_size=2 train.device=cpu model.backbone.pretrained=False
Weights:   timm's convnext_tiny.fb_in1k through timm's own hub (the Hugging Face cache, once per machine). Offline:
           one line says what to do; model.backbone.pretrained=PATH (a local file or URL) or =False (random init).
           The log names what the file did not fill (re-initialised).
How to use: model.backbone.model_name=convnext_small.fb_in1k (any timm features_only model: its strides and
           channels are read from timm's feature_info); optimizer.params.layer_decay=1.0 turns the decay off.
"""

from lazytrain.config import LazyCall as L
from lazytrain.modeling import TimmBackbone

from ..recipes.optim import AdamW as optimizer
from .rfs_maskrcnn import dataloader, launch, losses, lr_multiplier, model, objective, train

model.backbone = L(TimmBackbone)(
    model_name="convnext_tiny.fb_in1k",
    pretrained=True,
    out_indices=4,  # the four stages, strides 4-32: FPN maps "0".."3" and "pool"
    frozen_stages=-1,  # LayerNorm everywhere: nothing to freeze for small batches
    out_channels=256,
    model_kwargs=dict(drop_path_rate=0.4),  # mmdetection's ConvNeXt-T Mask R-CNN value
    grad_checkpointing=False,  # true: each block's activations recomputed in backward (less memory)
)
train.init_checkpoint = ""  # the backbone's weights come with it (model.backbone.pretrained)

# mmdetection's ConvNeXt-T settings (lr 1e-4 at batch 16, wd 0.05, decay 0.95), decayed per stage here.
optimizer.lr = 1e-4
optimizer.weight_decay = 0.05
optimizer.params.layer_decay = 0.95
optimizer.params.num_layers = 4
optimizer.params.weight_decay_bias = 0.0
