import functools
import itertools
import json
import math
import os
import signal

import pytest
import torch
from pytest import param

from lazytrain.config import LazyCall as L
from lazytrain.config import LazyConfig, instantiate
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.ema import EMAHook, ModelEMA
from lazytrain.engine.hooks import CallbackHook, EvalHook, LRScheduler, PeriodicCheckpointer
from lazytrain.engine.lr_schedule import WarmupMultiStepMultiplier
from lazytrain.engine.rng_state import get_rng_state
from lazytrain.engine.train_loop import SimpleTrainer
from lazytrain.errors import is_agreed
from lazytrain.program.default import do_train, run
from lazytrain.utils.preemption import TrainingInterrupted
from tests.engine import toy
from tests.engine.conftest import TOY_CONFIG
from tests.warm_command import run_warm

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


def _run_toy_command(output_dir, overrides, expect_kill=False):
    """``python -m lazytrain TOY_CONFIG`` into `output_dir`, forked warm (a process of its own, which the
    killing hook ends)."""
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    result = run_warm([TOY_CONFIG, f"hydra.run.dir={output_dir}", *overrides], REPO, env)
    if expect_kill:
        assert result.returncode == -9, result.stderr[-2000:]
    else:
        assert result.returncode == 0, result.stderr[-2000:]


def test_sigkill_and_resume_gives_bit_identical_weights(toy_cfg, tmp_path):
    run(toy_cfg)  # the uninterrupted reference, in this process
    killer = (
        "+train.hooks.killer={_target_: lazytrain.engine.hooks.CallbackHook, after_step: {_target_: "
        "functools.partial, _args_: [{_target_: lazytrain.config.locate, _args_: [tests.engine.toy.kill_self_at]}], "
        "iteration: 17}}"
    )
    _run_toy_command(tmp_path / "killed", [killer], expect_kill=True)
    assert open(tmp_path / "killed" / "last_checkpoint").read() == "model_0000014.pth"
    _run_toy_command(tmp_path / "killed", ["train.resume=true"])
    full = torch.load(os.path.join(toy_cfg.train.output_dir, "model_final.pth"), weights_only=True)
    resumed = torch.load(tmp_path / "killed" / "model_final.pth", weights_only=True)
    for key in full["model"]:
        assert torch.equal(full["model"][key], resumed["model"][key]), key
    assert full["trainer"]["iteration"] == resumed["trainer"]["iteration"] == 29
    # the resumed run appended to metrics.json and evaluated at the end, like the reference
    assert (
        read_metrics(tmp_path / "killed")[-1]["toy/AP"]
        == read_metrics(toy_cfg.train.output_dir)[-1]["toy/AP"]
    )


def test_resume_without_checkpoint_warns_and_starts_fresh(toy_cfg, caplog):
    toy_cfg.train.resume = True
    toy_cfg.train.max_iter = 3
    # What a first attempt that failed before its first checkpoint left (metrics of iterations to be redone).
    os.makedirs(toy_cfg.train.output_dir, exist_ok=True)
    with open(os.path.join(toy_cfg.train.output_dir, "metrics.json"), "w") as f:
        f.writelines(f'{{"iteration": {i}, "stale": 1}}\n' for i in range(3))
    with caplog.at_level("WARNING", logger="lazytrain.program.default"):
        do_train(toy_cfg)
    assert "has no last_checkpoint: starting from scratch" in caplog.text
    assert os.path.exists(os.path.join(toy_cfg.train.output_dir, "model_final.pth"))
    iterations = [record["iteration"] for record in read_metrics(toy_cfg.train.output_dir)]
    assert iterations == sorted(set(iterations)), iterations  # each once, in order
    assert not any("stale" in record for record in read_metrics(toy_cfg.train.output_dir))
    kept = os.path.join(toy_cfg.train.output_dir, "metrics.earlier-1.json")
    assert open(kept).read().count('"stale": 1') == 3  # the first attempt's metrics, kept


def test_nan_loss_raises_with_iteration_and_keeps_last_checkpoint(toy_cfg, caplog):
    toy_cfg.model.nan_at_call = 13
    toy_cfg.train.hooks.recorder = L(toy.RecordingHook)()
    nan_error = pytest.raises(FloatingPointError, match=r"at iteration 12: loss_mse=nan, loss_zero=nan")
    with caplog.at_level("ERROR", logger="lazytrain.engine.train_loop"), nan_error:
        do_train(toy_cfg)
    assert "Exception during training at iteration 12" in caplog.text
    assert toy.RecordingHook.last.events[-1] == ("after_train", 12)  # end-of-training hooks still ran
    checkpointer = Checkpointer(toy.ToyRegressor(), toy_cfg.train.output_dir)
    assert checkpointer.get_checkpoint_file().endswith("model_0000009.pth")
    assert checkpointer.load(checkpointer.get_checkpoint_file(), checkpointables=[])["iteration"] == 9
    # the writers flushed what was logged before the failure; no evaluation after a failed run
    records = read_metrics(toy_cfg.train.output_dir)
    assert [r["iteration"] for r in records if "loss_mse" in r][-1] == 11
    assert not any("toy/AP" in r for r in records)


def test_bf16_autocast_on_cpu_trains():
    torch.manual_seed(0)
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(
        model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.05), amp_enabled=True
    )
    trainer.train(0, 40)
    losses = [v for v, _ in trainer.storage.history("loss_mse").values()]
    assert losses[-1] < losses[0]


def test_fp16_grad_scaler_state_is_checkpointed():
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
        model,
        toy.ToyLoader(),
        torch.optim.SGD(model.parameters(), lr=1.0),
        clip_grad_enabled=True,
        clip_grad_max_norm=1e-3,
    )
    trainer.train(0, 1)
    assert (model.linear.weight - before).norm() <= 1e-3 + 1e-6


@pytest.mark.parametrize(
    "bad, message",
    [
        param(
            {"amp_dtype": "float8"}, r"amp_dtype=\) must be 'bfloat16' or 'float16'; got 'float8'", id="dtype"
        ),
        param({"clip_grad_enabled": True}, r"clip_grad_max_norm=\) must be > 0 .*got None", id="no-norm"),
        param(
            {"clip_grad_enabled": True, "clip_grad_max_norm": -1.0},
            r"clip_grad_max_norm=\) must be > 0 .*got -1.0",
            id="negative-norm",
        ),
    ],
)
def test_trainer_rejects_bad_arguments(bad, message):
    model = toy.ToyRegressor()
    with pytest.raises(ValueError, match=message):
        SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.1), **bad)


def test_max_norm_without_enabled_warns_that_nothing_is_clipped(caplog):
    model = toy.ToyRegressor()
    with caplog.at_level("WARNING", logger="lazytrain.engine.train_loop"):
        trainer = SimpleTrainer(
            model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.1), clip_grad_max_norm=10.0
        )
    assert trainer.clip_grad_norm is None
    assert "gradients are NOT clipped; set train.clip_grad.enabled=true" in caplog.text


def test_finite_loader_ending_is_a_clear_error():
    model = toy.ToyRegressor()
    batches = [(torch.randn(8, 4), torch.randn(8))] * 2
    trainer = SimpleTrainer(model, batches, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="data loader ended at iteration 2; it must yield batches forever"):
        trainer.train(0, 5)


def test_a_single_loss_tensor_is_recorded_as_total_loss():
    class TensorLoss(toy.ToyRegressor):
        def forward(self, batch):
            return super().forward(batch)["loss_mse"]

    model = TensorLoss()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.train(0, 2)
    assert [i for _, i in trainer.storage.history("total_loss").values()] == [0, 1]


def test_fp16_grad_scaler_state_round_trips():
    def make():
        model = toy.ToyRegressor()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        return SimpleTrainer(model, toy.ToyLoader(), optimizer, amp_enabled=True, amp_dtype="float16")

    trainer = make()
    trainer.train(0, 3)
    trainer.grad_scaler.update(1234.0)
    state = trainer.state_dict()
    other = make()
    other.load_state_dict(state)
    assert other.grad_scaler.get_scale() == 1234.0


def _trainer_with_checkpoints(output_dir, seed, stop_at=None, ema=False, images_per_forward=None):
    torch.manual_seed(seed)
    model = toy.ToyRegressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = SimpleTrainer(model, toy.ToyLoader(), optimizer, images_per_forward=images_per_forward)
    trainer.model_ema = ModelEMA(model, decay=0.8, tau=2) if ema else None
    trainer.checkpointer = Checkpointer(
        model, str(output_dir), model_ema=trainer.model_ema, optimizer=optimizer, trainer=trainer
    )

    def evaluate():
        torch.randn(7)  # evaluation drawing random numbers must not shift the training stream
        return {"toy": {"AP": float(model.linear.weight.detach().sum())}}  # which weights were evaluated

    def stop(t):
        if t.iter == stop_at:
            raise KeyboardInterrupt("stopped")

    trainer.register_hooks({"ema": EMAHook()} if ema else {})
    trainer.register_hooks(
        {
            "random_setup": toy.RandomDrawingHook(),
            "lr_scheduler": LRScheduler(WarmupMultiStepMultiplier([6], warmup_iters=3)),
            "checkpointer": PeriodicCheckpointer(period=4, max_to_keep=1),
            "eval": EvalHook(eval_period=2, eval_function=evaluate),
            "stop": CallbackHook(after_step=stop),
        }
    )
    return trainer


@pytest.mark.parametrize(
    "options",
    [param({}, id="plain"), param({"ema": True, "images_per_forward": 2}, id="ema-accumulation")],
)
def test_in_process_resume_is_bit_exact_despite_random_draws_in_setup_and_eval(tmp_path, options):
    full = _trainer_with_checkpoints(tmp_path / "full", seed=0, **options)
    full.train(0, 10)
    interrupted = _trainer_with_checkpoints(tmp_path / "cut", seed=0, stop_at=6, **options)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train(0, 10)
    # Other initial weights and RNG: all must be restored.
    resumed = _trainer_with_checkpoints(tmp_path / "cut", seed=1, **options)
    extra = resumed.checkpointer.load(resumed.checkpointer.get_checkpoint_file())
    assert extra["iteration"] == 3
    resumed.train(extra["iteration"] + 1, 10)
    for key, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.optimizer.param_groups[0]["lr"] == full.optimizer.param_groups[0]["lr"]
    evaluated = full.storage.history("toy/AP").values()
    after_resume = [(value, i) for value, i in resumed.storage.history("toy/AP").values() if i > 3]
    assert after_resume == [(value, i) for value, i in evaluated if i > 3] and len(after_resume) == 3
    if options.get("ema"):
        for key, value in full.model_ema.averaged_state.items():
            assert torch.equal(value, resumed.model_ema.averaged_state[key]), key
        assert resumed.model_ema.updates == full.model_ema.updates == 10
        # The EMA weights were evaluated, not the trained ones.
        assert evaluated[-1][0] == float(full.model_ema.averaged_state["linear.weight"].sum())
        assert evaluated[-1][0] != float(full.model.linear.weight.detach().sum())


def test_run_returns_after_writing_config_yaml(toy_cfg):
    toy_cfg.train.max_iter = 2
    run(toy_cfg)
    saved = LazyConfig.load(os.path.join(toy_cfg.train.output_dir, "config.yaml"))
    assert saved.train.max_iter == 2
    assert "timer" in saved.train.hooks


def test_register_hooks_rejects_non_hooks_naming_the_key():
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(
        TypeError, match=r"train.hooks.oops: expected a HookBase instance, got dict.*~train.hooks.oops"
    ):
        trainer.register_hooks({"oops": {"period": 3}})


@pytest.mark.parametrize("during", ["step", "evaluation"])
def test_a_stop_every_rank_agreed_on_is_not_taken_for_a_rank_failure(toy_cfg, during):
    """The trainer's `TrainingInterrupted` is marked agreed (every rank raises it at the same iteration), so a
    rank watch does not record it as this rank's failure and end a peer still writing its checkpoint."""
    toy_cfg.train.eval_period = 5
    function = toy.send_signal_at if during == "step" else toy.signal_during_evaluation
    moment = "after_step" if during == "step" else "before_train"
    hook = L(CallbackHook)(
        **{moment: L(functools.partial)(function, iteration=4, signum=int(signal.SIGTERM))}
    )
    toy_cfg.train.hooks.stop = hook
    with pytest.raises(TrainingInterrupted) as stopped:
        run(toy_cfg)
    assert is_agreed(stopped.value) and stopped.value.signum == signal.SIGTERM


def _rank_loader(monkeypatch, sampler_kind, rank, world_size):
    """A train loader of 4 images per step over `world_size` ranks, built as rank `rank`; each item is its
    image id and the augmentation seed it was mapped with."""
    from lazytrain.data.build import build_detection_train_loader
    from lazytrain.data.mixture_sampler import MixtureTrainingSampler
    from lazytrain.data.samplers import RepeatFactorTrainingSampler
    from lazytrain.utils import comm

    monkeypatch.setattr(comm, "get_world_size", lambda: world_size)
    monkeypatch.setattr(comm, "get_rank", lambda: rank)
    ranks = dict(rank=rank, world_size=world_size)
    sampler = {
        "uniform": None,
        "rfs": RepeatFactorTrainingSampler(torch.linspace(0.5, 2.5, 30), seed=4, **ranks),
        "mixture": MixtureTrainingSampler([20, 10], [3, 1], 4, seed=4, **ranks),
    }[sampler_kind]
    return build_detection_train_loader(
        [{"image_id": i} for i in range(30)],
        mapper=lambda record: (record["image_id"], torch.initial_seed()),
        sampler=sampler,
        total_batch_size=4,
        aspect_ratio_grouping=False,
        seed=4,
    )


def _ids_and_seeds(batches):
    return [(sorted(i for i, _ in batch), sorted(s for _, s in batch)) for batch in batches]


@pytest.mark.parametrize("sampler_kind", ["uniform", "rfs", "mixture"])
def test_a_run_stopped_on_two_ranks_continues_the_global_stream_on_one(monkeypatch, sampler_kind, caplog):
    # Every step's global batch is the same whatever the world size (rank r of W takes r, r + W, ... of the
    # stream), and so is each item's augmentation seed (from its global position).
    uninterrupted = list(itertools.islice(iter(_rank_loader(monkeypatch, sampler_kind, 0, 1)), 12))
    two = [_rank_loader(monkeypatch, sampler_kind, rank, 2) for rank in (0, 1)]
    before = [list(itertools.islice(iter(loader), 5)) for loader in two]
    assert _ids_and_seeds(a + b for a, b in zip(*before)) == _ids_and_seeds(uninterrupted[:5])
    per_rank = [{"rng": get_rng_state(), "data_loader": loader.state_dict()} for loader in two]
    checkpoint = {"iteration": 4, "hooks": {}, "storage": {}, "per_rank": per_rank}

    model = toy.ToyRegressor()
    loader = _rank_loader(monkeypatch, sampler_kind, 0, 1)
    resumed = SimpleTrainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1))
    resumed.load_state_dict(checkpoint)
    assert "written by 2 process(es), this run has 1: the data continue the same global stream" in caplog.text
    after = [resumed._batches.next(step)[0] for step in range(5, 12)]
    assert _ids_and_seeds(after) == _ids_and_seeds(uninterrupted[5:])
