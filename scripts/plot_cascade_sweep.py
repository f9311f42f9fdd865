"""Mask AP, APr, APc and APf of Mask R-CNN and Cascade Mask R-CNN, uniform sampling and RFS, two seeds each.

The picture in docs/results.md ("Mask R-CNN and Cascade Mask R-CNN, with and without RFS") was made with

    python -m lazytrain conf/cascade_maskrcnn_demo.py -m dataloader.train.sampler.repeat_thresh=0,0.3 \
        train.seed=0,1 hydra/launcher=joblib hydra.sweep.dir=/tmp/csweep/multirun
    python scripts/plot_cascade_sweep.py /tmp/csweep/multirun/{0,1,2,3} --out docs/images/sweep_cascade.png

Each Cascade run directory gives its RFS threshold and seed (``config.yaml``) and its final AP (the last line of
``metrics.json`` with ``segm/AP``). The Mask R-CNN numbers come from a JSON file (default:
``plot_cascade_sweep_maskrcnn.json`` next to this script, the "ce" rows of docs/results.md's first table), as
``{"runs": [{"repeat_thresh": 0, "seed": 0, "segm/AP": ..., ...}, ...]}``. Bars are the mean over seeds, the
markers each seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from lazytrain.utils.events import parse_metrics_line  # noqa: E402

METRICS = ("segm/AP", "segm/APr", "segm/APc", "segm/APf")
DEFAULT_MASKRCNN = Path(__file__).with_name("plot_cascade_sweep_maskrcnn.json")
# (model, repeat_thresh) -> colour: light for uniform sampling, dark for RFS.
SETTINGS = {
    ("Mask R-CNN", 0.0): "#9ecae1",
    ("Mask R-CNN", 0.3): "#3182bd",
    ("Cascade", 0.0): "#fdae6b",
    ("Cascade", 0.3): "#e6550d",
}
SEED_MARKERS = {0: "o", 1: "s"}

Run = dict[str, float]


def read_run(run_dir: Path) -> Run:
    """RFS threshold, seed and final metrics of one run directory."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    run: Run = {
        "repeat_thresh": float(config["dataloader"]["train"]["sampler"]["repeat_thresh"]),
        "seed": int(config["train"]["seed"]),
    }
    final: dict[str, float] = {}
    for line in (run_dir / "metrics.json").read_text().splitlines():
        record = parse_metrics_line(line) if line.strip() else {}
        if "segm/AP" in record:
            final = record
    if not final:
        raise SystemExit(f"{run_dir}: no evaluation in metrics.json")
    run.update({metric: float(final[metric]) for metric in METRICS})
    return run


def plot(runs: dict[str, list[Run]], out: Path) -> None:
    """Grouped bars (one group per metric, one bar per setting), seeds as markers."""
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.2
    for index, ((model, thresh), colour) in enumerate(SETTINGS.items()):
        setting_runs = [run for run in runs[model] if abs(run["repeat_thresh"] - thresh) < 1e-9]
        offset = (index - 1.5) * width
        for group, metric in enumerate(METRICS):
            values = [run[metric] for run in setting_runs]
            x = group + offset
            label = f"{model}, {'uniform' if thresh == 0 else f'RFS t={thresh:g}'}" if group == 0 else None
            ax.bar(x, sum(values) / len(values), width, color=colour, label=label)
            for run in setting_runs:
                ax.plot(x, run[metric], SEED_MARKERS.get(int(run["seed"]), "x"), color="black", ms=4)
    for seed, marker in SEED_MARKERS.items():
        ax.plot([], [], marker, color="black", ms=4, ls="none", label=f"seed {seed}")
    ax.set_xticks(range(len(METRICS)), [f"mask {metric.split('/')[1]}" for metric in METRICS])
    ax.set_ylabel("AP x100 (bar: mean of seeds)")
    ax.set_title("Embedded data set, 400 iterations, CPU (2026-11-26)")
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("seed"))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, ncol=3, loc="upper left")
    ax.set_ylim(0, 80)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="the Cascade Mask R-CNN run directories")
    parser.add_argument("--maskrcnn", type=Path, default=DEFAULT_MASKRCNN, help="Mask R-CNN numbers (JSON)")
    parser.add_argument("--out", type=Path, default=Path("sweep_cascade.png"), help="image to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    maskrcnn = json.loads(args.maskrcnn.read_text())["runs"]
    runs = {"Mask R-CNN": maskrcnn, "Cascade": [read_run(run_dir) for run_dir in args.run_dirs]}
    plot(runs, args.out)
    print(f"Wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
