import math

import pytest
import torch

from lazytrain.engine.hooks import BestCheckpointer, EvalHook, flatten_results
from lazytrain.engine.lr_schedule import WarmupCosineMultiplier, WarmupMultiStepMultiplier
from lazytrain.engine.train_loop import SimpleTrainer
from tests.engine import toy


class FakeCheckpointer:
    def __init__(self):
        self.saved = []

    def save(self, name, **extra):
        self.saved.append((name, extra["iteration"]))


def test_eval_hook_period_and_after_train_put_flat_metrics():
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    calls = []

    def evaluate():
        calls.append(trainer.iter)
        return {"bbox": {"AP": float(len(calls)), "APr": float("nan")}}

    trainer.register_hooks({"eval": EvalHook(eval_period=4, eval_function=evaluate)})
    trainer.train(0, 10)
    assert calls == [3, 7, 10]
    latest = trainer.storage.latest()
    assert latest["bbox/AP"] == (3.0, 10)
    assert math.isnan(latest["bbox/APr"][0])


def test_best_checkpointer_ignores_nan_and_tracks_max():
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.checkpointer = FakeCheckpointer()
    values = iter([float("nan"), 5.0, 3.0, 7.0, float("nan")])
    eval_hook = EvalHook(eval_period=2, eval_function=lambda: {"segm": {"AP": next(values)}})
    best = BestCheckpointer(eval_period=2, val_metric="segm/AP")
    trainer.register_hooks({"eval": eval_hook, "best": best})
    trainer.train(0, 9)
    assert trainer.checkpointer.saved == [("model_best", 3), ("model_best", 7)]
    assert best.best_value == 7.0


def test_flatten_results_rejects_non_numbers():
    assert flatten_results({"a": {"b": 1, "c": {"d": 2.5}}}) == {"a/b": 1.0, "a/c/d": 2.5}
    with pytest.raises(TypeError, match="'a/b' must be a number"):
        flatten_results({"a": {"b": "x"}})


@pytest.mark.parametrize(
    "iteration, expected",
    [
        (0, 0.001),
        (500, 0.001 * 0.5 + 0.5),
        (1000, 1.0),
        (119999, 1.0),
        (120000, 0.1),
        (159999, 0.1),
        (160000, 0.01),
    ],
)
def test_multistep_formula(iteration, expected):
    multiplier = WarmupMultiStepMultiplier([120000, 160000], warmup_iters=1000, warmup_factor=0.001)
    assert multiplier(iteration) == pytest.approx(expected)


def test_cosine_formula():
    multiplier = WarmupCosineMultiplier(max_iter=100, warmup_iters=0)
    assert multiplier(0) == pytest.approx(1.0)
    assert multiplier(50) == pytest.approx(0.5)
    assert multiplier(100) == pytest.approx(0.0)
