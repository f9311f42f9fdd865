"""A plain value given on the command line to a key whose node builds an object (``copy_paste=rare`` for
``copy_paste.mode=rare``) stops the command in one line, before Hydra writes the run folder."""

import os
from typing import Optional

import pytest
from omegaconf import OmegaConf

from lazytrain.program.preflight.command_line import find_node_replaced_by_value_problems
from lazytrain.program.primary_config import load_primary_config
from tests.launch.test_entrypoint import lazytrain

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")
CUSTOM = os.path.join(REPO, "conf", "rfs_maskrcnn_custom.py")
COPY_PASTE_ARGUMENTS = "(mode, prob, max_objects, min_area, repeat_thresh)"


def test_a_string_for_a_node_stops_before_the_run_folder_naming_the_argument_form(tmp_path):
    run_dir = tmp_path / "run"
    result = lazytrain(
        DEMO, "dataloader.train.mapper.copy_paste=rare", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "lazytrain: dataloader.train.mapper.copy_paste=rare: dataloader.train.mapper.copy_paste is a node that "
        "builds lazytrain.data.copy_paste.CopyPaste, not a value; set one of its arguments, e.g. "
        f"dataloader.train.mapper.copy_paste.mode=rare {COPY_PASTE_ARGUMENTS}, or replace the whole node with "
        "'dataloader.train.mapper.copy_paste={_target_: ..., ...}'."
    )
    assert not run_dir.exists() and not (tmp_path / "outputs").exists()


def test_numbers_and_swept_values_are_checked_and_arguments_nulls_and_whole_nodes_pass():
    cfg = load_primary_config(DEMO)
    (problem,) = find_node_replaced_by_value_problems(
        cfg, ["-m", "dataloader.train.mapper.copy_paste=null,0.5", "train.max_iter=3"]
    )
    assert problem.startswith(
        "dataloader.train.mapper.copy_paste=null,0.5: dataloader.train.mapper.copy_paste is a node that builds "
        f"lazytrain.data.copy_paste.CopyPaste, not a value; set one of its arguments {COPY_PASTE_ARGUMENTS}, "
    )
    sound = [
        "dataloader.train.mapper.copy_paste.mode=rare",
        "dataloader.train.mapper.copy_paste=null",
        "dataloader.train.mapper.copy_paste={_target_: lazytrain.data.copy_paste.CopyPaste, mode: rare}",
        "~dataloader.train.mapper.copy_paste",
    ]
    assert find_node_replaced_by_value_problems(cfg, sound) == []


def test_a_name_may_replace_a_call_that_returns_a_name():
    # register_json_dataset(...) returns the name it registers: a registered set's name may take its place.
    cfg = load_primary_config(CUSTOM)
    assert find_node_replaced_by_value_problems(cfg, ["dataloader.train.dataset.names=lvis_v1_train"]) == []


def test_a_number_picks_no_argument_and_a_sweep_suggests_its_values_that_are_not_null():
    # lr_multiplier=0.1 suggested lr_multiplier.warmup_iters=0.1 (an int argument), and copy_paste=null,rare
    # suggested copy_paste.mode=null,rare (failed before).
    cfg = load_primary_config(DEMO)
    (number,) = find_node_replaced_by_value_problems(cfg, ["lr_multiplier=0.1"])
    assert number == (
        "lr_multiplier=0.1: lr_multiplier is a node that builds lazytrain.engine.lr_schedule.WarmupCosineMultiplier, "
        "not a value; set one of its arguments (max_iter, warmup_iters, warmup_factor), or replace the whole node "
        "with 'lr_multiplier={_target_: ..., ...}'."
    )
    (swept,) = find_node_replaced_by_value_problems(
        cfg, ["-m", "dataloader.train.mapper.copy_paste=null,rare"]
    )
    assert "set one of its arguments, e.g. dataloader.train.mapper.copy_paste.mode=rare (mode," in swept


def returns_nothing_said(x):
    return x


def returns_optional_int(x) -> int | None:
    return x


def returns_optional_name(x) -> Optional[str]:  # noqa: UP045 (the spelling users write)
    return x


def returns_a_dict(x) -> dict:
    return {"x": x}


@pytest.mark.parametrize(
    "target, refused",
    [
        ("builtins.round", False),
        (f"{__name__}.returns_nothing_said", False),
        (f"{__name__}.returns_optional_int", False),
        (f"{__name__}.returns_optional_name", False),
        ("builtins.int", False),
        (f"{__name__}.returns_a_dict", True),
        ("collections.OrderedDict", True),
    ],
)
def test_only_a_node_that_surely_builds_an_object_refuses_a_number(target, refused):
    # A builtin, an unannotated function or one that may return a plain value was refused (failed before).
    cfg = OmegaConf.create({"node": {"_target_": target, "x": 1.5}})
    assert bool(find_node_replaced_by_value_problems(cfg, ["node=2"])) is refused
