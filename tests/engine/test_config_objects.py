"""Issue 9: trainers and hooks are config objects (declared, overridden, added and removed as config)."""

import json
import os

import pytest
from omegaconf import OmegaConf
from pytest import param

from lazytrain.config import LazyCall as L
from lazytrain.config import LazyConfig
from lazytrain.program.default import INJECTED_ARGUMENTS, do_train, run
from tests.engine import toy


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return [json.loads(line) for line in f]


def test_custom_hook_added_in_one_line(toy_cfg):
    toy_cfg.train.max_iter = 4
    toy_cfg.train.hooks.recorder = L(toy.RecordingHook)(tag="mine")
    do_train(toy_cfg)
    assert toy.RecordingHook.last.tag == "mine"
    assert ("after_step", 3) in toy.RecordingHook.last.events


def test_hook_added_from_the_command_line_runs_after_the_defaults(toy_cfg):
    toy_cfg.train.max_iter = 3
    LazyConfig.apply_overrides(
        toy_cfg, ["+train.hooks.rec={_target_: tests.engine.toy.RecordingHook, tag: cli}"]
    )
    assert list(toy_cfg.train.hooks)[-1] == "rec"
    do_train(toy_cfg)
    assert toy.RecordingHook.last.tag == "cli"
    assert toy.RecordingHook.last.trainer.hooks[-1] is toy.RecordingHook.last


@pytest.mark.parametrize(
    "removed, absent",
    [
        param("checkpointer", ".pth", id="checkpointer"),
        param("eval", "toy/AP", id="eval"),
        param("writer", "metrics.json", id="writer"),
    ],
)
def test_remove_default_hook_from_command_line(toy_cfg, removed, absent):
    toy_cfg.train.max_iter = 6
    LazyConfig.apply_overrides(toy_cfg, [f"~train.hooks.{removed}"])
    do_train(toy_cfg)
    output_dir = toy_cfg.train.output_dir
    files = os.listdir(output_dir)
    if absent == "toy/AP":
        assert not any(absent in record for record in read_metrics(output_dir))
    else:
        assert not any(f.endswith(absent) for f in files), files


def test_hook_parameter_override(toy_cfg):
    toy_cfg.train.max_iter = 10
    LazyConfig.apply_overrides(
        toy_cfg, ["train.hooks.checkpointer.period=3", "train.hooks.checkpointer.max_to_keep=1"]
    )
    do_train(toy_cfg)
    files = sorted(f for f in os.listdir(toy_cfg.train.output_dir) if f.endswith(".pth"))
    assert files == ["model_0000008.pth", "model_final.pth"]


def test_run_setting_reaches_hooks_by_interpolation(toy_cfg):
    toy_cfg.train.max_iter = 7
    LazyConfig.apply_overrides(toy_cfg, ["train.log_period=2", "train.eval_period=3"])
    do_train(toy_cfg)
    records = read_metrics(toy_cfg.train.output_dir)
    assert [r["iteration"] for r in records if "loss_mse" in r] == [1, 3, 5, 6]
    assert [r["iteration"] for r in records if "toy/AP" in r] == [2, 5, 7]  # period, and after training


def test_trainer_class_swapped_by_target(toy_cfg):
    toy_cfg.train.max_iter = 5
    LazyConfig.apply_overrides(
        toy_cfg,
        [
            "train.trainer._target_=tests.engine.toy.MarkerTrainer",
            "+train.hooks.rec={_target_: tests.engine.toy.RecordingHook}",
        ],
    )
    do_train(toy_cfg)
    assert isinstance(toy.RecordingHook.last.trainer, toy.MarkerTrainer)
    assert toy.RecordingHook.last.trainer.marker_steps == 5


def test_trainer_option_from_run_settings(toy_cfg):
    toy_cfg.train.max_iter = 2
    LazyConfig.apply_overrides(
        toy_cfg,
        [
            "train.clip_grad.enabled=true",
            "train.clip_grad.max_norm=0.5",
            "+train.hooks.rec={_target_: tests.engine.toy.RecordingHook}",
        ],
    )
    do_train(toy_cfg)
    assert toy.RecordingHook.last.trainer.clip_grad_norm == 0.5


def test_shared_objects_built_once(toy_cfg):
    toy_cfg.train.max_iter = 3
    do_train(toy_cfg)
    # the test loader and evaluator are built by each evaluation (here: once, after training)
    assert toy.CONSTRUCTIONS == {"model": 1, "optimizer": 1, "loader": 1, "test_loader": 1, "evaluator": 1}


def test_final_eval_lands_in_metrics_json_and_is_returned(toy_cfg):
    toy_cfg.train.max_iter = 4
    results = run(toy_cfg)
    assert set(results["toy"]) == {"AP", "MAE"}
    last = read_metrics(toy_cfg.train.output_dir)[-1]
    assert last["iteration"] == 4 and last["toy/AP"] == pytest.approx(results["toy"]["AP"])


def test_eval_only_evaluates_init_checkpoint_and_writes_metrics(toy_cfg, tmp_path):
    toy_cfg.train.max_iter = 4
    trained = run(toy_cfg)
    eval_cfg = LazyConfig.load(os.path.join(toy_cfg.train.output_dir, "config.yaml"))
    eval_cfg.train.output_dir = str(tmp_path / "eval")
    LazyConfig.apply_overrides(
        eval_cfg,
        [
            "train.eval_only=true",
            f"train.init_checkpoint={os.path.join(toy_cfg.train.output_dir, 'model_final.pth')}",
        ],
    )
    toy.CONSTRUCTIONS.clear()
    results = run(eval_cfg)
    assert results == trained
    assert read_metrics(eval_cfg.train.output_dir) == [
        {"iteration": 0, "toy/AP": trained["toy"]["AP"], "toy/MAE": trained["toy"]["MAE"]}
    ]
    assert "optimizer" not in toy.CONSTRUCTIONS and "loader" not in toy.CONSTRUCTIONS


def test_saved_config_reproduces_trainer_and_hooks(toy_cfg, tmp_path):
    toy_cfg.train.hooks.recorder = L(toy.RecordingHook)(tag="saved")
    LazyConfig.save(toy_cfg, str(tmp_path / "c.yaml"))
    again = LazyConfig.load(str(tmp_path / "c.yaml"))
    assert list(again.train.hooks) == ["timer", "lr_scheduler", "checkpointer", "eval", "writer", "recorder"]
    assert again.train.trainer._target_ == "lazytrain.engine.train_loop.SimpleTrainer"
    # plain data, not a built object
    assert OmegaConf.to_container(again.train.hooks.lr_scheduler)["multiplier"] == "${lr_multiplier}"
    again.train.max_iter = 2
    do_train(again)
    assert toy.RecordingHook.last.tag == "saved"


def test_recipe_config_passes_validation_with_injected_arguments(toy_cfg):
    from lazytrain.config import find_problems

    assert find_problems(toy_cfg, INJECTED_ARGUMENTS) == []
