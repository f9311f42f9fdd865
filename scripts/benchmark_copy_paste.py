"""CPU cost per image of the train mapper with Copy-Paste off, uniform and rare-aware, and the rare-aware
index's build time on LVIS-sized records.

    python scripts/benchmark_copy_paste.py                  # the table (a few minutes on one core)
    python scripts/benchmark_copy_paste.py --images 8       # quicker, noisier

Cases: the demo (conf/rfs_maskrcnn_demo.py's train mapper on its 192 px synthetic_lt train images: resize to
192, flip) and LSJ at 1024 px (recipes/data/lsj.py's augmentations, boxes from masks, on synthetic_lt-style
images of 640-1024 px with up to 20 instances, generated under --root). Each mode maps the same records with
the same per-sample seeds, one thread, after a warm-up; printed per case and mode: CPU milliseconds per image
(process time, the fastest of --repeats passes), objects per output image, and the cost over "none". Then the
time to attach an LVIS-sized dataset (--lvis-images records, 13 polygon annotations each on average, in a
serialized `DatasetFromList`) in "rare" mode: one pass over the records for the per-(image, category)
weights, once per rank.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from lazytrain.config import instantiate  # noqa: E402
from lazytrain.data.build import get_detection_dataset_dicts  # noqa: E402
from lazytrain.data.common import DatasetFromList, seed_sample_rngs  # noqa: E402
from lazytrain.data.copy_paste import CopyPaste  # noqa: E402
from lazytrain.data.datasets.lvis import load_lvis_json  # noqa: E402
from lazytrain.data.datasets.synthetic import generate_synthetic_lt  # noqa: E402
from lazytrain.data.mappers import DatasetMapper  # noqa: E402
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge  # noqa: E402
from recipes.data.lsj import lsj_augmentations  # noqa: E402

MODES = ("none", "uniform", "rare")


def _demo_case() -> tuple[list[dict], dict]:
    records = get_detection_dataset_dicts("synthetic_lt_train")
    augmentations = [ResizeShortestEdge([192], max_size=256), RandomFlip(0.5)]
    return records, dict(augmentations=augmentations, recompute_boxes=False, repeat_thresh=0.3)


def _lsj_case(root: str, images: int) -> tuple[list[dict], dict]:
    folder = generate_synthetic_lt(
        os.path.join(root, "synthetic_lt_large"),
        num_train=max(images, 64),
        num_val=1,
        val_images_per_category=1,
        size_range=(640, 1024),
        max_instances=20,
    )
    records = load_lvis_json(os.path.join(folder, "lvis_v1_train.json"), folder)
    augmentations = [instantiate(a) for a in lsj_augmentations(1024)]
    return records, dict(augmentations=augmentations, recompute_boxes=True, repeat_thresh=0.3)


def _time_mode(records: list[dict], case: dict, mode: str, images: int, repeats: int) -> tuple[float, float]:
    """CPU ms per image (the fastest of `repeats` passes: the least disturbed by other processes) and objects
    per output image of the mapper in `mode`."""
    copy_paste = CopyPaste(mode, repeat_thresh=case["repeat_thresh"])
    mapper = DatasetMapper(
        True, case["augmentations"], recompute_boxes=case["recompute_boxes"], copy_paste=copy_paste
    )
    mapper.attach_dataset(DatasetFromList(records))
    for index in range(3):  # warm-up: page cache, allocator, lazy imports
        seed_sample_rngs(index)
        mapper(records[index])
    passes = []
    for _ in range(repeats):
        objects, start = 0, time.process_time()
        for index in range(images):
            seed_sample_rngs(1000 + index)
            objects += len(mapper(records[index % len(records)])["instances"]["classes"])
        passes.append(1000 * (time.process_time() - start) / images)
    return min(passes), objects / images


def _lvis_like_records(num_images: int) -> list[dict]:
    """LVIS-sized records: 1-25 annotations per image (13 on average; LVIS v1 train has 12.7), categories
    long-tailed (Zipf over 1203 ids), 24-point polygons."""
    rng = np.random.default_rng(0)
    polygon = [float(v) for v in rng.uniform(0, 600, 48).round(2)]
    categories = np.minimum(rng.zipf(1.3, 13 * num_images), 1203) - 1
    records, used = [], 0
    for index in range(num_images):
        count = int(rng.integers(1, 26))
        annotations = [
            {"bbox": [10.0, 10.0, 50.0, 50.0], "category_id": int(c), "iscrowd": 0, "segmentation": [polygon]}
            for c in categories[used : used + count]
        ]
        used += count
        records.append({"file_name": f"{index}.jpg", "height": 480, "width": 640, "annotations": annotations})
    return records


def _time_rare_index(num_images: int) -> tuple[float, float]:
    """Seconds to attach `num_images` LVIS-like serialized records in "rare" mode, and the index's MiB."""
    dataset = DatasetFromList(_lvis_like_records(num_images))
    copy_paste = CopyPaste("rare")
    start = time.perf_counter()
    copy_paste.attach_dataset(dataset)
    seconds = time.perf_counter() - start
    arrays = (copy_paste._entry_image, copy_paste._entry_cumulative, copy_paste._category_weights)
    return seconds, sum(a.nbytes for a in arrays) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=48, help="images mapped per case, mode and pass")
    parser.add_argument(
        "--repeats", type=int, default=3, help="passes per case and mode (the fastest counts)"
    )
    parser.add_argument(
        "--root", default="/tmp/benchmark_copy_paste", help="where the LSJ images are written"
    )
    parser.add_argument("--lvis-images", type=int, default=100170, help="records of the index timing")
    args = parser.parse_args()
    torch.set_num_threads(1)
    random.seed(0)
    cases = {"demo 192 px": _demo_case(), "LSJ 1024 px": _lsj_case(args.root, args.images)}
    print("| case | mode | CPU ms / image | objects / image | over none |")
    print("|---|---|---|---|---|")
    for name, (records, case) in cases.items():
        baseline = None
        for mode in MODES:
            milliseconds, objects = _time_mode(records, case, mode, args.images, args.repeats)
            baseline = milliseconds if baseline is None else baseline
            extra = f"+{milliseconds - baseline:.1f} ms" if mode != "none" else "-"
            print(f"| {name} | {mode} | {milliseconds:.1f} | {objects:.1f} | {extra} |", flush=True)
    seconds, mebibytes = _time_rare_index(args.lvis_images)
    print(
        f"\nrare-aware index over {args.lvis_images} LVIS-like serialized records: {seconds:.1f} s, {mebibytes:.1f} MiB"
    )


if __name__ == "__main__":
    main()
