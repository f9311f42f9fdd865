"""SGD as in detectron2's recipes: lr 0.02 (total batch 16), momentum 0.9, wd 1e-4, no decay on norm layers."""

from torch.optim import SGD

from lazytrain.config import LazyCall as L
from lazytrain.engine.optimizer import get_default_optimizer_params

optimizer = L(SGD)(
    params=L(get_default_optimizer_params)(weight_decay_norm=0.0),  # `model` is filled by the program
    lr=0.02,
    momentum=0.9,
    weight_decay=1e-4,
)
