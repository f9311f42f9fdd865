"""A run whose model.num_classes does not cover the train data's categories stops: before Hydra starts where
the count is known unloaded (the embedded data set, a registered json), else before the first step."""

from __future__ import annotations

import json
import logging
import os

import pytest

from lazytrain.config import LazyCall as L
from lazytrain.config import LazyConfig
from lazytrain.data.datasets.custom import register_json_dataset
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.errors import ConfigError
from lazytrain.modeling.rcnn import RCNN
from lazytrain.program.default import run
from lazytrain.program.preflight.num_classes import find_num_classes_problems
from tests.launch.test_entrypoint import lazytrain
from tests.smoke import TINY_SYNTHETIC_LT, smoke_overrides

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("num_classes_data")
    generate_synthetic_lt(str(root / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    return str(root)


def _run_demo_with(overrides: list[str], datasets: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets)

    def no_step(*args, **kwargs):
        raise AssertionError("the first training step started")

    monkeypatch.setattr(RCNN, "forward", no_step)
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    LazyConfig.apply_overrides(cfg, [*smoke_overrides(), f"train.output_dir={tmp_path / 'run'}", *overrides])
    run(cfg)


def test_fewer_classes_than_the_data_stop_before_the_first_step(datasets, tmp_path, monkeypatch, one_thread):
    with pytest.raises(
        ConfigError,
        match=r"^model.num_classes=10 is fewer than the 30 categories of the train data set 'synthetic_lt_train' "
        r"\(dataloader.train.dataset.names\): set model.num_classes=30\.$",
    ):
        _run_demo_with(["model.num_classes=10"], datasets, tmp_path, monkeypatch)


def test_a_mixture_counts_its_sources_categories(datasets, tmp_path, monkeypatch, one_thread):
    # Both sources are the embedded set (30 categories): the check reads every name of the list.
    with pytest.raises(
        ConfigError, match=r"fewer than the 30 categories of the train data set 'synthetic_lt_"
    ):
        _run_demo_with(
            ["model.num_classes=29", "dataloader.train.dataset.names=[synthetic_lt_val,synthetic_lt_train]"],
            datasets,
            tmp_path,
            monkeypatch,
        )


def test_more_classes_than_the_data_warn_once(datasets, tmp_path, monkeypatch, one_thread, caplog):
    step_started = pytest.raises(AssertionError, match="the first training step started")
    with caplog.at_level(logging.WARNING, logger="lazytrain.program.default"), step_started:
        _run_demo_with(["model.num_classes=32"], datasets, tmp_path, monkeypatch)
    warnings = [r.getMessage() for r in caplog.records if "model.num_classes" in r.getMessage()]
    assert warnings == [
        "model.num_classes=32 is more than the 30 categories of the train data set 'synthetic_lt_train': the "
        "extra 2 classes are never trained (set model.num_classes=30 unless you add data later)."
    ]


def test_the_demo_passes_the_check(datasets, tmp_path, monkeypatch, one_thread, caplog):
    step_started = pytest.raises(AssertionError, match="the first training step started")
    with caplog.at_level(logging.WARNING, logger="lazytrain.program.default"), step_started:
        _run_demo_with([], datasets, tmp_path, monkeypatch)
    assert not [r for r in caplog.records if "model.num_classes" in r.getMessage()]


def _demo_with(*overrides):
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    return LazyConfig.apply_overrides(cfg, list(overrides))


def test_the_embedded_data_sets_count_is_checked_unloaded():
    assert find_num_classes_problems(_demo_with()) == []
    assert find_num_classes_problems(_demo_with("model.num_classes=31")) == []  # more: warned once loaded
    assert find_num_classes_problems(_demo_with("model.num_classes=10")) == [
        "model.num_classes=10 is fewer than the 30 categories of the train data set 'synthetic_lt_train' "
        "(dataloader.train.dataset.names): set model.num_classes=30."
    ]


def test_a_registered_json_in_a_mixture_is_counted_from_its_summary(tmp_path):
    categories = [{"id": i, "name": f"c{i}"} for i in range(1, 41)]
    json_file = tmp_path / "mine.json"
    json_file.write_text(json.dumps({"images": [], "annotations": [], "categories": categories}))
    mine = L(register_json_dataset)(name="my_train", json_file=str(json_file), image_root=str(tmp_path))
    cfg = _demo_with("model.num_classes=30")
    cfg.dataloader.train.dataset.names = ["synthetic_lt_train", mine]
    (problem,) = find_num_classes_problems(cfg)
    assert problem.startswith(
        "model.num_classes=30 is fewer than the 40 categories of the train data set 'my_train'"
    )


def test_the_command_line_stops_before_the_run_folder(tmp_path):
    # The command: the demo's 30 categories, model.num_classes=10.
    run_dir = tmp_path / "run"
    demo = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")
    result = lazytrain(
        demo, "model.num_classes=10", "train.max_iter=2", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    assert result.returncode == 1
    assert "set model.num_classes=30." in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists() and not (tmp_path / "datasets").exists()
