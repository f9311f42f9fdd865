"""``train.compile`` under DDP: the demo recipe in two CPU processes (gloo) with the backbone compiled ends with
the weights of the same run uncompiled (aot_eager: dynamo's capture and AOTAutograd's backward, whose
gradients reach DDP's reducer as one autograd node)."""

import os

import pytest
import torch

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from tests.smoke import FEW_DETECTIONS, TINY_SYNTHETIC_LT, smoke_overrides
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")


def _train(datasets_root: str, run_dir, *overrides: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", LAZYTRAIN_DATASETS=datasets_root)
    arguments = [
        *smoke_overrides(),
        "train.max_iter=3",
        "launch.num_processes=2",
        "model.pad_to_sizes=[[128,128]]",  # both runs pad alike
        "~train.hooks.eval",
        "~train.hooks.plots",
        FEW_DETECTIONS,
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    result = run_warm([DEMO, *arguments], REPO, env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(run_dir / "model_final.pth", weights_only=True)["model"]


@pytest.mark.slow
def test_two_processes_with_a_compiled_backbone_end_with_the_uncompiled_weights(tmp_path):
    datasets_root = str(tmp_path / "datasets")
    generate_synthetic_lt(os.path.join(datasets_root, "synthetic_lt"), **TINY_SYNTHETIC_LT)
    eager = _train(datasets_root, tmp_path / "eager")
    compiled = _train(
        datasets_root, tmp_path / "compiled", "train.compile.enabled=true", "train.compile.backend=aot_eager"
    )
    for rank_log in ("log.txt", "log.txt.rank1"):
        assert "the backbone runs through torch.compile" in open(tmp_path / "compiled" / rank_log).read()
    assert compiled.keys() == eager.keys()
    for name, value in eager.items():
        torch.testing.assert_close(compiled[name], value, rtol=1e-4, atol=1e-5, msg=name)
