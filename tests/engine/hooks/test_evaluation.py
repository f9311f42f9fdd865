import math

import pytest
import torch

from lazytrain.engine.hooks.evaluation import EvalHook, flatten_results
from lazytrain.engine.train_loop import SimpleTrainer
from tests.engine import toy
from tests.engine.hooks.fakes import toy_trainer


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


def test_flatten_results_rejects_non_numbers():
    assert flatten_results({"a": {"b": 1, "c": {"d": 2.5}}}) == {"a/b": 1.0, "a/c/d": 2.5}
    with pytest.raises(TypeError, match="'a/b' must be a number"):
        flatten_results({"a": {"b": "x"}})


def test_eval_hook_does_not_change_the_training_random_stream():
    torch.manual_seed(0)
    trainer = toy_trainer()
    trainer.register_hooks(
        {"eval": EvalHook(eval_period=1, eval_function=lambda: {"x": {"AP": torch.rand(1).item()}})}
    )
    trainer.train(0, 2)
    after_eval = torch.rand(1)
    torch.manual_seed(0)
    toy_trainer().train(0, 2)
    assert torch.equal(after_eval, torch.rand(1))
