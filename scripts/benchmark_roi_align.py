"""RoIAlign on CPU: torchvision's kernel against lazytrain's dense form (`lazytrain.modeling.poolers`).

    python scripts/benchmark_roi_align.py                 # the demo's shapes, 2 threads
    python scripts/benchmark_roi_align.py --threads 1 --repeats 20

Shapes are those of one demo training step (batch 4, 192 px images, 64-channel FPN, sampling ratio 2): the box
head pools 4 x 128 boxes to 7 x 7 and the mask head 4 x 32 positive boxes to 14 x 14; the worst case puts every
box on the largest map (P2, 48 x 48). Prints markdown: best time over the repeats of forward and backward.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torchvision.ops import roi_align as torchvision_roi_align

from lazytrain.modeling.poolers import roi_align_dense

# (name, boxes, output size, feature map side)
CASES = (
    ("box head, all boxes on P2", 512, 7, 48),
    ("mask head, all boxes on P2", 128, 14, 48),
    ("box head, boxes on P3", 256, 7, 24),
)
IMAGES, CHANNELS, SCALE_TO_IMAGE = 4, 64, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats per case (best is reported)")
    return parser.parse_args(argv)


def random_rois(count: int, image_size: int, generator: torch.Generator) -> torch.Tensor:
    corner = torch.rand(count, 2, generator=generator) * image_size * 0.8
    size = torch.rand(count, 2, generator=generator) * image_size * 0.4 + 1.0
    image = torch.randint(0, IMAGES, (count, 1), generator=generator).float().sort(dim=0).values
    return torch.cat([image, corner, (corner + size).clamp(max=image_size)], dim=1)


def best_times(
    pool: Callable[..., torch.Tensor],
    feature: torch.Tensor,
    rois: torch.Tensor,
    output_size: int,
    repeats: int,
) -> tuple[float, float]:
    forward, backward = [], []
    for _ in range(repeats + 1):  # the first call warms up
        start = time.perf_counter()
        pooled = pool(feature, rois, output_size, 1.0 / SCALE_TO_IMAGE, 2)
        middle = time.perf_counter()
        pooled.backward(torch.ones_like(pooled))
        end = time.perf_counter()
        forward.append(middle - start)
        backward.append(end - middle)
        feature.grad = None
    return min(forward[1:]), min(backward[1:])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"threads: {args.threads}, best of {args.repeats}; ms")
    print("| case | torchvision fwd | torchvision bwd | dense fwd | dense bwd | fwd+bwd speed-up |")
    print("|---|---|---|---|---|---|")
    for name, boxes, output_size, side in CASES:
        feature = torch.randn(IMAGES, CHANNELS, side, side, generator=generator, requires_grad=True)
        rois = random_rois(boxes, side * SCALE_TO_IMAGE, generator)
        reference = best_times(torchvision_roi_align, feature, rois, output_size, args.repeats)
        dense = best_times(roi_align_dense, feature, rois, output_size, args.repeats)
        speedup = sum(reference) / sum(dense)
        cells = [f"{1000 * t:.1f}" for t in (*reference, *dense)]
        print(
            f"| {name} ({boxes} boxes, {output_size}x{output_size}) | "
            + " | ".join(cells)
            + f" | {speedup:.2f}x |"
        )


if __name__ == "__main__":
    main()
