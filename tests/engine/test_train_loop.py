import json
import math
import os
import subprocess
import sys

import pytest
import torch

from lazytrain.config import LazyConfig, instantiate
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.defaults import do_train, run
from lazytrain.engine.train_loop import SimpleTrainer
from tests.engine import toy
from tests.engine.conftest import TOY_CONFIG

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return [json.loads(line) for line in f]


def test_simple_trainer_loss_falls():
    torch.manual_seed(0)
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.05))
    hook = toy.RecordingHook()
    trainer.register_hooks([hook])
    trainer.train(0, 60)
    losses = [v for v, _ in trainer.storage.history("loss_mse").values()]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10


def test_hooks_called_in_order_with_iterations():
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    first, second = toy.RecordingHook("a"), toy.RecordingHook("b")
    order = []
    first.after_step = lambda: order.append(("a", first.trainer.iter))
    second.after_step = lambda: order.append(("b", second.trainer.iter))
    trainer.register_hooks({"first": first, "second": second})
    trainer.train(3, 6)
    assert first.events[0] == ("before_train", 3)
    assert [e for e in first.events if e[0] != "before_train"][:3] == [
        ("before_step", 3),
        ("after_backward", 3),
        ("before_step", 4),
    ]
    assert first.events[-1] == ("after_train", 6)
    assert order == [("a", 3), ("b", 3), ("a", 4), ("b", 4), ("a", 5), ("b", 5)]


def test_metrics_json_lines_at_log_period(toy_cfg):
    toy_cfg.train.max_iter = 12
    do_train(toy_cfg)
    records = [r for r in read_metrics(toy_cfg.train.output_dir) if "loss_mse" in r]
    assert [r["iteration"] for r in records] == [4, 9, 11]
    assert all(math.isfinite(r["total_loss"]) and "lr" in r and "time" in r for r in records)


def test_lr_schedule_values_follow_formula_and_max_iter_override(toy_cfg):
    LazyConfig.apply_overrides(toy_cfg, ["train.max_iter=18"])
    multiplier = instantiate(toy_cfg.lr_multiplier)
    assert multiplier.milestones == [12, 16]  # 2/3 and 8/9 of 18
    do_train(toy_cfg)
    lrs = {r["iteration"]: r["lr"] for r in read_metrics(toy_cfg.train.output_dir) if "lr" in r}
    base = 0.01
    assert lrs[4] == pytest.approx(base * (0.001 * (1 - 4 / 5) + 4 / 5))
    assert lrs[9] == pytest.approx(base)
    assert lrs[14] == pytest.approx(base * 0.1)
    assert lrs[17] == pytest.approx(base * 0.01)


def _run_toy_subprocess(output_dir, overrides, expect_kill=False):
    code = (
        "import sys, torch; torch.set_num_threads(1)\n"
        "from lazytrain.config import LazyConfig\n"
        "from lazytrain.engine.defaults import run\n"
        f"cfg = LazyConfig.load({TOY_CONFIG!r})\n"
        f"cfg.train.output_dir = {str(output_dir)!r}\n"
        "LazyConfig.apply_overrides(cfg, sys.argv[1:])\n"
        "run(cfg)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *overrides], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    if expect_kill:
        assert result.returncode == -9, result.stderr[-2000:]
    else:
        assert result.returncode == 0, result.stderr[-2000:]


def test_sigkill_and_resume_gives_bit_identical_weights(tmp_path):
    _run_toy_subprocess(tmp_path / "full", [])
    kill = "+train.hooks.killer={_target_: lazytrain.engine.hooks.CallbackHook, after_step: {_target_: functools.partial, _args_: [{_target_: lazytrain.config.locate, _args_: [tests.engine.toy.kill_self_at]}], iteration: 17}}"
    _run_toy_subprocess(tmp_path / "killed", [kill], expect_kill=True)
    assert open(tmp_path / "killed" / "last_checkpoint").read() == "model_0000014.pth"
    _run_toy_subprocess(tmp_path / "killed", ["train.resume=true"])
    full = torch.load(tmp_path / "full" / "model_final.pth", weights_only=True)
    resumed = torch.load(tmp_path / "killed" / "model_final.pth", weights_only=True)
    for key in full["model"]:
        assert torch.equal(full["model"][key], resumed["model"][key]), key
    assert full["trainer"]["iteration"] == resumed["trainer"]["iteration"] == 29


def test_resume_without_checkpoint_warns_and_starts_fresh(toy_cfg, caplog):
    toy_cfg.train.resume = True
    toy_cfg.train.max_iter = 3
    with caplog.at_level("WARNING", logger="lazytrain.engine.defaults"):
        do_train(toy_cfg)
    assert "has no last_checkpoint: starting from scratch" in caplog.text
    assert os.path.exists(os.path.join(toy_cfg.train.output_dir, "model_final.pth"))


def test_nan_loss_raises_with_iteration_and_keeps_last_checkpoint(toy_cfg):
    toy_cfg.model.nan_at_call = 13
    with pytest.raises(FloatingPointError, match=r"at iteration 12: loss_mse=nan, loss_zero=nan"):
        do_train(toy_cfg)
    checkpointer = Checkpointer(toy.ToyRegressor(), toy_cfg.train.output_dir)
    assert checkpointer.get_checkpoint_file().endswith("model_0000009.pth")
    assert checkpointer.load(checkpointer.get_checkpoint_file(), checkpointables=[])["iteration"] == 9


def test_bf16_autocast_on_cpu_trains():
    torch.manual_seed(0)
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(
        model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.05), amp_enabled=True
    )
    trainer.train(0, 40)
    losses = [v for v, _ in trainer.storage.history("loss_mse").values()]
    assert losses[-1] < losses[0]


def test_fp16_grad_scaler_state_is_checkpointed(tmp_path):
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(
        model,
        toy.ToyLoader(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        amp_enabled=True,
        amp_dtype="float16",
    )
    trainer.train(0, 3)
    state = trainer.state_dict()
    assert "scale" in state["grad_scaler"]


def test_clip_grad_norm_limits_update():
    model = toy.ToyRegressor()
    before = model.linear.weight.detach().clone()
    trainer = SimpleTrainer(
        model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=1.0), clip_grad_norm=1e-3
    )
    trainer.train(0, 1)
    assert (model.linear.weight - before).norm() <= 1e-3 + 1e-6


@pytest.mark.parametrize("bad", [{"amp_dtype": "float8"}, {"clip_grad_norm": -1.0}])
def test_trainer_rejects_bad_arguments(bad):
    model = toy.ToyRegressor()
    with pytest.raises(ValueError, match="SimpleTrainer"):
        SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.1), **bad)


def test_run_returns_after_writing_config_yaml(toy_cfg):
    toy_cfg.train.max_iter = 2
    run(toy_cfg)
    saved = LazyConfig.load(os.path.join(toy_cfg.train.output_dir, "config.yaml"))
    assert saved.train.max_iter == 2
    assert "timer" in saved.train.hooks
