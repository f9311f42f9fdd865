r"""Final metrics of a sweep's jobs against the swept config value: one line per metric.

    python scripts/plot_sweep.py multirun/2024-01-01/12-00-00 --x dataloader.train.sampler.repeat_thresh \
        --y segm/AP segm/APr segm/APc segm/APf --out sweep.png

Each job's swept value comes from its ``.hydra/overrides.yaml``; each metric is its last value in the job's
``metrics.json``. Jobs without the override or the metric are left out (and reported).
"""

from __future__ import annotations

import argparse

from lazytrain.utils.visualizer import (
    get_last_values,
    get_override_value,
    get_run_dirs,
    plot_sweep,
    read_metrics,
    read_overrides,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep_dir", help="a Hydra multirun directory (one subdirectory per job)")
    parser.add_argument(
        "--x", required=True, help="the swept config key, e.g. dataloader.train.sampler.repeat_thresh"
    )
    parser.add_argument("--y", nargs="+", default=["segm/AP", "segm/APr", "segm/APc", "segm/APf"])
    parser.add_argument("--out", default="sweep.png", help="image to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    points = {key: [] for key in args.y}
    for run_dir in get_run_dirs([args.sweep_dir]):
        x = get_override_value(read_overrides(run_dir), args.x)
        if x is None:
            print(f"skipping {run_dir}: no override of {args.x}")
            continue
        values = get_last_values(read_metrics(run_dir), args.y)
        for key in args.y:
            if key in values:
                points[key].append((x, values[key]))
            else:
                print(f"{run_dir} ({args.x}={x}) has no {key}")
    plot_sweep(points, args.x, args.out)
    print(f"Wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
