"""The contract every standard hook keeps: it runs, survives an exception mid-run, and its state round-trips."""

import io

import pytest
import torch

from lazytrain.engine import hooks
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
)
from lazytrain.engine.lr_schedule import WarmupCosineMultiplier
from lazytrain.engine.train_loop import HookBase
from tests.engine.hooks.fakes import FakeCheckpointer, toy_trainer

# One factory per hook of lazytrain.engine.hooks: the contract suite below runs each of them.
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
