"""Start-up cost of the entrypoint: ``python -m lazytrain CONF --cfg job`` vs the import floor
``python -c "import torch, torchvision, hydra"`` (median wall time of several runs).

    python scripts/benchmark_startup.py --config conf/rfs_maskrcnn_demo.py --repeats 5

Goal: the entrypoint takes <= 1.3x the import floor.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall_time(command: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="conf/rfs_maskrcnn_demo.py")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    floor = wall_time([sys.executable, "-c", "import torch, torchvision, hydra"], args.repeats)
    entry = wall_time([sys.executable, "-m", "lazytrain", args.config, "--cfg", "job"], args.repeats)
    print(f"| command | median s ({args.repeats} runs) |")
    print("|---|---|")
    print(f"| python -c 'import torch, torchvision, hydra' | {floor:.2f} |")
    print(f"| python -m lazytrain {args.config} --cfg job | {entry:.2f} |")
    print(f"| ratio | {entry / floor:.2f}x |")


if __name__ == "__main__":
    main()
