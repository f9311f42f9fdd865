"""A tiny finished demo run, shared by the predict and export tests."""

import os

import pytest
import torch

from lazytrain.config import LazyConfig
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.program.default import run
from tests.smoke import TINY_SYNTHETIC_LT, smoke_overrides

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# The demo model with two FPN levels and the pool level (not four), one mask conv: exporting, converting to
# ONNX and loading a program take time in proportion to the graph (the export tests here do each several
# times); the code paths are the recipe's. README's lanes (tests/test_readme.py) export the demo as it is.
SMALLER_MODEL = (
    "model.backbone.returned_layers=[3,4]",
    "model.rpn.anchor_generator.sizes=[32,64,128]",
    "model.roi_heads.box_roi_pool.featmap_names=['0','1']",
    "model.roi_heads.mask_roi_pool.featmap_names=['0','1']",
    "model.roi_heads.mask_head.layers=[64]",
)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """A finished demo run (`SMALLER_MODEL`): config.yaml, model_final.pth and the evaluator's
    lvis_instances_results.json."""
    root = tmp_path_factory.mktemp("demo_run")
    datasets = root / "datasets"
    generate_synthetic_lt(str(datasets / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    output_dir = root / "run"
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            *smoke_overrides(),
            *SMALLER_MODEL,
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
