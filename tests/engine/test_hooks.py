import io
import math
import os

import pytest
import torch
from pytest import param

from lazytrain.engine import hooks
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.hooks import (
    BestCheckpointer,
    CallbackHook,
    EvalHook,
    IterationTimer,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
    TorchMemoryStats,
    TorchProfiler,
    flatten_results,
)
from lazytrain.engine.lr_schedule import WarmupCosineMultiplier, WarmupMultiStepMultiplier
from lazytrain.engine.train_loop import HookBase, SimpleTrainer
from tests.engine import toy


class FakeCheckpointer:
    save_dir = ""

    def __init__(self):
        self.saved = []

    def save(self, name, **extra):
        self.saved.append((name, extra["iteration"]))


def toy_trainer(**kwargs):
    model = toy.ToyRegressor()
    return SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01), **kwargs)


# One factory per hook in lazytrain.engine.hooks: the contract suite below runs each of them.
HOOK_FACTORIES = {
    "BestCheckpointer": lambda tmp: BestCheckpointer(eval_period=2, val_metric="toy/AP"),
    "CallbackHook": lambda tmp: CallbackHook(after_step=lambda trainer: None),
    "EvalHook": lambda tmp: EvalHook(eval_period=2, eval_function=lambda: {"toy": {"AP": 1.0}}),
    "IterationTimer": lambda tmp: IterationTimer(),
    "LRScheduler": lambda tmp: LRScheduler(WarmupCosineMultiplier(max_iter=6, warmup_iters=2)),
    "PeriodicCheckpointer": lambda tmp: PeriodicCheckpointer(period=2, max_to_keep=1),
    "PeriodicWriter": lambda tmp: PeriodicWriter(str(tmp), period=2, tensorboard=False),
    "TorchMemoryStats": lambda tmp: TorchMemoryStats(period=2),
    "TorchProfiler": lambda tmp: TorchProfiler(str(tmp), start_iter=1, end_iter=3),
}


def test_every_hook_is_in_the_contract_suite():
    classes = {
        name
        for name in hooks.__all__
        if isinstance(getattr(hooks, name), type) and issubclass(getattr(hooks, name), HookBase)
    }
    assert classes == set(HOOK_FACTORIES)


def _run_with(hook, tmp_path, max_iter, fail_at=None):
    trainer = toy_trainer()
    trainer.checkpointer = FakeCheckpointer()
    trainer.test_function = lambda: {"toy": {"AP": 2.0}}
    hook_map = {"eval": EvalHook(eval_period=2, eval_function=lambda: {"toy": {"AP": 1.0}}), "hook": hook}
    if fail_at is not None:

        def fail(t):
            if t.iter == fail_at:
                raise RuntimeError("boom")

        hook_map["fail"] = CallbackHook(after_step=fail)
    trainer.register_hooks(hook_map)
    trainer.train(0, max_iter)
    return trainer


@pytest.mark.parametrize("name", sorted(HOOK_FACTORIES))
def test_hook_contract(name, tmp_path):
    """Each hook runs a few steps, survives an exception mid-run (after_train still runs cleanly), and its
    state is weights-only serialisable and loads into a fresh instance."""
    hook = HOOK_FACTORIES[name](tmp_path)
    _run_with(hook, tmp_path, max_iter=6)
    state = hook.state_dict()
    assert isinstance(state, dict)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state
    fresh = HOOK_FACTORIES[name](tmp_path / "fresh")
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state

    with pytest.raises(RuntimeError, match="boom"):
        _run_with(HOOK_FACTORIES[name](tmp_path / "failing"), tmp_path / "failing", max_iter=6, fail_at=2)


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


def test_callback_hook_runs_each_moment():
    calls = []
    moments = ["before_train", "before_step", "after_backward", "after_step", "after_train"]
    hook = CallbackHook(**{m: (lambda trainer, m=m: calls.append((m, trainer.iter))) for m in moments})
    trainer = toy_trainer()
    trainer.register_hooks([hook])
    trainer.train(0, 1)
    assert calls == [(m, 0) for m in moments[:-1]] + [("after_train", 1)]


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


def test_profiler_finishes_when_training_ends_inside_its_window(tmp_path):
    trainer = toy_trainer()
    trainer.register_hooks([TorchProfiler(str(tmp_path), start_iter=1, end_iter=100)])
    trainer.train(0, 3)
    assert os.listdir(tmp_path) == ["profiler-trace-rank0-iter3.json"]
