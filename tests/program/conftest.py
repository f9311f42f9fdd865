"""A tiny finished demo run, shared by the predict and export tests."""

import os

import pytest
import torch

from lazytrain.config import LazyConfig
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.program.default import run
from tests.smoke import TINY_SYNTHETIC_LT, smoke_overrides

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """A finished demo run: config.yaml, model_final.pth and the evaluator's lvis_instances_results.json."""
    root = tmp_path_factory.mktemp("demo_run")
    datasets = root / "datasets"
    generate_synthetic_lt(str(datasets / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    output_dir = root / "run"
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            *smoke_overrides(),
            "model.roi_heads.detections_per_img=20",
            "dataloader.test.batch_size=2",
            f"train.output_dir={output_dir}",
        ],
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAZYTRAIN_DATASETS", str(datasets))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            run(cfg)
        finally:
            torch.set_num_threads(threads)
    return {"dir": str(output_dir), "datasets": str(datasets)}


@pytest.fixture
def in_run_datasets(demo_run, monkeypatch, one_thread):
    """The demo run, with $LAZYTRAIN_DATASETS pointing at its data and torch at 1 thread."""
    monkeypatch.setenv("LAZYTRAIN_DATASETS", demo_run["datasets"])
    return demo_run
