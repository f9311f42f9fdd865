"""The RFS Mask R-CNN demo (conf/rfs_maskrcnn_demo.py) with a small timm backbone, random init, sized for 2 CPU cores.

Command:   python -m lazytrain conf/rfs_maskrcnn_demo_timm.py
           python -m lazytrain conf/rfs_maskrcnn_demo_timm.py model.backbone.model_name=convnext_atto
Hardware:  2 CPU cores, no GPU.
Runtime:   not measured over the full 400 iterations; the smoke run (2 iterations) takes a few seconds.
Expected:  not measured; the ResNet-18 demo gives box AP 40.8, mask AP 40.0 (conf/rfs_maskrcnn_demo.py).
Smoke:     train.max_iter=2 (tests/conf/test_configs.py runs it on a tiny copy of the data).
How to use: model.backbone.model_name takes any timm features_only model (resnet10t, convnext_atto, efficientnet_b0,
           swin_tiny_patch4_window7_224 with model.backbone.model_kwargs.strict_img_size=false ...); its strides and
           channels are read from timm's feature_info. model.backbone.pretrained=true starts from timm's ImageNet
           weights (downloaded once per machine).
"""

from lazytrain.config import LazyCall as L
from lazytrain.modeling import TimmBackbone

from .rfs_maskrcnn_demo import dataloader, launch, losses, lr_multiplier, model, objective, optimizer, train

# timm's ResNet-18-D (deep stem, avg-pool shortcut): the demo's ResNet-18 with timm's tweaks, trainable BN.
model.backbone = L(TimmBackbone)(
    model_name="resnet18d",
    pretrained=False,
    out_indices=4,
    frozen_stages=-1,
    freeze_bn=False,
    out_channels=64,
    model_kwargs={},  # timm.create_model's other arguments, e.g. {drop_path_rate: 0.1}
)
