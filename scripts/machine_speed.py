"""How fast this machine runs the demo's kind of work right now: a reference to time jobs against.

    python scripts/machine_speed.py                 # before and after a timed job; 2 threads, ~10 s
    python scripts/machine_speed.py --threads 1     # what each job of a 2-job joblib sweep gets

On the shared 2-core machine the same deterministic demo took 4 min 16 s and 5 min 20 s on one day with the
same core share and no steal time (docs/benchmarks.md): the cores themselves slow down, and neither the load
average nor steal shows it. This times a fixed piece of the demo's step (a ResNet-18 forward and backward on
4 images of 192 x 192, channels last, from a fixed seed) and prints the best and median of a few repeats with
the load average, so a job's s/it can be read against it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# As `python -m lazytrain` runs: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torchvision.models import resnet18  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats (after 3 warm-up ones)")
    parser.add_argument("--size", type=int, default=192, help="image side in pixels")
    return parser.parse_args(argv)


def time_reference_step(repeats: int, size: int) -> list[float]:
    """Seconds of each timed forward + backward pass of ResNet-18 on a fixed batch of 4 images."""
    torch.manual_seed(0)
    model = resnet18(num_classes=30).to(memory_format=torch.channels_last)
    images = torch.randn(4, 3, size, size).contiguous(memory_format=torch.channels_last)
    times = []
    for index in range(repeats + 3):
        start = time.perf_counter()
        model(images).square().mean().backward()
        if index >= 3:
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return times


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    times = time_reference_step(args.repeats, args.size)
    result = {"best_ms": min(times) * 1000, "median_ms": statistics.median(times) * 1000, "load": load}
    print(
        f"reference step (ResNet-18 fwd+bwd, 4 x {args.size} px, {args.threads} threads): "
        f"best {result['best_ms']:.1f} ms, median {result['median_ms']:.1f} ms; 1-min load average {load:.2f}"
    )
    return result


if __name__ == "__main__":
    main()
