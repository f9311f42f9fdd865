"""What a run shows and leaves behind: a short console header, a closing block naming files that exist,
and curves.png and ap_by_frequency.png in the run directory.

One 2-iteration run of the demo config (tiny generated data, evaluated) is shared by the tests here.
"""

import json
import logging
import math
import os
import re

import pytest
from matplotlib.collections import PathCollection
from PIL import Image

from lazytrain.config import LazyConfig
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.engine import plot_writer
from lazytrain.utils.plots import build_ap_by_frequency_figure, build_metrics_figure
from lazytrain.utils.run_dirs import read_metrics, read_per_category_ap
from tests.smoke import TINY_SYNTHETIC_LT, smoke_overrides
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    *smoke_overrides(),
    "model.roi_heads.score_thresh=0.0",  # an untrained model scores below the demo's 0.05: keep its detections
]
MAX_HEADER_LINES = 15


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """(run directory, console output, data sets root) of ``python -m lazytrain conf/rfs_maskrcnn_demo.py`` on
    tiny data."""
    datasets = tmp_path_factory.mktemp("datasets")
    generate_synthetic_lt(
        str(datasets / "synthetic_lt"),
        **TINY_SYNTHETIC_LT,
        max_instances=8,  # room for every category in 12 images
    )
    run_dir = tmp_path_factory.mktemp("run") / "demo"
    env = {**os.environ, "LAZYTRAIN_DATASETS": str(datasets), "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    result = run_warm(
        ["conf/rfs_maskrcnn_demo.py", *TINY, f"hydra.run.dir={run_dir}"], REPO, env, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return str(run_dir), result.stdout, str(datasets)


def _lines_before_first_step(stdout):
    lines = stdout.splitlines()
    first_step = next(i for i, line in enumerate(lines) if re.search(r"\biter: 0\b", line))
    return lines[:first_step]


@pytest.mark.slow
def test_console_before_the_first_step_is_a_short_header(demo_run):
    run_dir, stdout, datasets = demo_run
    header = _lines_before_first_step(stdout)
    assert len(header) <= MAX_HEADER_LINES, "\n".join(header)
    text = "\n".join(header)
    for field in ("command", "output", "world", "data", "sampler", "model", "schedule"):
        assert re.search(rf"^  {field} +\S", text, re.MULTILINE), f"no '{field}' line in:\n{text}"
    assert "conf/rfs_maskrcnn_demo.py" in text
    buckets = re.search(
        r"12 images, (\d+) instances, 30 categories \(rare (\d+), common (\d+), frequent (\d+)\)", text
    )
    train = json.load(open(os.path.join(datasets, "synthetic_lt", "lvis_v1_train.json")))
    frequency = [category["frequency"] for category in train["categories"]]
    assert [int(n) for n in buckets.groups()] == [len(train["annotations"]), *map(frequency.count, "rcf")]
    demo = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    assert f"t={demo.dataloader.train.sampler.repeat_thresh}" in text and "expected epoch" in text
    assert re.search(r"model +RCNN: \d+\.\dM parameters", text)
    # The long dumps went to log.txt only.
    assert "Full config" not in stdout and "RCNN(" not in stdout
    log = open(os.path.join(run_dir, "log.txt")).read()
    assert "Full config" in log and "RCNN(" in log


@pytest.mark.slow
def test_end_block_names_files_that_exist_and_the_next_commands(demo_run):
    run_dir, stdout, _ = demo_run
    block = stdout[stdout.rindex("Done: 2 iterations") :].splitlines()
    assert re.search(r"\d+\.\d+ s/it", block[0])
    assert block[1].split() == ["AP", "APr", "APc", "APf"]
    assert [row.split()[0] for row in block[2:4]] == ["mask", "box"]
    assert all(re.fullmatch(r"\d+\.\d", value) for row in block[2:4] for value in row.split()[1:])
    files_at = block.index(f"Files in {run_dir}:")
    resume_at = next(i for i, line in enumerate(block) if line.startswith("Resume:"))
    named = [line.split()[0] for line in block[files_at + 1 : resume_at]]
    assert {"metrics.json", "lvis_per_category_ap.csv", "model_final.pth", "config.yaml"} <= set(named)
    assert {"curves.png", "ap_by_frequency.png", "log.txt"} <= set(named)
    for name in named:
        assert os.path.isfile(os.path.join(run_dir, name)), name
    resume, evaluate = block[resume_at], block[resume_at + 1]
    assert resume.split()[1:] == [
        "python", "-m", "lazytrain", f"{run_dir}/config.yaml", f"hydra.run.dir={run_dir}", "train.resume=true"
    ]  # fmt: skip
    assert evaluate.split()[-1] == f"train.init_checkpoint={run_dir}/model_final.pth"
    predict = block[resume_at + 2]
    assert predict.split()[1:5] == ["python", "-m", "lazytrain", "predict"] and predict.split()[5] == run_dir
    assert block[resume_at + 1 :] == [evaluate, predict]  # the block ends the output
    assert "categories.json" in named


@pytest.mark.slow
def test_demo_run_writes_readable_plots(demo_run):
    run_dir, _, _ = demo_run
    for name in ("curves.png", "ap_by_frequency.png"):
        with Image.open(os.path.join(run_dir, name)) as image:
            assert image.format == "PNG" and image.width >= 800 and image.height >= 400

    rows = read_per_category_ap(run_dir)
    assert len(rows) == 30  # every category of the data set, each seen in train and val
    assert all(r["train_images"] >= 1 and not math.isnan(r["segm_AP"]) for r in rows)
    figure = build_ap_by_frequency_figure({"demo": rows})
    axes = figure.get_axes()
    assert [axis.get_title() for axis in axes] == [
        "mask AP by category frequency",
        "box AP by category frequency",
    ]
    assert axes[0].get_xscale() == "log" and "train images" in axes[0].get_xlabel()
    assert axes[0].get_ylabel() == "mask AP per category" and axes[1].get_ylabel() == "box AP per category"
    points = sum(len(c.get_offsets()) for c in axes[0].collections if isinstance(c, PathCollection))
    assert points == len(rows) == 30
    legend = [text.get_text() for text in axes[0].get_legend().get_texts()]
    assert all(re.match(r"(rare|common|frequent): \d+ categories, mean \d+\.\d$", t) for t in legend), legend

    records = read_metrics(run_dir)
    curves = build_metrics_figure({"demo": records})
    titles = [axis.get_title() for axis in curves.get_axes()]
    assert titles[0] == "total_loss" and {"lr", "mask AP", "box AP", "loss_mask"} <= set(titles)
    total_loss = curves.get_axes()[0].get_lines()[0]
    assert len(total_loss.get_xdata()) == sum("total_loss" in r for r in records) == 2


def _write_job(job_dir, repeat_thresh, ap_of_rare):
    os.makedirs(job_dir / ".hydra")
    (job_dir / ".hydra" / "overrides.yaml").write_text(
        f"- dataloader.train.sampler.repeat_thresh={repeat_thresh}\n"
    )
    (job_dir / "metrics.json").write_text(json.dumps({"iteration": 9, "total_loss": 1.0}) + "\n")
    lines = ["id,name,frequency,train_images,bbox_AP,segm_AP"]
    for index, (frequency, count) in enumerate([("r", 2), ("r", 8), ("c", 40), ("f", 300), ("f", 500)]):
        ap = ap_of_rare if frequency == "r" else 20.0 + index
        lines.append(f"{index + 1},cat{index},{frequency},{count},{ap:.2f},{ap:.2f}")
    lines.append("6,unseen,r,0,nan,nan")  # no train image: cannot be placed on a log axis
    (job_dir / "lvis_per_category_ap.csv").write_text("\n".join(lines) + "\n")


def test_sweep_overlay_has_one_point_set_per_swept_value(tmp_path):
    for job, (threshold, rare) in enumerate([(0, 1.0), (0.1, 6.0)]):
        _write_job(tmp_path / str(job), threshold, rare)
    path = plot_writer.write_sweep_plots(str(tmp_path))
    assert path == str(tmp_path / "ap_by_frequency.png") and os.path.isfile(path)

    runs = {f"dataloader.train.sampler.repeat_thresh={t}": read_per_category_ap(str(tmp_path / str(job)))
            for job, t in enumerate([0, 0.1])}  # fmt: skip
    axis = build_ap_by_frequency_figure(runs).get_axes()[0]
    assert [len(c.get_offsets()) for c in axis.collections if isinstance(c, PathCollection)] == [5, 5]
    legend = [text.get_text() for text in axis.get_legend().get_texts()]
    assert legend == [
        "repeat_thresh=0 (mean r 1.0, c 22.0, f 23.5)",
        "repeat_thresh=0.1 (mean r 6.0, c 22.0, f 23.5)",
    ]


def test_old_run_directory_plots_with_the_script(tmp_path):
    import importlib.util

    _write_job(tmp_path / "old", 0.1, 3.0)
    spec = importlib.util.spec_from_file_location(
        "plot_ap", os.path.join(REPO, "scripts", "plot_ap_by_frequency.py")
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = script.main([str(tmp_path / "old"), "--out", str(tmp_path / "ap.png")])
    with Image.open(out) as image:
        assert image.format == "PNG" and image.width >= 800


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_full_config_goes_to_log_file_and_to_the_console_only_when_verbose(tmp_path, verbose):
    from omegaconf import OmegaConf

    from lazytrain.program.default import default_setup

    cfg = OmegaConf.create({"train": {"output_dir": str(tmp_path), "seed": 0, "verbose": verbose}})
    default_setup(cfg)
    console = [
        h for h in logging.getLogger("lazytrain").handlers if getattr(h, "_lazytrain_marker", "") == "console"
    ]
    levels = [h.level for h in console]
    for handler in console:
        handler.setLevel(logging.INFO)  # as every other test expects
    assert levels == [logging.DEBUG if verbose else logging.INFO]
    for handler in logging.getLogger("lazytrain").handlers:
        handler.flush()
    assert "Full config:\ntrain:" in open(tmp_path / "log.txt").read()


def test_per_category_file_without_train_counts_takes_them_from_the_train_records(tmp_path):
    lines = ["id,name,frequency,train_images,bbox_AP,segm_AP", "7,b,,,10.00,12.00", "3,a,,,5.00,6.00"]
    (tmp_path / "coco_per_category_ap.csv").write_text("\n".join(lines) + "\n")
    # Contiguous ids follow the sorted json ids: 0 -> json id 3, 1 -> json id 7.
    written = plot_writer.write_run_plots(str(tmp_path), image_counts={0: 4, 1: 250})
    assert written == [str(tmp_path / "ap_by_frequency.png")]
    rows = read_per_category_ap(str(tmp_path))
    plot_writer._fill_train_counts(rows, {0: 4, 1: 250})
    assert {row["name"]: row["train_images"] for row in rows} == {"a": 4, "b": 250}
