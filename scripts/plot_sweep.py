r"""Final metrics of a sweep's jobs against the swept config value (what the sweep summary's summary.png shows).

    python scripts/plot_sweep.py multirun/2024-01-01/12-00-00 --out sweep.png
    python scripts/plot_sweep.py SWEEP_DIR --x dataloader.train.sampler.repeat_thresh --y segm/AP segm/APr

One panel per task (mask, box), one line per metric (default: AP, APr, APc, APf) through the mean over jobs
with the same value (e.g. several train.seed), min-max error bars; a symlog x axis when the values span
decades. Each job's swept value comes from its ``.hydra/overrides.yaml``, each metric is its last value in
the job's ``metrics.json``; jobs without the override or the metric are left out.
"""

from __future__ import annotations

import argparse

from lazytrain.utils.plots import plot_sweep
from lazytrain.utils.run_dirs import (
    SWEEP_METRICS,
    get_run_dirs,
    get_sweep_points,
    get_swept_key,
    read_overrides,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep_dir", help="a Hydra multirun directory (one subdirectory per job)")
    parser.add_argument(
        "--x", help="the swept config key (default: the first numeric key that varies, other than train.seed)"
    )
    parser.add_argument("--y", nargs="+", default=list(SWEEP_METRICS), help="metrics to draw")
    parser.add_argument("--out", default="sweep.png", help="image to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    run_dirs = get_run_dirs([args.sweep_dir])
    x_key = args.x or get_swept_key([read_overrides(d) for d in run_dirs])
    if x_key is None:
        raise SystemExit(f"{args.sweep_dir}: no config key varies between its jobs; pass --x KEY.")
    points = get_sweep_points(run_dirs, x_key, args.y)
    plot_sweep(points, x_key, args.out)
    used = sum(len(pairs) for pairs in points.values())
    print(f"Wrote {args.out} ({used} points from {len(run_dirs)} jobs, x = {x_key})")
    return args.out


if __name__ == "__main__":
    main()
