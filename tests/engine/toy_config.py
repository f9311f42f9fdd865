"""A runnable toy config on the real recipes: tiny regression model, resumable toy loader, toy evaluator, CPU."""

from lazytrain.config import LazyCall as L
from lazytrain.engine.optimizer import get_default_optimizer_params
from tests.engine.toy import ToyEvaluator, ToyLoader, ToyRegressor, make_sgd, make_test_loader

from ...recipes.schedules import lr_multiplier
from ...recipes.train import train

model = L(ToyRegressor)(dim=4)
optimizer = L(make_sgd)(params=L(get_default_optimizer_params)(weight_decay_norm=0.0), lr=0.01)
dataloader = dict(
    train=L(ToyLoader)(batch_size=8, dim=4, seed=0),
    test=L(make_test_loader)(num_batches=3, dim=4),
    evaluator=L(ToyEvaluator)(),
)
lr_multiplier.warmup_iters = 5

train.output_dir = "???"
train.max_iter = 30
train.device = "cpu"
train.log_period = 5
train.eval_period = 0  # evaluate after training only
train.checkpointer.period = 5
train.hooks.writer.tensorboard = False
del train.hooks.plots  # toy runs need no pictures (and the engine tests run many of them)

objective = dict(
    metric="toy/AP", direction="maximize"
)  # what a search sweep (hydra/sweeper=optuna) optimises
