"""Repeat Factor Sampling at LVIS scale and beyond: vectorised sampler vs the per-image loop reference.

    python scripts/benchmark_sampler.py --sizes 100000 1000000 11000000 --loop-max 1000000

Builds LVIS-v1-like annotations (each of the 1203 categories appears in the same fraction of images as in
LVIS v1 train) directly as a compact CSR table, times repeat-factor computation and one epoch for both
implementations in the same run, checks they produce the same factors and epoch, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lazytrain.data.samplers import CategoryIndex, RepeatFactorTrainingSampler  # noqa: E402
from tests.data.rfs_reference import reference_repeat_factors, reference_stream  # noqa: E402

LVIS_TRAIN_IMAGES = 100170
DEFAULT_COUNTS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "shared",
    "data",
    "lvis_v1_category_image_count.json",
)


def build_lvis_like(num_images: int, counts_file: str, seed: int = 0) -> CategoryIndex:
    """Category c is put in each image independently with probability image_count_c / LVIS_TRAIN_IMAGES."""
    with open(counts_file) as f:
        counts = np.array([c["image_count"] for c in json.load(f)], dtype=np.float64)
    probability = counts / LVIS_TRAIN_IMAGES
    rng = np.random.default_rng(seed)
    per_category = rng.binomial(num_images, probability)  # how many images contain each category
    chunks = [rng.choice(num_images, n, replace=False) for n in per_category]
    lengths = [len(ids) for ids in chunks]
    image_ids = np.concatenate(chunks).astype(np.int64)
    categories = np.repeat(np.arange(len(counts), dtype=np.int32), lengths)
    order = np.lexsort((categories, image_ids))
    image_ids, categories = image_ids[order], categories[order]
    offsets = np.zeros(num_images + 1, dtype=np.int64)
    np.cumsum(np.bincount(image_ids, minlength=num_images), out=offsets[1:])
    instances = rng.integers(1, 4, size=len(categories), dtype=np.int32)
    return CategoryIndex(offsets, categories, instances)


def to_dicts(index: CategoryIndex) -> list[dict]:
    return [
        {
            "annotations": [
                {"category_id": int(c)} for c in index.categories[index.offsets[i] : index.offsets[i + 1]]
            ]
        }
        for i in range(index.num_images)
    ]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100000, 1000000, 11000000])
    parser.add_argument(
        "--loop-max", type=int, default=1000000, help="largest size to run the loop reference on"
    )
    parser.add_argument("--thresh", type=float, default=0.001)
    parser.add_argument("--counts", default=DEFAULT_COUNTS)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        index = build_lvis_like(size, args.counts)
        start = time.perf_counter()
        factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(index, args.thresh)
        t_factors = time.perf_counter() - start
        sampler = RepeatFactorTrainingSampler(factors, seed=0, rank=0, world_size=1)
        start = time.perf_counter()
        epoch = sampler._epoch(torch.Generator().manual_seed(0))
        t_epoch = time.perf_counter() - start
        row = {
            "images": size,
            "epoch_len": len(epoch),
            "vec_factors": t_factors,
            "vec_epoch": t_epoch,
            "bytes_per_index": epoch.element_size(),
            "peak_gb": peak_rss_gb(),
        }
        if size <= args.loop_max:
            dicts = to_dicts(index)
            start = time.perf_counter()
            reference = reference_repeat_factors(dicts, args.thresh)
            row["loop_factors"] = time.perf_counter() - start
            del dicts
            start = time.perf_counter()
            expected = reference_stream(reference, 0, num_epochs=1)
            row["loop_epoch"] = time.perf_counter() - start
            row["identical"] = torch.equal(reference, factors) and expected == epoch.tolist()
            row["peak_gb"] = peak_rss_gb()
        rows.append(row)
        del index, factors, epoch
    print(
        "| images | epoch length | vectorised factors s | vectorised epoch s | loop factors s | loop epoch s | speed-up (factors+epoch) | identical | bytes / epoch index | peak RSS GB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        vec = r["vec_factors"] + r["vec_epoch"]
        loop = r.get("loop_factors", float("nan")) + r.get("loop_epoch", float("nan"))
        speed = f"{loop / vec:.0f}x" if "loop_factors" in r else "-"
        lf = f"{r['loop_factors']:.2f}" if "loop_factors" in r else "-"
        le = f"{r['loop_epoch']:.2f}" if "loop_epoch" in r else "-"
        print(
            f"| {r['images']:,} | {r['epoch_len']:,} | {r['vec_factors']:.3f} | {r['vec_epoch']:.3f} | {lf} | {le} | {speed} | {r.get('identical', '-')} | {r['bytes_per_index']} | {r['peak_gb']:.2f} |"
        )


if __name__ == "__main__":
    main()
