import os

import pytest
import torch
from pytest import param

from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.hooks.checkpointing import BestCheckpointer, PeriodicCheckpointer
from lazytrain.engine.hooks.evaluation import EvalHook
from lazytrain.engine.train_loop import SimpleTrainer
from tests.engine import toy
from tests.engine.hooks.fakes import FakeCheckpointer, toy_trainer


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


def test_best_checkpointer_min_mode():
    trainer = toy_trainer()
    trainer.checkpointer = FakeCheckpointer()
    values = iter([3.0, 1.0, 2.0])
    trainer.register_hooks(
        {
            "eval": EvalHook(eval_period=2, eval_function=lambda: {"val": {"loss": next(values)}}),
            "best": BestCheckpointer(eval_period=2, val_metric="val/loss", mode="min"),
        }
    )
    trainer.train(0, 6)
    assert trainer.checkpointer.saved == [("model_best", 1), ("model_best", 3)]


def test_periodic_checkpointer_keeps_last_n_across_resume(tmp_path):
    def make():
        trainer = toy_trainer()
        trainer.checkpointer = Checkpointer(
            trainer.model, str(tmp_path), optimizer=trainer.optimizer, trainer=trainer
        )
        trainer.register_hooks({"checkpointer": PeriodicCheckpointer(period=2, max_to_keep=2)})
        return trainer

    make().train(0, 7)  # saves 1, 3, 5 (1 deleted) and final
    assert sorted(os.listdir(tmp_path)) == [
        "last_checkpoint",
        "model_0000003.pth",
        "model_0000005.pth",
        "model_final.pth",
    ]
    resumed = make()
    start = resumed.checkpointer.load(str(tmp_path / "model_0000005.pth"))["iteration"] + 1
    resumed.train(start, 12)  # saves 7, 9 (3 and 5 deleted), final
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".pth")) == [
        "model_0000007.pth",
        "model_0000009.pth",
        "model_final.pth",
    ]


@pytest.mark.parametrize(
    "make, message",
    [
        param(lambda: PeriodicCheckpointer(period=0), r"period=\) must be > 0; got 0", id="period"),
        param(
            lambda: PeriodicCheckpointer(period=5, max_to_keep=0), r"max_to_keep=\) must be >= 1", id="keep"
        ),
        param(
            lambda: BestCheckpointer(5, "segm/AP", mode="high"), r"mode=\) must be 'max' or 'min'", id="mode"
        ),
    ],
)
def test_hooks_reject_bad_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()
