"""Optimizers. ``optimizer``: SGD as in detectron2's recipes: lr 0.02 (total batch 16), momentum 0.9, wd 1e-4, no
decay on norm layers. ``AdamW``: AdamW with layer-wise LR decay for ViT and ConvNeXt backbones (ViTDet-B's
settings: lr 1e-4, wd 0.1, decay 0.7 over 12 blocks, no decay on norms and ``pos_embed``); a
config takes it with ``from ..recipes.optim import AdamW as optimizer`` and sets
``optimizer.params.num_layers`` to its backbone's block or stage count (`get_layer_id` says how layers count).
"""

import torch

from lazytrain.config import LazyCall as L
from lazytrain.engine.optimizer import get_default_optimizer_params, get_layer_decay_optimizer_params

optimizer = L(torch.optim.SGD)(
    params=L(get_default_optimizer_params)(weight_decay_norm=0.0),  # `model` is filled by the program
    lr=0.02,
    momentum=0.9,
    weight_decay=1e-4,
)

AdamW = L(torch.optim.AdamW)(
    params=L(get_layer_decay_optimizer_params)(  # `model` is filled by the program
        base_lr="${..lr}",  # each group's lr is base_lr * layer_decay ** (num_layers + 1 - layer)
        layer_decay=0.7,
        num_layers=12,
        weight_decay_norm=0.0,
        weight_decay_embed=0.0,
    ),
    lr=1e-4,
    betas=(0.9, 0.999),
    weight_decay=0.1,
)
