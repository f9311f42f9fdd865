"""Rank 0's memory and time for an LVIS-scale final evaluation: gathered predictions, then the LVIS protocol.

    python scripts/benchmark_eval_memory.py                                    # LVIS val scale: 20,000 x 300
    python scripts/benchmark_eval_memory.py --images 200 --detections 50       # quick
    python scripts/benchmark_eval_memory.py --ap-fixed 10000 --detections 1000 --standard-detections 1
                                                     # AP-fixed's top K per category: its gather and merge

--ap-fixed K adds AP-fixed and AP-pool (`LVISEvaluator(ap_fixed=True, ap_pool=True, max_dets_per_category=K)`):
each rank's detections go into its running top K per category as `process` puts them, and rank 0's report
has the phases of the top K too (its gather and merge, the exact cut, `evaluate_fixed_ap`) and each rank's
top-K state as pickled for the gather. --standard-detections keeps fewer of each image's detections for the
standard metrics (the best ones), to measure the top K apart from them; --no-fixed-metrics stops after the top
K's gather, merge and cut (the metrics themselves take minutes per million kept detections).

Data (written to --workdir, deleted afterwards unless --keep): a ground-truth json shaped like LVIS v1 val (the
1203 categories with their frequencies and train image counts from --counts; per image 1 + Poisson(2.5)
categories drawn by train image count, each with a geometric number of instances (mean 3.3, about 12 per image
as in LVIS v1 val), 1 + Poisson(4) negative categories, 10% of the positive ones not exhaustive; images 640 x
360-480 or 360-480 x 640; polygons of 24 vertices). Object sizes are log-normal in sqrt(area) (median 45 px,
sigma 1: about 40% small, 35% medium, 25% large, COCO's mix).

Predictions: --detections per image (LVIS: 300), each with a box, a score and an RLE mask of the image size (a
16-vertex star polygon filling its box). Half are jittered copies of a ground-truth instance of the image (same
category), 15% are of the image's negative categories, the rest of random categories (federated evaluation
ignores those). What each rank keeps per image is built exactly as `LVISEvaluator.process` builds it, from
RLEs made straight from the polygons (encoding 300 full-size masks takes about 1 s per image on this machine);
--check-images images are also run through the real `process` on the decoded masks, and must give equal
objects.

Then --world-size gloo processes (contiguous shards, as `InferenceSampler`) call `evaluator.evaluate()`: the
gather on rank 0 and rank 0's evaluation. Rank 0 reports each phase's time, its RSS after the phase and its
peak RSS during the phase (VmHWM, reset before each phase through /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

# As `python -m lazytrain` runs: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pycocotools.mask as mask_util  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from lazytrain.data.catalog import MetadataCatalog  # noqa: E402
from lazytrain.evaluation import LVISEvaluator, coco_evaluation, lvis_evaluation  # noqa: E402
from lazytrain.evaluation.fixed_ap import CategoryTopK, take_detections  # noqa: E402
from lazytrain.evaluation.predictions import ImagePredictions, pack_instances  # noqa: E402
from lazytrain.utils import comm  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COUNTS = os.path.join(REPO_ROOT, "..", "shared", "data", "lvis_v1_category_image_count.json")
DATASET_NAME = "benchmark_eval_memory_val"
GB = 1e9


# ---------------------------------------------------------------------------------------------- synthetic data
def load_categories(counts_file: str, num_categories: int) -> list[dict]:
    """LVIS v1 categories (id, name, frequency, image_count); synthetic ones in LVIS's r/c/f mix without the file."""
    if os.path.exists(counts_file):
        with open(counts_file) as f:
            categories = json.load(f)[:num_categories]
        return [{key: c[key] for key in ("id", "name", "frequency", "image_count")} for c in categories]
    print(f"{counts_file} not found: {num_categories} categories with made-up image counts")
    rng = np.random.default_rng(0)
    counts = np.exp(rng.uniform(0, np.log(10000), num_categories)).astype(int) + 1
    return [
        {
            "id": i + 1,
            "name": f"c{i + 1}",
            "frequency": "r" if n <= 10 else "c" if n <= 100 else "f",
            "image_count": int(n),
        }
        for i, n in enumerate(counts)
    ]


def sample_boxes(rng: np.random.Generator, count: int, width: int, height: int) -> np.ndarray:
    """[count, 4] XYXY boxes inside the image, log-normal sqrt(area) (median 45 px), aspect ratio 1/3-3."""
    side = np.clip(np.exp(rng.normal(np.log(45.0), 1.0, count)), 4.0, 600.0)
    aspect = np.exp(rng.uniform(np.log(1 / 3), np.log(3), count))
    w = np.clip(side * np.sqrt(aspect), 2.0, width - 1.0)
    h = np.clip(side / np.sqrt(aspect), 2.0, height - 1.0)
    x0, y0 = rng.uniform(0, width - w), rng.uniform(0, height - h)
    return np.stack([x0, y0, x0 + w, y0 + h], axis=1)


def star_polygons(rng: np.random.Generator, boxes: np.ndarray, vertices: int) -> list[list[float]]:
    """One star-shaped polygon per box (radii 60-100% of the box's half sizes), as COCO flat lists."""
    count = len(boxes)
    theta = np.sort(rng.uniform(0, 2 * np.pi, (count, vertices)), axis=1)
    radius = rng.uniform(0.6, 1.0, (count, vertices))
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    half_w, half_h = (boxes[:, 2] - boxes[:, 0]) / 2, (boxes[:, 3] - boxes[:, 1]) / 2
    xs = cx[:, None] + radius * np.cos(theta) * half_w[:, None]
    ys = cy[:, None] + radius * np.sin(theta) * half_h[:, None]
    return np.round(np.stack([xs, ys], axis=2).reshape(count, -1), 2).tolist()


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width) of a COCO/LVIS-like image: 640 on the long side, 360-480 on the other."""
    short = int(rng.integers(360, 481))
    return (short, 640) if rng.random() < 0.7 else (640, short)


def make_ground_truth(num_images: int, categories: list[dict], seed: int) -> dict:
    """LVIS-v1-val-like json: positive, negative and not-exhaustive categories, polygon instances."""
    rng = np.random.default_rng(seed)
    ids = np.array([c["id"] for c in categories])
    weights = np.array([c["image_count"] for c in categories], dtype=np.float64)
    weights /= weights.sum()
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        height, width = image_size(rng)
        chosen = rng.choice(
            len(ids), 1 + min(int(rng.poisson(2.5)) + int(rng.poisson(4.0)), 40), replace=False, p=weights
        )
        num_positive = 1 + min(int(rng.poisson(2.5)), len(chosen) - 1)
        positive, negative = ids[chosen[:num_positive]], ids[chosen[num_positive:]]
        per_category = rng.geometric(0.3, len(positive))
        classes = np.repeat(positive, per_category)
        boxes = sample_boxes(rng, len(classes), width, height)
        polygons = star_polygons(rng, boxes, 24)
        rles = mask_util.frPyObjects(polygons, height, width)
        areas, bboxes = mask_util.area(rles), mask_util.toBbox(rles)
        for category_id, polygon, area, bbox in zip(
            classes.tolist(), polygons, areas.tolist(), bboxes.tolist()
        ):
            annotations.append(
                {
                    "id": len(annotations) + 1, "image_id": image_id, "category_id": category_id,
                    "segmentation": [polygon], "area": float(area), "bbox": bbox, "iscrowd": 0,
                }
            )  # fmt: skip
        images.append(
            {
                "id": image_id, "height": height, "width": width, "file_name": f"{image_id:012d}.jpg",
                "neg_category_ids": sorted(negative.tolist()),
                "not_exhaustive_category_ids": sorted(positive[rng.random(len(positive)) < 0.1].tolist()),
            }
        )  # fmt: skip
    return {"images": images, "annotations": annotations, "categories": categories}


def make_outputs(
    rng: np.random.Generator, image: dict, annotations: list[dict], num_categories: int, detections: int
) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """One image's model output (boxes, scores, classes; sorted by score) and the RLEs of its masks."""
    height, width = image["height"], image["width"]
    num_near = detections // 2 if annotations else 0
    num_negative = int(0.15 * detections) if image["neg_category_ids"] else 0
    num_random = detections - num_near - num_negative
    picked = [annotations[i] for i in rng.integers(0, len(annotations), num_near)] if num_near else []
    near = np.array([a["bbox"] for a in picked], dtype=np.float64).reshape(-1, 4)
    size = near[:, 2:] * np.exp(rng.normal(0, 0.2, (num_near, 2)))
    centre = near[:, :2] + near[:, 2:] / 2 + rng.normal(0, 0.1, (num_near, 2)) * near[:, 2:]
    near = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
    near = np.clip(near, 0, [width, height, width, height])
    near[:, 2:] = np.maximum(near[:, 2:], near[:, :2] + 1)
    boxes = np.concatenate([near, sample_boxes(rng, num_negative + num_random, width, height)])
    classes = np.concatenate(
        [
            np.array([a["category_id"] - 1 for a in picked], dtype=np.int64),
            rng.choice(np.array(image["neg_category_ids"], dtype=np.int64) - 1, num_negative)
            if num_negative
            else [],
            rng.integers(0, num_categories, num_random),
        ]
    ).astype(np.int64)
    order = np.argsort(-(scores := rng.random(detections) ** 2), kind="stable")
    boxes, classes, scores = boxes[order], classes[order], scores[order]
    rles = mask_util.frPyObjects(star_polygons(rng, boxes, 16), height, width)
    instances = {
        "boxes": torch.from_numpy(boxes).float(),
        "scores": torch.from_numpy(scores).float(),
        "classes": torch.from_numpy(classes),
    }
    return instances, rles


def stored_prediction(
    evaluator: LVISEvaluator, image_id: int, instances: dict[str, torch.Tensor], rles: list[dict]
) -> ImagePredictions:
    """What `evaluator.process` keeps for this image, with `rles` as the encoded masks."""
    kept = pack_instances(instances, image_id, evaluator.get_category_ids())
    size = (int(rles[0]["size"][0]), int(rles[0]["size"][1])) if rles else None
    return kept._replace(mask_size=size, mask_counts=[rle["counts"].decode("ascii") for rle in rles])


def check_against_process(
    evaluator: LVISEvaluator, image: dict, instances: dict, rles: list[dict], kept: Any
) -> float:
    """Run the real `process` on the decoded masks; the kept object must equal `kept`. Returns its seconds."""
    masks = torch.from_numpy(np.ascontiguousarray(mask_util.decode(rles).transpose(2, 0, 1)))
    record = {"image_id": image["id"], "height": image["height"], "width": image["width"]}
    evaluator.reset()
    start = time.perf_counter()
    evaluator.process([record], [{"instances": {**instances, "masks": masks}}])
    seconds = time.perf_counter() - start
    if pickle.dumps(evaluator._predictions[0]) != pickle.dumps(kept):
        raise AssertionError(f"image {image['id']}: the synthetic stored prediction differs from process()'s")
    evaluator.reset()
    return seconds


# ---------------------------------------------------------------------------------------------- measurements
def read_status(field: str) -> float:
    """A /proc/self/status memory field in GB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / GB
    return float("nan")


def reset_peak() -> None:
    """Restart the VmHWM high-water mark at the current RSS (Linux >= 4.0)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of `obj` and everything it references (each object once; numpy arrays with their buffers)."""
    seen = set() if seen is None else seen
    stack, total = [obj], 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.append(vars(item))
    return total


class Phases:
    """Per phase: calls, seconds, CPU seconds (all threads), RSS after, peak RSS; calls of the same phase under
    the same parent (loadRes of each category chunk) add up. Wraps functions so that each call is a phase."""

    def __init__(self) -> None:
        self.rows: dict[tuple[Any, str], list[Any]] = {}  # in the order phases first start
        self.stack: list[tuple[Any, str]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.stack:  # a nested phase (loadRes inside a task) reports the peak since its parent began
            reset_peak()
        key = (self.stack[-1] if self.stack else None, name)
        row = self.rows.setdefault(key, ["  " * len(self.stack) + name, 0, 0.0, 0.0, 0.0, 0.0])
        self.stack.append(key)
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.stack.pop()
            row[1] += 1
            row[2] += time.perf_counter() - start
            row[3] += time.process_time() - cpu
            row[4], row[5] = read_status("VmRSS"), max(row[5], read_status("VmHWM"))

    def wrap(self, owner: Any, attribute: str, name: Callable[..., str] | str) -> None:
        original = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name(*args, **kwargs) if callable(name) else name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def instrument(phases: Phases, fixed_metrics: bool = True) -> None:
    """Time the gather and each step of rank 0's evaluation (the evaluator's own code runs unchanged)."""
    if not fixed_metrics:
        lvis_evaluation.evaluate_fixed_ap = lambda *args, **kwargs: {}
    from faster_coco_eval import COCO, COCOeval_faster

    gathers = iter(range(1, 1000))
    phases.wrap(comm, "gather", lambda *args, **kwargs: f"gather #{next(gathers)} (pickle, send, unpickle)")
    # AP-fixed: before gather_in_turn the top K came through the first gather; with it, the merge receives them.
    phases.wrap(CategoryTopK, "merge", "top K: merge (receiving each rank's share in turn, if streamed)")
    phases.wrap(CategoryTopK, "get_detections", "top K: exact cut (get_detections)")
    phases.wrap(
        lvis_evaluation, "evaluate_fixed_ap", lambda gt, dets, task, *a, **kw: f"{task}: evaluate_fixed_ap"
    )
    phases.wrap(coco_evaluation, "write_coco_results", "write lvis_instances_results.json")
    phases.wrap(LVISEvaluator, "_load_ground_truth", "load ground truth")
    phases.wrap(coco_evaluation, "DetectionTable", "detections as flat arrays")
    phases.wrap(LVISEvaluator, "_evaluate_task", lambda self, gt, table, task, ids: f"{task}: total")
    phases.wrap(COCO, "loadRes", "loadRes")
    phases.wrap(COCOeval_faster, "evaluate", "evaluate")
    phases.wrap(COCOeval_faster, "accumulate", "accumulate")
    phases.wrap(COCOeval_faster, "summarize", "summarize")


# ---------------------------------------------------------------------------------------------- one rank
def run_rank(rank: int, world_size: int, port: int, args: argparse.Namespace, json_file: str) -> None:
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        measure_rank(rank, world_size, args, json_file)
    finally:
        if world_size > 1:
            dist.destroy_process_group()


def measure_rank(rank: int, world_size: int, args: argparse.Namespace, json_file: str) -> None:
    with open(json_file) as f:
        data = json.load(f)
    mapping = {c["id"]: i for i, c in enumerate(sorted(data["categories"], key=lambda c: c["id"]))}
    MetadataCatalog.get(DATASET_NAME).set(json_file=json_file, thing_dataset_id_to_contiguous_id=mapping)
    by_image: dict[int, list[dict]] = {}
    for annotation in data["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append(annotation)
    per_rank = -(-len(data["images"]) // world_size)
    images = data["images"][rank * per_rank : (rank + 1) * per_rank]
    del data  # rank 0 loads the ground truth again inside the evaluator, as in a real run
    output_dir = os.path.join(args.workdir, "output") if args.write_results else None
    options = dict(ap_fixed=True, ap_pool=True, max_dets_per_category=args.ap_fixed) if args.ap_fixed else {}
    evaluator = LVISEvaluator(
        DATASET_NAME, max_dets_per_image=args.detections, output_dir=output_dir, **options
    )
    evaluator.reset()
    rng = np.random.default_rng(args.seed + 1000 + rank)
    checker = LVISEvaluator(DATASET_NAME, max_dets_per_image=args.detections)  # its own list of predictions
    rss_start, start, process_seconds = read_status("VmRSS"), time.perf_counter(), []
    for index, image in enumerate(images):
        instances, rles = make_outputs(
            rng, image, by_image.get(image["id"], []), len(mapping), args.detections
        )
        kept = stored_prediction(evaluator, image["id"], instances, rles)
        if rank == 0 and index < args.check_images:
            process_seconds.append(check_against_process(checker, image, instances, rles, kept))
        if args.ap_fixed:  # as `process`: the running top K, and the best few for the standard metrics
            evaluator._top_k.add(kept)
            kept = take_detections(kept, np.arange(min(args.standard_detections, kept.num_detections)))
        evaluator._predictions.append(kept)
    build_seconds = time.perf_counter() - start
    del by_image
    top_k_pickled = len(pickle.dumps(evaluator._top_k.get_state())) if args.ap_fixed else 0
    pickled = len(pickle.dumps(evaluator._predictions, protocol=pickle.DEFAULT_PROTOCOL))
    sample = evaluator._predictions[: args.sample_images]
    object_bytes = deep_size(sample) * len(images) / max(len(sample), 1)
    sizes = comm.all_gather(
        (len(images), pickled, object_bytes, read_status("VmRSS") - rss_start, top_k_pickled)
    )
    if rank == 0:
        phases = Phases()
        instrument(phases, args.fixed_metrics)
        rss_before, start, cpu = read_status("VmRSS"), time.perf_counter(), time.process_time()
        results = evaluator.evaluate()
        peak = max(row[5] for row in phases.rows.values())
        total = ["evaluate() on rank 0, all", 1, time.perf_counter() - start, time.process_time() - cpu]
        rows = [total + [read_status("VmRSS"), peak], *phases.rows.values()]
        report(args, world_size, sizes, build_seconds, process_seconds, rss_before, rows, results)
    else:
        evaluator.evaluate()


def report(
    args: argparse.Namespace,
    world_size: int,
    sizes: list[tuple[int, int, float, float, int]],
    build_seconds: float,
    process_seconds: list[float],
    rss_before: float,
    rows: list[list[Any]],
    results: dict,
) -> None:
    images = sum(s[0] for s in sizes)
    detections = images * args.detections
    pickled, objects = sum(s[1] for s in sizes), sum(s[2] for s in sizes)
    print(
        f"\n{images} images x {args.detections} detections = {detections:,} on {world_size} rank(s); ", end=""
    )
    print(f"machine load {os.getloadavg()[0]:.2f} (1 min) at the end")
    print("\n| what rank 0 holds for the gathered predictions | GB | bytes / detection |")
    print("|---|---|---|")
    print(f"| pickled for the gather (all ranks) | {pickled / GB:.2f} | {pickled / detections:.0f} |")
    print(f"| Python objects (deep size, extrapolated from {args.sample_images} images per rank) | "
          f"{objects / GB:.2f} | {objects / detections:.0f} |")  # fmt: skip
    print(f"| rank 0's own shard: RSS growth while building it | {sizes[0][3]:.2f} | "
          f"{sizes[0][3] * GB / (sizes[0][0] * args.detections):.0f} |")  # fmt: skip
    gather_rss = max(row[4] for row in rows if row[0].startswith("gather"))
    print(f"| unpickled by the gather on rank 0 (RSS growth) | {gather_rss - rss_before:.2f} | "
          f"{(gather_rss - rss_before) * GB / detections:.0f} |")  # fmt: skip
    print(f"| RSS of rank 0 before evaluate() | {rss_before:.2f} | |")
    if args.ap_fixed:
        top_k = [s[4] / GB for s in sizes]
        print(f"| top K per category ({args.ap_fixed}), pickled: each rank's / all | "
              f"{' + '.join(f'{t:.3f}' for t in top_k)} / {sum(top_k):.3f} | |")  # fmt: skip
    print(f"\nrank 0 built its {sizes[0][0]} images in {build_seconds:.1f} s (synthetic RLEs); ", end="")
    if process_seconds:
        print(f"real process() on decoded masks: {np.mean(process_seconds):.2f} s / image")
    print("\n| phase on rank 0 | calls | seconds | CPU seconds | RSS after, GB | peak RSS during, GB |")
    print("|---|---|---|---|---|---|")
    for name, calls, seconds, cpu, rss, peak in rows:
        print(f"| {name} | {calls} | {seconds:.1f} | {cpu:.1f} | {rss:.2f} | {peak:.2f} |")
    print("\nmetrics:", {task: {k: round(v, 3) for k, v in m.items()} for task, m in results.items()})


# ---------------------------------------------------------------------------------------------- main
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=20000, help="val images (LVIS v1 val: 19,809)")
    parser.add_argument("--detections", type=int, default=300, help="detections per image (LVIS: 300)")
    parser.add_argument("--categories", type=int, default=1203)
    parser.add_argument("--ap-fixed", type=int, default=0, help="K of AP-fixed / AP-pool; 0: off")
    parser.add_argument("--no-fixed-metrics", dest="fixed_metrics", action="store_false",
                        help="with --ap-fixed: stop after the top K's gather, merge and cut (no evaluate_fixed_ap)")  # fmt: skip
    parser.add_argument("--standard-detections", type=int, default=300,
                        help="with --ap-fixed: each image's best detections kept for the standard metrics")  # fmt: skip
    parser.add_argument("--world-size", type=int, default=2, help="gloo processes; 1: no process group")
    parser.add_argument("--counts", default=DEFAULT_COUNTS, help="LVIS v1 category image counts json")
    parser.add_argument("--check-images", type=int, default=2, help="images also run through process()")
    parser.add_argument("--sample-images", type=int, default=50, help="images per rank measured by deep size")
    parser.add_argument("--no-write-results", dest="write_results", action="store_false",
                        help="skip lvis_instances_results.json (the recipes write it)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the workdir (ground truth, results json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="benchmark_eval_memory_")
    os.makedirs(args.workdir, exist_ok=True)
    try:
        start = time.perf_counter()
        data = make_ground_truth(args.images, load_categories(args.counts, args.categories), args.seed)
        json_file = os.path.join(args.workdir, "ground_truth.json")
        with open(json_file, "w") as f:
            json.dump(data, f)
        print(f"ground truth: {len(data['images'])} images, {len(data['annotations'])} instances, "
              f"{len(data['categories'])} categories, {os.path.getsize(json_file) / GB:.2f} GB json, "
              f"{time.perf_counter() - start:.0f} s")  # fmt: skip
        del data
        if args.world_size == 1:
            run_rank(0, 1, 0, args, json_file)
        else:
            mp.spawn(run_rank, args=(args.world_size, free_port(), args, json_file), nprocs=args.world_size)
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
