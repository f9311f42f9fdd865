"""Per-category AP against the category's train image count (log x), by rare/common/frequent bucket.

    python scripts/plot_ap_by_frequency.py outputs/demo --out ap_by_frequency.png
    python scripts/plot_ap_by_frequency.py multirun/2024-01-01/12-00-00 --out sweep_ap.png   # one colour per job

Reads each run's ``lvis_per_category_ap.csv`` (or ``coco_per_category_ap.csv``), which the evaluators write
after each evaluation; training runs also write this plot themselves as ``ap_by_frequency.png``. Several runs
or a sweep directory give one overlay, labelled by the overrides that differ between runs.
"""

from __future__ import annotations

import argparse

from lazytrain.utils.plots import plot_ap_by_frequency
from lazytrain.utils.run_dirs import get_run_dirs, get_run_labels, read_per_category_ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories or sweep directories")
    parser.add_argument("--out", default="ap_by_frequency.png", help="image to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    run_dirs = get_run_dirs(args.run_dirs)
    runs = {}
    for label, run_dir in zip(get_run_labels(run_dirs), run_dirs):
        rows = read_per_category_ap(run_dir)
        if rows is None:
            print(f"skipping {run_dir}: no per-category AP file (was it evaluated?)")
            continue
        runs[label if label not in runs else run_dir] = rows
    if not runs:
        raise SystemExit(
            "no run has a per-category AP file (lvis_per_category_ap.csv / coco_per_category_ap.csv)"
        )
    plot_ap_by_frequency(runs, args.out)
    print(f"Wrote {args.out} ({len(runs)} runs)")
    return args.out


if __name__ == "__main__":
    main()
