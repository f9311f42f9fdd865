"""A runnable toy config on the real recipes: tiny regression model, resumable toy loader, CPU."""

from lazytrain.config import LazyCall as L
from tests.engine.toy import ToyLoader, ToyRegressor, make_sgd

from ...recipes.schedules import lr_multiplier
from ...recipes.train import train

model = L(ToyRegressor)(dim=4)
optimizer = L(make_sgd)(params=None, lr=0.01)
dataloader = dict(train=L(ToyLoader)(batch_size=8, dim=4, seed=0))
lr_multiplier.warmup_iters = 5

train.output_dir = "???"
train.max_iter = 30
train.device = "cpu"
train.log_period = 5
train.eval_period = 0
train.checkpointer.period = 5
train.hooks.pop("eval")
