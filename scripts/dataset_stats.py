"""Statistics of a long-tailed data set: images, instances, r/c/f buckets, and what Repeat Factor Sampling does
at a few thresholds t (epoch length, images repeated, factors per bucket), to choose
``dataloader.train.sampler.repeat_thresh``.

    python scripts/dataset_stats.py                                   # the embedded synthetic_lt
    python scripts/dataset_stats.py --json /data/mine/train.json      # any COCO/LVIS json (your own data)
    python scripts/dataset_stats.py --json train.json --repeat-thresh 0.01 0.03 0.1
    python scripts/dataset_stats.py --dataset lvis_v1_train --repeat-thresh 0.001

Repeat factors follow RFS: f_c = share of train images containing c, r_c = max(1, sqrt(t / f_c)), an image's
factor is the largest r_c of its categories. Categories in fewer than t x N of the N train images are
repeated, so t scales with the data set: LVIS's 0.001 (~100k images) is "fewer than 100 images"; the default
candidates include 100 / N, the custom recipe's default. With --json, categories without an LVIS
'frequency' are binned by train image counts (--frequency-thresholds, as data.frequency_thresholds).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog  # noqa: E402
from lazytrain.data.datasets.custom import get_default_repeat_thresh, register_json_dataset  # noqa: E402
from lazytrain.data.datasets.lvis import load_lvis_json  # noqa: E402
from lazytrain.data.repeat_factors import repeat_factors_from_category_frequency  # noqa: E402


def load(args: argparse.Namespace) -> dict[str, tuple[list[dict], list[str]]]:
    """split or name -> (records, frequency bucket per contiguous category id)."""
    if args.json:
        thresholds = args.frequency_thresholds
        names = {
            "train": register_json_dataset(
                "dataset_stats_train", args.json, "", frequency_thresholds=thresholds
            )
        }
    elif args.dataset:
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
    if args.json:
        print(f"buckets from {MetadataCatalog.get(names['train']).frequency_rule}")
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


def print_repeat_factors(records: list[dict], frequency: list[str], thresholds: list[float]) -> None:
    """One row per threshold: epoch length, images repeated, largest factor, r_c range per bucket."""
    records = [r for r in records if r["annotations"]]  # what the train loader samples (filter_empty)
    images = Counter(c for r in records for c in {a["category_id"] for a in r["annotations"]})
    buckets = sorted(set(frequency), key="rcf?".index)
    print(f"\nRepeat Factor Sampling over the {len(records)} train images with annotations:")
    print("| t | epoch (samples) | x images | images repeated | max factor | " + " | ".join(
        f"r_c {b} (min-max)" for b in buckets) + " |")  # fmt: skip
    print("|---" * (5 + len(buckets)) + "|")
    for threshold in thresholds:
        factors = repeat_factors_from_category_frequency(records, threshold)
        category = {c: max(1.0, (threshold / (n / len(records))) ** 0.5) for c, n in images.items()}
        ranges = []
        for bucket in buckets:
            values = sorted(category.get(i, 1.0) for i, f in enumerate(frequency) if f == bucket)
            ranges.append(f"{values[0]:.2f}-{values[-1]:.2f}")
        print(
            f"| {threshold:g} | {float(factors.sum()):.0f} | {float(factors.mean()):.2f} | "
            f"{int((factors > 1).sum())} | {float(factors.max()):.2f} | " + " | ".join(ranges) + " |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--json", help="a COCO- or LVIS-format train json (your own data set)")
    source.add_argument(
        "--root", help="folder with lvis_v1_{train,val}.json (default: the embedded synthetic_lt)"
    )
    source.add_argument("--dataset", help="a registered data set name instead of --root")
    parser.add_argument(
        "--repeat-thresh",
        type=float,
        nargs="+",
        help="RFS thresholds t to compare (default: 0.001 0.01 0.1 0.3 and 100 / train images)",
    )
    parser.add_argument(
        "--frequency-thresholds",
        type=float,
        nargs=2,
        default=[10, 100],
        metavar=("RARE", "COMMON"),
        help="with --json: r/c/f limits in train images (fractions of the images when below 1); default 10 100",
    )
    args = parser.parse_args(argv)
    splits = load(args)
    for label, (records, frequency) in splits.items():
        print_split(label, records, frequency)
    train_label = "train" if "train" in splits else next(iter(splits))
    records, frequency = splits[train_label]
    thresholds = args.repeat_thresh
    if not thresholds:
        default = get_default_repeat_thresh(sum(1 for r in records if r["annotations"]))
        thresholds = sorted({0.001, 0.01, 0.1, 0.3, default})
        print(f"\n100 / train images = {default:g}: the custom recipe's default repeat_thresh for this set")
    print_repeat_factors(records, frequency, thresholds)


if __name__ == "__main__":
    main()
