import pytest

from lazytrain.engine.hooks.lr_scheduler import LRScheduler
from lazytrain.engine.lr_schedule import WarmupMultiStepMultiplier
from tests.engine.hooks.fakes import toy_trainer


def test_lr_scheduler_continues_after_optimizer_state_restore():
    multiplier = WarmupMultiStepMultiplier([4], warmup_iters=2, warmup_factor=0.5)
    first = toy_trainer()
    first.register_hooks([LRScheduler(multiplier)])
    first.train(0, 3)
    second = toy_trainer()
    second.optimizer.load_state_dict(first.optimizer.state_dict())
    second.register_hooks([LRScheduler(multiplier)])
    second.train(3, 6)
    lrs = [v for v, _ in second.storage.history("lr").values()]
    assert lrs == pytest.approx([0.01, 0.001, 0.001])
