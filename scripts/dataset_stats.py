"""Statistics of an LVIS-style data set: images, instances, r/c/f buckets and repeat factors at a threshold.

    python scripts/dataset_stats.py                       # the embedded synthetic_lt (generated on first use)
    python scripts/dataset_stats.py --root /data/synthetic_lt --repeat-thresh 0.1
    python scripts/dataset_stats.py --dataset lvis_v1_train --repeat-thresh 0.001

Repeat factors follow RFS: f_c = share of train images containing c, r_c = max(1, sqrt(t / f_c)), an image's
factor is the largest r_c of its categories.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog  # noqa: E402
from lazytrain.data.datasets.lvis import load_lvis_json  # noqa: E402
from lazytrain.data.samplers import RepeatFactorTrainingSampler  # noqa: E402


def load(args: argparse.Namespace) -> dict[str, tuple[list[dict], list[str]]]:
    """split or name -> (records, frequency bucket per contiguous category id)."""
    if args.dataset:
        names = {args.dataset: args.dataset}
    elif args.root:
        names = {}
        for split in ("train", "val"):
            name = f"dataset_stats_{split}"
            path = os.path.join(args.root, f"lvis_v1_{split}.json")
            DatasetCatalog.register(name, lambda p=path, n=name: load_lvis_json(p, args.root, n))
            names[split] = name
    else:
        names = {"train": "synthetic_lt_train", "val": "synthetic_lt_val"}
    out = {}
    for label, name in names.items():
        records = DatasetCatalog.get(name)
        metadata = MetadataCatalog.get(name)
        out[label] = (records, metadata.get("class_frequency") or ["?"] * len(metadata.thing_classes))
    return out


def print_split(label: str, records: list[dict], frequency: list[str]) -> None:
    instances = Counter(a["category_id"] for r in records for a in r["annotations"])
    images = Counter(c for r in records for c in {a["category_id"] for a in r["annotations"]})
    print(
        f"\n{label}: {len(records)} images, {sum(instances.values())} instances, {len(frequency)} categories"
    )
    print("| bucket | categories | images per category (min-max) | images with the bucket | instances |")
    print("|---|---|---|---|---|")
    for bucket in sorted(set(frequency), key="rcf?".index):
        ids = {i for i, f in enumerate(frequency) if f == bucket}
        counts = sorted(images.get(i, 0) for i in ids)
        with_bucket = sum(1 for r in records if ids & {a["category_id"] for a in r["annotations"]})
        share = sum(instances.get(i, 0) for i in ids)
        print(
            f"| {bucket} | {len(ids)} ({len(ids) / len(frequency):.0%}) | {counts[0]}-{counts[-1]} | "
            f"{with_bucket} | {share} |"
        )


def print_repeat_factors(records: list[dict], frequency: list[str], threshold: float) -> None:
    images = Counter(c for r in records for c in {a["category_id"] for a in r["annotations"]})
    category_factor = {c: max(1.0, (threshold / (n / len(records))) ** 0.5) for c, n in images.items()}
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, threshold)
    print(
        f"\nrepeat factors at t={threshold}: epoch {float(factors.sum()):.0f} samples for {len(records)} images "
        f"({float(factors.mean()):.2f}x), {int((factors > 1).sum())} images repeated, max {float(factors.max()):.2f}"
    )
    print("| bucket | r_c (min-max) |\n|---|---|")
    for bucket in sorted(set(frequency), key="rcf?".index):
        values = sorted(category_factor.get(i, 1.0) for i, f in enumerate(frequency) if f == bucket)
        print(f"| {bucket} | {values[0]:.2f}-{values[-1]:.2f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root", help="folder with lvis_v1_{train,val}.json (default: the embedded synthetic_lt)"
    )
    parser.add_argument("--dataset", help="a registered data set name instead of --root")
    parser.add_argument("--repeat-thresh", type=float, default=0.1, help="RFS threshold t (default 0.1)")
    args = parser.parse_args(argv)
    splits = load(args)
    for label, (records, frequency) in splits.items():
        print_split(label, records, frequency)
    train_label = "train" if "train" in splits else next(iter(splits))
    print_repeat_factors(*splits[train_label], args.repeat_thresh)


if __name__ == "__main__":
    main()
