"""A run with ``model.fixed_shapes`` checks its capacities against the data before the first step."""

from __future__ import annotations

import os

import pytest

from lazytrain.config import LazyConfig
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.modeling.rcnn import RCNN
from lazytrain.program.default import run
from tests.smoke import TINY_SYNTHETIC_LT, smoke_overrides

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixed_shapes_data")
    generate_synthetic_lt(str(root / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    return str(root)


def _run_with(fixed_shapes: str, datasets: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets)

    def no_step(*args, **kwargs):  # the batch's own checks (pad_batch) come too late
        raise AssertionError("the first training step started")

    monkeypatch.setattr(RCNN, "forward", no_step)
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    # smoke_overrides resize the short edge to 96, the long edge to at most 128: the tiny set's 64-96 px images
    # of several aspect ratios give at most 128 x 119.
    LazyConfig.apply_overrides(
        cfg,
        [*smoke_overrides(), f"train.output_dir={tmp_path / 'run'}", f"+model.fixed_shapes={fixed_shapes}"],
    )
    run(cfg)


def test_more_instances_than_max_instances_stop_before_the_first_step(
    datasets, tmp_path, monkeypatch, one_thread
):
    with pytest.raises(
        ValueError,
        match=r"the training image \S+ has \d+ instances, above model.fixed_shapes.max_instances=1\. Raise",
    ):
        _run_with(
            "{_target_:lazytrain.modeling.FixedShapes,image_size:[128,128],max_instances:1}",
            datasets,
            tmp_path,
            monkeypatch,
        )


def test_an_image_size_the_mapper_exceeds_stops_before_the_first_step(
    datasets, tmp_path, monkeypatch, one_thread
):
    with pytest.raises(
        ValueError,
        match=r"the train mapper's largest image is 128 x 119, larger than model.fixed_shapes.image_size=\[64, 96\]\. "
        r"Raise model.fixed_shapes.image_size to at least \[128, 128\]",
    ):
        _run_with(
            "{_target_:lazytrain.modeling.FixedShapes,image_size:[64,96],max_instances:100}",
            datasets,
            tmp_path,
            monkeypatch,
        )
