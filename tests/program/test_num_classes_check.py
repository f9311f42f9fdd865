"""A run whose model.num_classes does not cover the train data's categories stops before the first step."""

from __future__ import annotations

import logging
import os

import pytest

from lazytrain.config import LazyConfig
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.errors import ConfigError
from lazytrain.modeling.rcnn import RCNN
from lazytrain.program.default import run
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
