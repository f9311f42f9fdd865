"""The RFS Mask R-CNN demo (conf/rfs_maskrcnn_demo.py) with a small timm backbone, random init, sized for 2 CPU cores.

Command:   python -m lazytrain conf/rfs_maskrcnn_demo_timm.py
           python -m lazytrain conf/rfs_maskrcnn_demo_timm.py model.backbone.model_name=convnext_atto
Hardware:  2 CPU cores, no GPU.
Runtime:   about 4 min on 2 CPU cores (400 iterations and inference on 250 val images), a little longer than
           conf/rfs_maskrcnn_demo.py (docs/benchmarks.md has the timings).
Expected:  mask AP 32.9 (APr 15.0), box AP 33.7 (APr 13.7) (one thread, seed 0, one run). The ResNet-18 demo,
           conf/rfs_maskrcnn_demo.py, gave mask AP 35.4 (APr 20.5), box AP 36.1 (APr 18.2) with one thread, seed 0
           (conf/cascade_maskrcnn_demo.py's docstring); one seed each, so the gap says little.
Smoke:     train.max_iter=2 (tests/conf/test_configs.py runs it on a tiny copy of the data).
How to use: model.backbone.model_name takes any timm features_only model (resnet10t, convnext_atto, efficientnet_b0,
           regnetx_002; swin_tiny_patch4_window7_224 with 'model.backbone.model_kwargs={strict_img_size:false}');
           its strides and channels are read from timm's feature_info. A plain ViT takes the simple pyramid:
           model.backbone.model_name=vit_tiny_patch16_224 model.backbone.out_indices=[-1]
           'model.backbone.model_kwargs={img_size:192,dynamic_img_size:true}'. model.backbone.pretrained=true starts
           from timm's ImageNet weights (downloaded once per machine).
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
    grad_checkpointing=False,  # true: recompute block activations in backward (less memory, same gradients)
)
