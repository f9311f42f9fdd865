"""The data set at LVIS scale: what loading it costs each rank, with the annotation cache (warm and cold) and
with the plain loader.

    python scripts/benchmark_dataset_scale.py --root /tmp/lvis_like                 # LVIS v1 size, 100k images
    python scripts/benchmark_dataset_scale.py --root /tmp/lvis_like --scale 0.1     # 10k images, quick
    python scripts/benchmark_dataset_scale.py --root /tmp/lvis_x4 --scale 4         # 400k images

Generates, unless already there, an LVIS-v1-shaped data set under ROOT in the built-in layout
(``lvis/lvis_v1_train.json``, images under ``coco/train2017``): the 1203 LVIS v1 categories, category c in
round(image_count_c * scale) images drawn at random (its real train image count at scale 1, from
../shared/data/lvis_v1_category_image_count.json), 1 + a geometric number of instances per (image,
category) (mean 3.3, as LVIS's 1.27M annotations over 361k image-category pairs), each a polygon of 16-80
points in its box, and the images as links to one landscape and one portrait JPEG.

Then the content key's cost: hashing the whole json (the annotation cache's key) with sha256, which it uses,
and blake2b, the page cache warm, as a share of the typed parse it saves.

Then, for 1, 2 and 4 ranks (processes started at once, as a launcher's ranks) with 2 loader workers each,
cold (no cache file) and warm (the file present), and with the plain loader (`--plain`): each rank loads the
data set as the LVIS recipe does (`get_detection_dataset_dicts`, the RFS sampler from the records or the
arrays, the train loader with a 256 px mapper) and takes its first batch. Printed per case: time from start to
the slowest rank's first batch, peak PSS summed over all ranks and workers (``/proc/PID/smaps_rollup``,
sampled every 50 ms), and each rank's private memory for the data set (private bytes after building the data
set, sampler and loader minus before). Columns: the slowest rank's import time, its time to build the data set,
sampler and loader, and its time from start to the first batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import shutil
import subprocess
import sys
import time

import msgspec
import numpy as np

LVIS_V1_TRAIN_IMAGES = 100170
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COUNTS = os.path.join(REPO_ROOT, "..", "shared", "data", "lvis_v1_category_image_count.json")
SIZES = {"landscape.jpg": (480, 640), "portrait.jpg": (640, 480)}  # (height, width)


def _write_base_images(folder: str) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, (height, width) in SIZES.items():
        pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, name), quality=90)


def _pairs(counts: np.ndarray, num_images: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(image, category index) pairs, category c in round(counts[c] * scale) distinct images."""
    images, categories = [], []
    for category, count in enumerate(counts):
        chosen = rng.choice(num_images, min(int(count), num_images), replace=False)
        images.append(chosen)
        categories.append(np.full(len(chosen), category))
    return np.concatenate(images), np.concatenate(categories)


def _annotation_chunks(rng, images, categories, sizes, category_ids, chunk=20000):
    """The annotations, image by image, in lists of about `chunk` dicts (vectorised per list)."""
    instances = rng.geometric(0.3, len(images))  # >= 1 per (image, category), mean 3.3
    order = np.argsort(images, kind="stable")
    owner = np.repeat(images[order], instances[order])
    category = np.repeat(categories[order], instances[order])
    heights, widths = sizes[owner, 0], sizes[owner, 1]
    next_id = 1
    for start in range(0, len(owner), chunk):
        part = slice(start, start + chunk)
        count = len(owner[part])
        w = rng.uniform(8, widths[part] / 2)
        h = rng.uniform(8, heights[part] / 2)
        boxes = np.stack(
            [rng.uniform(0, widths[part] - w), rng.uniform(0, heights[part] - h), w, h], 1
        ).round(2)
        points = rng.integers(16, 81, count)
        bounds = np.concatenate([[0], np.cumsum(points)])
        angles = rng.uniform(0, 2 * math.pi, bounds[-1])
        angles = np.sort(angles + 2 * math.pi * np.repeat(np.arange(count), points)) % (2 * math.pi)
        radius = rng.uniform(0.6, 1.0, bounds[-1])
        box_of_point = np.repeat(boxes, points, axis=0)
        xs = box_of_point[:, 0] + box_of_point[:, 2] / 2 * (1 + np.cos(angles) * radius)
        ys = box_of_point[:, 1] + box_of_point[:, 3] / 2 * (1 + np.sin(angles) * radius)
        coordinates = np.stack([xs, ys], 1).round(2).ravel().tolist()
        annotations = []
        for i in range(count):
            annotations.append(
                {
                    "id": next_id + i,
                    "image_id": int(owner[start + i]) + 1,
                    "category_id": category_ids[int(category[start + i])],
                    "bbox": boxes[i].tolist(),
                    "area": round(float(w[i] * h[i]), 2),
                    "segmentation": [coordinates[2 * bounds[i] : 2 * bounds[i + 1]]],
                }
            )
        next_id += count
        yield annotations


def _image_entries(rng, root, names, sizes, category_ids) -> list[dict]:
    folder = os.path.join(root, "coco", "train2017")
    os.makedirs(folder, exist_ok=True)
    _write_base_images(root)
    entries = []
    for index, name in enumerate(names):
        file_name = f"{index + 1:012d}.jpg"
        os.symlink(os.path.join(root, name), os.path.join(folder, file_name))
        entries.append(
            {
                "id": index + 1,
                "file_name": f"train2017/{file_name}",
                "height": int(sizes[index, 0]),
                "width": int(sizes[index, 1]),
                "neg_category_ids": rng.choice(category_ids, 3, replace=False).tolist(),
                "not_exhaustive_category_ids": [],
            }
        )
    return entries


def generate(root: str, scale: float, counts_file: str, seed: int = 0) -> str:
    """Write the LVIS-shaped train json and its image links under `root` (unless present); its path."""
    json_file = os.path.join(root, "lvis", "lvis_v1_train.json")
    if os.path.exists(json_file):
        return json_file
    with open(counts_file) as f:
        categories = json.load(f)
    num_images = round(LVIS_V1_TRAIN_IMAGES * scale)
    rng = np.random.default_rng(seed)
    counts = np.round(np.array([c["image_count"] for c in categories]) * scale).clip(1)
    images, category_index = _pairs(counts, num_images, rng)
    names = rng.choice(list(SIZES), num_images, p=[0.7, 0.3])
    sizes = np.array([SIZES[name] for name in names])
    category_ids = [c["id"] for c in categories]
    os.makedirs(os.path.dirname(json_file), exist_ok=True)
    temporary = json_file + ".partial"
    with open(temporary, "wb") as f:  # streamed: the annotations never exist as Python objects at once
        f.write(b'{"images": ')
        f.write(msgspec.json.encode(_image_entries(rng, root, names, sizes, category_ids)))
        f.write(b', "categories": ' + msgspec.json.encode(categories) + b', "annotations": [')
        separator = b""
        for chunk in _annotation_chunks(rng, images, category_index, sizes, category_ids):
            f.write(separator + msgspec.json.encode(chunk)[1:-1])
            separator = b","
        f.write(b"]}")
    os.replace(temporary, json_file)
    return json_file


def _private_bytes(pid: int | str = "self") -> int:
    """Private (unshared) resident bytes of a process: what it holds that no other process shares."""
    fields = _smaps_rollup(pid)
    return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def _smaps_rollup(pid: int | str) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            lines = f.read().splitlines()[1:]
    except OSError:  # the process ended
        return {}
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.endswith("kB")}


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            children = []
        found += children
        stack += children
    return found


def run_rank(rank: int, world_size: int, plain: bool, start: float) -> None:
    """One rank: the LVIS recipe's train data (records, RFS sampler, loader with 2 workers, 256 px), first batch."""
    from lazytrain.data.build import build_detection_train_loader, get_detection_dataset_dicts
    from lazytrain.data.catalog import DatasetCatalog
    from lazytrain.data.datasets.builtin import get_annotation_source
    from lazytrain.data.datasets.lvis import load_lvis_json
    from lazytrain.data.mappers import DatasetMapper
    from lazytrain.data.samplers import RepeatFactorTrainingSampler
    from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge

    name = "lvis_v1_train"
    if plain:  # the loader before the cache: each rank parses the json and serializes its own records
        source = get_annotation_source(name)
        name = "plain_lvis_v1_train"
        DatasetCatalog.register(name, lambda: load_lvis_json(source.json_file, source.image_root, name))
    before, imported = _private_bytes(), time.time()
    dataset = get_detection_dataset_dicts(name)
    sampler = RepeatFactorTrainingSampler.from_dataset_dicts(
        dataset, repeat_thresh=0.001, seed=0, rank=rank, world_size=world_size
    )
    mapper = DatasetMapper(
        is_train=True,
        augmentations=[ResizeShortestEdge([256], max_size=512, sample_style="choice"), RandomFlip()],
    )
    loader = build_detection_train_loader(
        dataset, mapper=mapper, sampler=sampler, total_batch_size=2, num_workers=2, seed=0
    )
    loaded = time.time() - imported
    private = _private_bytes() - before
    batches = iter(loader)
    next(batches)
    report = {
        "rank": rank,
        "imported": imported - start,
        "loaded": loaded,
        "first_batch": time.time() - start,
        "private": private,
    }
    print(json.dumps(report), flush=True)
    sys.stdin.readline()  # alive, workers included, until the parent has measured


def _sample_pss(pids: list[int]) -> int:
    every = {p for pid in pids for p in (pid, *_descendants(pid))}
    return sum(_smaps_rollup(pid).get("Pss", 0) for pid in every)


def run_case(world_size: int, plain: bool, root: str) -> dict:
    """Start `world_size` ranks at once; their reports and the peak PSS summed over them and their workers."""
    start = time.time()
    command = [sys.executable, __file__, "--rank-of", str(world_size), "--start", repr(start)]
    ranks = [
        subprocess.Popen(
            [*command, "--rank", str(rank), *(["--plain"] if plain else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "LAZYTRAIN_DATASETS": root, "LAZYTRAIN_CACHE": os.path.join(root, "cache")},
        )
        for rank in range(world_size)
    ]
    peak, reports = 0, []
    selector = selectors.DefaultSelector()
    pending = {process.stdout.fileno(): b"" for process in ranks}
    for process in ranks:
        selector.register(process.stdout.fileno(), selectors.EVENT_READ)
    while len(reports) < world_size:
        peak = max(peak, _sample_pss([p.pid for p in ranks]))
        for key, _ in selector.select(timeout=0.05):
            # Raw reads, kept until a whole line is there: a non-blocking readline can return half a report.
            pending[key.fd] += os.read(key.fd, 65536)
            *lines, pending[key.fd] = pending[key.fd].split(b"\n")
            reports += [json.loads(line) for line in lines if line.strip().startswith(b"{")]
        if any(p.poll() not in (None, 0) for p in ranks):
            raise RuntimeError("a rank failed; run one with --rank 0 --rank-of 1 to see why")
    peak = max(peak, _sample_pss([p.pid for p in ranks]))
    for process in ranks:
        process.stdin.write(b"\n")
        process.stdin.flush()
        process.wait()
    return {"reports": reports, "peak_pss": peak}


PARSERS = {
    "json.load": "json.load(open(JSON))",
    "msgspec.json.decode (untyped)": "msgspec.json.decode(open(JSON, 'rb').read())",
    "load_lvis_json (plain records)": "load_lvis_json(JSON, ROOT)",
    "cache file written (typed decode)": "load_cached_json(JSON, ROOT, lvis=True)",
}


def measure_parse(parser: str, json_file: str, image_root: str) -> None:
    """One parser in this process: its wall time and the process's peak RSS, as one JSON line."""
    import resource

    import msgspec  # noqa: F401  (the parsers' names)

    from lazytrain.data.datasets.cached_records import load_cached_json  # noqa: F401
    from lazytrain.data.datasets.lvis import load_lvis_json  # noqa: F401

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    eval(PARSERS[parser], {**globals(), **locals(), "JSON": json_file, "ROOT": image_root})
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak": peak, "before": before}))


def print_parse_table(root: str, json_file: str, plain: bool) -> None:
    """Each parser in a fresh process (the cache folder emptied first): time and peak RSS; the plain records
    (the most memory) only with `plain`."""
    print("| parse of the train json, 1 process | time (s) | peak RSS (GiB) | RSS before (GiB) |")
    print("|---|---|---|---|")
    cache = os.path.join(root, "cache")
    env = {**os.environ, "LAZYTRAIN_CACHE": cache}
    for parser in PARSERS:
        if parser.startswith("load_lvis_json") and not plain:
            continue
        shutil.rmtree(cache, ignore_errors=True)
        command = [sys.executable, __file__, "--parse", parser, "--json", json_file, "--image-root", root]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {parser} | {result['seconds']:.1f} | {result['peak'] / 2**30:.2f} | "
            f"{result['before'] / 2**30:.2f} |",
            flush=True,
        )


def measure_content_key(json_file: str) -> dict[str, float]:
    """Seconds to hash the whole json with sha256 (the cache key's, `annotation_cache.hash_file`) and blake2b,
    after one read that brings it into the page cache (a rank that finds a warm file hashes a cached json)."""
    import hashlib
    import mmap

    seconds = {}
    with open(json_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        hashlib.sha1(mapped).digest()  # the read into the page cache
        for name in ("sha256", "blake2b"):
            start = time.perf_counter()
            hashlib.new(name, mapped).digest()
            seconds[name] = time.perf_counter() - start
    return seconds


def _row(label: str, world_size: int, case: dict) -> str:
    reports = case["reports"]
    first = max(r["first_batch"] for r in reports)
    imported = max(r["imported"] for r in reports)
    loaded = max(r["loaded"] for r in reports)
    private = max(r["private"] for r in reports) / 2**20
    return (
        f"| {label} | {world_size} | {imported:.1f} | {loaded:.1f} | {first:.1f} | "
        f"{case['peak_pss'] / 2**30:.2f} | {private:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", help="folder of the generated data set")
    parser.add_argument("--scale", type=float, default=1.0, help="images as a multiple of LVIS v1 train")
    parser.add_argument("--counts", default=DEFAULT_COUNTS)
    parser.add_argument("--ranks", default="1,2,4", help="rank counts to run, comma-separated")
    parser.add_argument(
        "--no-plain",
        action="store_true",
        help="skip the plain loader's rows (each rank holds GBs at LVIS size)",
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a rank process started by this script
    parser.add_argument("--rank-of", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parse", help=argparse.SUPPRESS)  # one parser's measurement, in its own process
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--image-root", help=argparse.SUPPRESS)
    parser.add_argument("--no-parse-table", action="store_true", help="skip the parsers' table")
    args = parser.parse_args()
    if args.rank is not None:
        return run_rank(args.rank, args.rank_of, args.plain, args.start)
    if args.parse is not None:
        return measure_parse(args.parse, args.json, args.image_root)
    if not args.root:
        parser.error("--root is required")
    start = time.perf_counter()
    json_file = generate(args.root, args.scale, args.counts)
    print(f"{json_file}: {os.path.getsize(json_file) / 2**20:.0f} MiB ({time.perf_counter() - start:.0f} s)")
    key = measure_content_key(json_file)
    mib = os.path.getsize(json_file) / 2**20
    print(
        "content key: "
        + ", ".join(f"{name} {seconds:.2f} s ({mib / seconds:.0f} MiB/s)" for name, seconds in key.items()),
        flush=True,
    )
    if not args.no_parse_table:
        print_parse_table(args.root, json_file, plain=not args.no_plain)
    print(
        "| loader | ranks | imports (s) | data set, sampler, loader built (s) | first batch from start (s) | "
        "peak PSS, all processes (GiB) | private per rank for the data set (MiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    cache = os.path.join(args.root, "cache")
    for world_size in (int(n) for n in args.ranks.split(",")):
        shutil.rmtree(cache, ignore_errors=True)
        print(_row("cache, cold", world_size, run_case(world_size, False, args.root)), flush=True)
        print(_row("cache, warm", world_size, run_case(world_size, False, args.root)), flush=True)
        if not args.no_plain:
            print(_row("plain (before)", world_size, run_case(world_size, True, args.root)), flush=True)


if __name__ == "__main__":
    main()
