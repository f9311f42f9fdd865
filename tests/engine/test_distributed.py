"""The default program in two CPU processes (gloo): DDP, collective checkpoints, per-rank exact resume."""

import json
import os
import shutil

import pytest
import torch

from tests.engine.conftest import TOY_CONFIG
from tests.warm_command import start_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAUNCH = """
import sys
from omegaconf import OmegaConf
from lazytrain.config import LazyConfig
from lazytrain.launch.launch import launch
from tests.engine import toy

cfg = LazyConfig.load(sys.argv[1])
cfg.train.output_dir = sys.argv[2]
LazyConfig.apply_overrides(cfg, sys.argv[3:])
OmegaConf.resolve(cfg)
launch(toy.ddp_main, 2, args=(OmegaConf.to_container(cfg),), use_gpu=False)
"""

OVERRIDES = [
    "train.max_iter=12",
    "train.eval_period=5",
    "+train.hooks.best={_target_: lazytrain.engine.hooks.BestCheckpointer, eval_period: 5, val_metric: toy/AP}",
    "+train.hooks.rank_weights={_target_: tests.engine.toy.RankWeightsHook, output_dir: ${train.output_dir}}",
]


def _launch(output_dir, overrides):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with start_warm(["-c", LAUNCH, TOY_CONFIG, str(output_dir), *overrides], REPO, env) as process:
        assert process.wait(timeout=300) == 0, process.read_output()[1][-3000:]


def _rank_files(output_dir):
    return [torch.load(os.path.join(output_dir, f"rank{r}.pth"), weights_only=True) for r in (0, 1)]


@pytest.mark.slow
def test_two_processes_train_checkpoint_and_resume_exactly(tmp_path):
    full = tmp_path / "full"
    _launch(full, OVERRIDES)

    # DDP kept the replicas equal; every rank got the evaluation results (evaluators return them on rank 0).
    rank0, rank1 = _rank_files(full)
    for key, value in rank0["model"].items():
        assert torch.equal(value, rank1["model"][key]), key
    assert rank0["results"] == rank1["results"] and "AP" in rank0["results"]["toy"]

    # Rank 0 wrote the files (BestCheckpointer's save is collective and did not hang); both ranks logged.
    files = set(os.listdir(full))
    assert {"model_0000004.pth", "model_0000009.pth", "model_final.pth", "model_best.pth"} <= files
    assert {"log.txt", "log.txt.rank1", "metrics.json", "config.yaml"} <= files
    metrics = [json.loads(line) for line in open(full / "metrics.json")]
    assert metrics[-1]["iteration"] == 12 and "toy/AP" in metrics[-1]
    checkpoint = torch.load(full / "model_0000004.pth", weights_only=True)
    per_rank = checkpoint["trainer"]["per_rank"]
    assert len(per_rank) == 2 and not torch.equal(per_rank[0]["rng"]["torch"], per_rank[1]["rng"]["torch"])

    # Resume both ranks from the iteration-4 checkpoint: same final weights as the uninterrupted run.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(full / "model_0000004.pth", resumed)
    (resumed / "last_checkpoint").write_text("model_0000004.pth")
    _launch(resumed, [*OVERRIDES, "train.resume=true"])
    again0, again1 = _rank_files(resumed)
    for key, value in rank0["model"].items():
        assert torch.equal(value, again0["model"][key]), key
        assert torch.equal(value, again1["model"][key]), key
