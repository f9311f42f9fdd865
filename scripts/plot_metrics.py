"""Training curves of one or many runs: every loss, the learning rate and the eval AP metrics.

    python scripts/plot_metrics.py outputs/demo --out curves.png
    python scripts/plot_metrics.py multirun/2024-01-01/12-00-00 --out sweep_curves.png

A sweep directory expands to its jobs; the legend shows the overrides that differ between runs
(from each run's ``.hydra/overrides.yaml``), or the directory names.
"""

from __future__ import annotations

import argparse

from lazytrain.utils.plots import plot_metrics
from lazytrain.utils.run_dirs import get_run_dirs, get_run_labels, read_metrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories (metrics.json) or sweep directories")
    parser.add_argument("--out", default="curves.png", help="image to write")
    parser.add_argument(
        "--metrics", nargs="+", default=None, help="eval metrics to plot (default: */AP, */APr, */APc, */APf)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    run_dirs = get_run_dirs(args.run_dirs)
    runs = {}
    for label, run_dir in zip(get_run_labels(run_dirs), run_dirs):
        runs[label if label not in runs else run_dir] = read_metrics(run_dir)
    plot_metrics(runs, args.out, args.metrics)
    print(f"Wrote {args.out} ({len(runs)} runs)")
    return args.out


if __name__ == "__main__":
    main()
