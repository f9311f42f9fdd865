"""Statistics of a registered data set: images, instances, r/c/f buckets and repeat factors at a threshold.

    python scripts/dataset_stats.py --dataset synthetic_lt_train --repeat-thresh 0.1

(The embedded data set is generated on first use under $LAZYTRAIN_DATASETS/synthetic_lt.)
"""

from __future__ import annotations

import argparse
from collections import Counter

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.samplers import RepeatFactorTrainingSampler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="synthetic_lt_train")
    parser.add_argument("--repeat-thresh", type=float, default=0.1)
    args = parser.parse_args(argv)
    records = DatasetCatalog.get(args.dataset)
    meta = MetadataCatalog.get(args.dataset)
    frequency = meta.get("class_frequency") or ["?"] * len(meta.thing_classes)
    image_counts = Counter(c for r in records for c in {a["category_id"] for a in r["annotations"]})
    instances = sum(len(r["annotations"]) for r in records)
    print(
        f"{args.dataset}: {len(records)} images, {instances} instances, {len(meta.thing_classes)} categories\n"
    )
    print("| bucket | categories | train images per category (min-max) | instances share |")
    print("|---|---|---|---|")
    per_bucket = Counter(a["category_id"] for r in records for a in r["annotations"])
    for bucket in ("r", "c", "f"):
        ids = [i for i, f in enumerate(frequency) if f == bucket]
        counts = [image_counts.get(i, 0) for i in ids]
        share = sum(per_bucket.get(i, 0) for i in ids) / max(instances, 1)
        span = f"{min(counts)}-{max(counts)}" if counts else "-"
        print(f"| {bucket} | {len(ids)} | {span} | {share:.1%} |")
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, args.repeat_thresh)
    print(
        f"\nrepeat factors at t={args.repeat_thresh}: mean {factors.mean():.2f}, max {factors.max():.2f}, "
        f"images repeated (r > 1): {int((factors > 1).sum())}, expected epoch length {factors.sum():.0f}"
    )
    by_category = {}
    for record, factor in zip(records, factors.tolist()):
        for a in record["annotations"]:
            by_category[a["category_id"]] = max(by_category.get(a["category_id"], 1.0), factor)
    rare = sorted(by_category[i] for i, f in enumerate(frequency) if f == "r" and i in by_category)
    if rare:
        print(f"rare categories' largest repeat factor: {rare[0]:.2f}-{rare[-1]:.2f}")


if __name__ == "__main__":
    main()
