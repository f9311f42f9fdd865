"""Start-up cost of the entrypoint: ``python -m lazytrain CONF --cfg job`` vs the import floor
``python -c "import torch, torchvision, hydra"`` (median wall time of several runs).

    python scripts/benchmark_startup.py --config conf/rfs_maskrcnn_demo.py --repeats 7 \
        --output docs/bench_parts/startup.md

The two commands run alternately after one warm-up run each, so both see the same disk cache and machine
load. Goal: the entrypoint takes <= 1.3x the import floor.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time


def run_once(command: list[str]) -> float:
    """Wall time of one run of `command` (raises if it fails)."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def measure(commands: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """Run every command `repeats` times, alternating between them, after one warm-up run each."""
    for command in commands.values():
        run_once(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            times[name].append(run_once(command))
    return times


def format_report(config: str, repeats: int, times: dict[str, list[float]]) -> str:
    floor, entry = (statistics.median(t) for t in times.values())
    (floor_name, floor_times), (entry_name, entry_times) = times.items()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "## Entrypoint start-up (`scripts/benchmark_startup.py`)",
        "",
        f"    python scripts/benchmark_startup.py --config {config} --repeats {repeats}",
        "",
        f"| command | median s ({repeats} runs) | min s | max s |",
        "|---|---|---|---|",
        f"| `{floor_name}` | {floor:.2f} | {min(floor_times):.2f} | {max(floor_times):.2f} |",
        f"| `{entry_name}` | {entry:.2f} | {min(entry_times):.2f} | {max(entry_times):.2f} |",
        f"| ratio (medians) | {entry / floor:.2f}x | | |",
        "",
        f"Goal <= 1.3x: {'met' if entry / floor <= 1.3 else 'NOT met'}. Measured {datetime.date.today()} on "
        f"{os.cpu_count()} CPU cores (1-minute load average {load:.1f} at the end; other work shared the "
        "machine, so absolute times vary, the two commands ran alternately under the same load).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="conf/rfs_maskrcnn_demo.py")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", default=None, help="write the markdown report here as well")
    args = parser.parse_args()
    commands = {
        'python -c "import torch, torchvision, hydra"': [
            sys.executable,
            "-c",
            "import torch, torchvision, hydra",
        ],
        f"python -m lazytrain {args.config} --cfg job": [
            sys.executable,
            "-m",
            "lazytrain",
            args.config,
            "--cfg",
            "job",
        ],
    }
    report = format_report(args.config, args.repeats, measure(commands, args.repeats))
    print(report)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
