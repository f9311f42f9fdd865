"""Issue 9: trainers and hooks are config objects."""

import os

from lazytrain.config import LazyCall as L
from lazytrain.config import LazyConfig
from lazytrain.engine.defaults import do_train
from tests.engine import toy


def test_custom_hook_added_in_one_line(toy_cfg):
    toy_cfg.train.max_iter = 4
    toy_cfg.train.hooks.recorder = L(toy.RecordingHook)(tag="mine")
    do_train(toy_cfg)
    assert toy.RecordingHook.last.tag == "mine"
    assert ("after_step", 3) in toy.RecordingHook.last.events


def test_remove_default_hook_from_command_line(toy_cfg):
    toy_cfg.train.max_iter = 10
    LazyConfig.apply_overrides(toy_cfg, ["~train.hooks.checkpointer"])
    do_train(toy_cfg)
    assert not any(f.endswith(".pth") for f in os.listdir(toy_cfg.train.output_dir))


def test_hook_parameter_override(toy_cfg):
    toy_cfg.train.max_iter = 10
    LazyConfig.apply_overrides(
        toy_cfg, ["train.hooks.checkpointer.period=3", "train.hooks.checkpointer.max_to_keep=1"]
    )
    do_train(toy_cfg)
    files = sorted(f for f in os.listdir(toy_cfg.train.output_dir) if f.endswith(".pth"))
    assert files == ["model_0000008.pth", "model_final.pth"]


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
    assert toy.RecordingHook.last.trainer.marker_steps == 5


def test_shared_objects_built_once(toy_cfg):
    toy_cfg.train.max_iter = 3
    do_train(toy_cfg)
    assert toy.CONSTRUCTIONS == {"model": 1, "optimizer": 1, "loader": 1}


def test_saved_config_reproduces_trainer_and_hooks(toy_cfg, tmp_path):
    toy_cfg.train.hooks.recorder = L(toy.RecordingHook)(tag="saved")
    LazyConfig.save(toy_cfg, str(tmp_path / "c.yaml"))
    again = LazyConfig.load(str(tmp_path / "c.yaml"))
    assert list(again.train.hooks) == ["timer", "lr_scheduler", "checkpointer", "writer", "recorder"]
    assert again.train.trainer._target_ == "lazytrain.engine.train_loop.SimpleTrainer"
    again.train.max_iter = 2
    do_train(again)
    assert toy.RecordingHook.last.tag == "saved"
