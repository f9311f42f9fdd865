"""Repeat Factor Sampling at LVIS scale and beyond: the vectorised sampler vs a per-image loop reference.

    python scripts/benchmark_sampler.py                      # 100k, 1M and 11M images (loop up to 1M)
    python scripts/benchmark_sampler.py --sizes 100000 --counts ../shared/data/lvis_v1_category_image_count.json

Annotations are LVIS-v1-like: category c is put into exactly round(image_count_c * N / 100170) images drawn
uniformly without replacement, so every category's image frequency equals its LVIS v1 train frequency (the
counts file lists image_count for the 1203 categories of the 100,170 train images); each (image, category)
gets a geometric number of instances. The table is built straight into the compact CSR form the sampler uses
(no per-image Python object); the loop reference needs records, so it runs only up to --loop-max images.

Timed, in the same run: repeat factors (vectorised from the CSR table; vectorised from records, which includes
the Python pass over the records; the loop reference from records) and one epoch (vectorised; loop reference),
checking both give the same factors and the same epoch. The peak memory of an epoch is the rise of the
process's RSS high-water mark while it is drawn (large allocations mmap-ed, so RSS follows live arrays).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import math
import os
import statistics
import time

import numpy as np
import torch

from lazytrain.data.repeat_factors import CategoryIndex, repeat_factors_from_category_frequency
from lazytrain.data.samplers import RepeatFactorTrainingSampler

LVIS_V1_TRAIN_IMAGES = 100170
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COUNTS = os.path.join(REPO_ROOT, "..", "shared", "data", "lvis_v1_category_image_count.json")


def build_lvis_like(num_images: int, counts_file: str, seed: int = 0) -> CategoryIndex:
    """CSR table with LVIS v1 category image frequencies, built by a counting sort (no per-image loop)."""
    with open(counts_file) as f:
        counts = np.array([c["image_count"] for c in json.load(f)], dtype=np.int64)
    per_category = np.round(counts * num_images / LVIS_V1_TRAIN_IMAGES).astype(np.int64)
    rng = np.random.default_rng(seed)
    images = [rng.choice(num_images, n, replace=False).astype(np.int32) for n in per_category]
    offsets = np.zeros(num_images + 1, dtype=np.int64)
    for chunk in images:
        offsets[1:][chunk] += 1
    np.cumsum(offsets, out=offsets)
    cursor = offsets[:-1].copy()
    categories = np.empty(offsets[-1], dtype=np.int32)
    for category, chunk in enumerate(images):  # ascending categories -> ascending within each image
        categories[cursor[chunk]] = category  # an image appears once per category: no index collisions
        cursor[chunk] += 1
    instances = rng.geometric(0.6, size=len(categories)).astype(np.int32)
    return CategoryIndex(offsets, categories, instances)


def to_records(index: CategoryIndex) -> list[dict]:
    records = []
    for i in range(index.num_images):
        span = slice(index.offsets[i], index.offsets[i + 1])
        records.append(
            {
                "annotations": [
                    {"category_id": c}
                    for c, n in zip(index.categories[span].tolist(), index.instances[span].tolist())
                    for _ in range(n)
                ]
            }
        )
    return records


# The straightforward per-image loop reference (as in tests/data/test_samplers.py).
def loop_repeat_factors(dataset_dicts: list[dict], repeat_thresh: float) -> torch.Tensor:
    image_count = collections.Counter()
    for record in dataset_dicts:
        image_count.update({a["category_id"] for a in record["annotations"]})
    category_factor = {
        c: max(1.0, math.sqrt(repeat_thresh / (n / len(dataset_dicts)))) for c, n in image_count.items()
    }
    factors = []
    for record in dataset_dicts:
        categories = {a["category_id"] for a in record["annotations"]}
        factors.append(max((category_factor[c] for c in categories), default=1.0))
    return torch.tensor(factors, dtype=torch.float32)


def loop_epoch(repeat_factors: torch.Tensor, generator: torch.Generator) -> list[int]:
    int_part = torch.trunc(repeat_factors)
    frac_part = repeat_factors - int_part
    rands = torch.rand(len(repeat_factors), generator=generator)
    counts = int_part + (rands < frac_part).float()
    indices = []
    for image, count in enumerate(counts.tolist()):
        indices.extend([image] * int(count))
    order = torch.randperm(len(indices), generator=generator)
    return [indices[i] for i in order.tolist()]


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def return_freed_memory_to_the_system() -> None:
    """Serve every allocation >= 64 KiB by its own mmap (glibc), so RSS follows live arrays exactly instead of
    reusing heap pages that earlier steps left resident."""
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD; also stops its dynamic growth


_HIGH_WATER = [0]  # process-wide peak RSS, kept across the resets below


def max_rss_bytes() -> int:
    _HIGH_WATER[0] = max(_HIGH_WATER[0], _status_bytes("VmHWM"))
    return _HIGH_WATER[0]


def peak_rss_increase(function):
    """(result, peak RSS during function() minus RSS before it, in bytes)."""
    max_rss_bytes()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark (VmHWM) to the current RSS
    before = _status_bytes("VmRSS")
    result = function()
    return result, _status_bytes("VmHWM") - before


def median_time(function, repeats: int):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def run(size: int, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    index = build_lvis_like(size, args.counts)
    row = {"images": size, "entries": len(index.categories), "build_s": time.perf_counter() - start}
    factors, row["vec_factors"] = median_time(
        lambda: repeat_factors_from_category_frequency(index, args.thresh), 3
    )
    sampler = RepeatFactorTrainingSampler(factors, seed=0, rank=0, world_size=1)
    _, row["vec_epoch"] = median_time(lambda: sampler._epoch(torch.Generator().manual_seed(0)), 3)
    epoch, row["epoch_peak_bytes"] = peak_rss_increase(
        lambda: sampler._epoch(torch.Generator().manual_seed(0))
    )
    row["epoch_len"], row["stored_bytes"] = len(epoch), epoch.element_size()
    if size <= args.loop_max:
        records = to_records(index)
        by_records, row["vec_factors_records"] = median_time(
            lambda: repeat_factors_from_category_frequency(records, args.thresh),
            1,
        )
        reference, row["loop_factors"] = median_time(lambda: loop_repeat_factors(records, args.thresh), 1)
        del records
        expected, row["loop_epoch"] = median_time(
            lambda: loop_epoch(reference, torch.Generator().manual_seed(0)), 1
        )
        row["identical"] = (
            torch.equal(reference, factors)
            and torch.equal(by_records, factors)
            and expected == epoch.tolist()
        )
    row["max_rss_gb"] = max_rss_bytes() / 2**30
    return row


def print_table(rows: list[dict]) -> None:
    def cell(row, key, digits=3):
        return f"{row[key]:.{digits}f}" if key in row else "-"

    print(
        "| images | (image, category) pairs | epoch length | vectorised factors (CSR) s | vectorised factors "
        "(records) s | vectorised epoch s | loop factors s | loop epoch s | speed-up CSR | speed-up records | "
        "identical | epoch peak bytes / index | stored bytes / index | max RSS GB |"
    )
    print("|" + "---|" * 14)
    for r in rows:
        vec = r["vec_factors"] + r["vec_epoch"]
        loop = r.get("loop_factors", math.nan) + r.get("loop_epoch", math.nan)
        from_records = r.get("vec_factors_records", math.nan) + r["vec_epoch"]
        speed = f"{loop / vec:.0f}x" if "loop_epoch" in r else "-"
        speed_records = f"{loop / from_records:.0f}x" if "loop_epoch" in r else "-"
        print(
            f"| {r['images']:,} | {r['entries']:,} | {r['epoch_len']:,} | {cell(r, 'vec_factors')} | "
            f"{cell(r, 'vec_factors_records')} | {cell(r, 'vec_epoch')} | {cell(r, 'loop_factors', 2)} | "
            f"{cell(r, 'loop_epoch', 2)} | {speed} | {speed_records} | {r.get('identical', '-')} | "
            f"{r['epoch_peak_bytes'] / r['epoch_len']:.1f} | {r['stored_bytes']} | {r['max_rss_gb']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 11_000_000])
    parser.add_argument(
        "--loop-max", type=int, default=1_000_000, help="largest size to run the loop reference at"
    )
    parser.add_argument("--thresh", type=float, default=0.001, help="repeat_thresh (LVIS: 0.001)")
    parser.add_argument("--counts", default=DEFAULT_COUNTS, help="LVIS v1 category image counts (json)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return_freed_memory_to_the_system()
    rows = []
    for size in args.sizes:
        rows.append(run(size, args))
        print(f"# {size:,} images done (table built in {rows[-1]['build_s']:.1f} s)", flush=True)
    print(
        f"\ntorch {torch.__version__}, {args.threads} threads, repeat_thresh={args.thresh}; times are medians of 3 "
        "(vectorised) or single runs (loop, records)\n"
    )
    print_table(rows)


if __name__ == "__main__":
    main()
