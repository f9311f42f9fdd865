"""The "train on your own data" command, as a user types it, on a small messy COCO export: 2 iterations in 2
processes (as a -m sweep) without the eval hook, then a real evaluation in 2 processes (train.eval_only)."""

import json
import os
import subprocess

import pytest

from tests.data.custom_fixtures import write_export
from tests.smoke import FEW_DETECTIONS, smoke_overrides
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "conf", "rfs_maskrcnn_custom.py")
SMOKE = [
    *smoke_overrides(short_edge=64, max_size=96),
    "train.device=cpu",
    'train.init_checkpoint=""',  # random init: the recipe's ImageNet weights would be downloaded
    "train.checkpointer.period=1",
    "~train.hooks.plots",  # most of a 2-iteration run's time; tests/engine/test_run_report.py checks the plots
    FEW_DETECTIONS,
]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    # messy on purpose: ids 0..41 with gaps, an unused category, missing iscrowd/area, an unannotated val image
    return write_export(str(tmp_path_factory.mktemp("export")), "no_iscrowd_no_area")


def lazytrain(*arguments: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    result = run_warm(list(arguments), cwd, env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def final_metrics(run_dir) -> dict:
    lines = [json.loads(line) for line in open(run_dir / "metrics.json")]
    return [line for line in lines if "bbox/AP" in line][-1]


def check_long_tail_metrics(metrics: dict) -> None:
    assert metrics["eval_protocol/exhaustive"] == 1.0
    for task in ("bbox", "segm"):
        assert {f"{task}/{name}" for name in ("AP", "APr", "APc", "APf")} <= set(metrics)
        assert 0.0 <= metrics[f"{task}/APr"] <= 100.0  # all fixture categories are rare (<= 10 train images)


@pytest.mark.slow
def test_two_process_sweep_trains_then_two_processes_evaluate_only(export, tmp_path):
    """Training runs as a one-job -m sweep (the data set reaches each job and each spawned rank as config
    data); the single-process command with its real evaluation is the README's (tests/test_readme.py)."""
    data = [f"{key}={value}" for key, value in export.items()]
    two = ["launch.num_processes=2"]
    lazytrain(CONFIG, "-m", *data, *SMOKE, *two, "~train.hooks.eval", "hydra.sweep.dir=train", cwd=tmp_path)
    run = tmp_path / "train" / "0"
    assert (run / "model_final.pth").exists()
    assert not any("bbox/AP" in line for line in open(run / "metrics.json"))
    assert (
        "num_classes: 5" in open(run / "config.yaml").read()
    )  # from the json (one category never annotated)
    result = lazytrain(
        CONFIG, *data, *SMOKE, *two, "train.eval_only=true", f"train.init_checkpoint={run / 'model_final.pth'}",
        "hydra.run.dir=eval", cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "on 2 process(es)" in output
    assert "Evaluation protocol for custom_val: exhaustive (COCO-style)" in output
    assert "r <= 10, c <= 100, f > 100 images (data.frequency_thresholds=[10, 100])" in output
    check_long_tail_metrics(final_metrics(tmp_path / "eval"))
    predictions = json.load(open(tmp_path / "eval" / "coco_instances_results.json"))
    assert {p["image_id"] for p in predictions} == {100, 101, 102, 103, 104}  # 104 has no annotation


def test_a_sweep_over_data_files_passes_the_override_check_and_leaves_them_to_each_job():
    from omegaconf import OmegaConf

    from lazytrain.config import LazyConfig
    from lazytrain.program.preflight.command_line import apply_plain_overrides
    from lazytrain.program.preflight.json_data import find_json_dataset_problems

    cfg = OmegaConf.create(OmegaConf.to_container(LazyConfig.load(CONFIG)))
    sweep = [
        "-m",
        "data.train.json=a.json,b.json",
        "data.train.images=x",
        "data.val.json=v.json",
        "data.val.images=x",
    ]
    checked = apply_plain_overrides(cfg, sweep)  # a mandatory (???) key may be swept
    assert checked.data.train.images == "x" and OmegaConf.is_missing(checked.data.train, "json")
    assert find_json_dataset_problems(checked, skip_unset=True) == [
        "data.val.json=v.json: no such file; pass the path of the COCO/LVIS json (data.val.json=PATH)."
    ]
