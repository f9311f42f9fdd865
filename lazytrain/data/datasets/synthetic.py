"""`synthetic_lt`: the embedded long-tailed instance-segmentation data set, written as real files.

30 categories (6 shapes x 5 colours) on grey, lightly tinted and textured backgrounds, in 192 px JPEG images
with 1-6 non-overlapping, nearly upright (+-15 degrees) instances each (the defaults). The train split is
long-tailed like LVIS: the categories are split 8 rare / 12 common / 10 frequent (27 / 40 / 33 %; LVIS v1 has
28 / 38 / 34 %), with train image counts following a power law inside each bucket (for 1000 train images: rare
1-10, common 11-100, frequent 101-550, LVIS's thresholds). The rare categories are spread over colours and
shapes, at most two of any one colour or shape, so that learning them is not mostly telling apart the shapes
of one colour. In val every category appears in `val_images_per_category` images (1-2 instances each), so
per-category AP is measurable.

`CLUTTERED_STYLE` is a harder look, kept as an option: image sides of 128-320 px, multi-hue textured
backgrounds, unannotated grey clutter, up to 8 instances in any orientation, stronger colour drift, and
occlusion (later instances partly cover earlier ones, whose visible parts are annotated exactly). Why two
looks: a detector trained from random init for a few hundred iterations on 2 CPU cores learns the default
set well enough to show the long-tail effect (docs/results.md); the cluttered set needs several times longer.
`lazytrain.data.datasets.synthetic_images` draws each image; this module plans the categories of every image
and writes the data set.

The json files are LVIS v1 format (categories with ``frequency`` and ``image_count`` counted on the generated
train split; images with ``neg_category_ids`` listing every absent category, because the set is exhaustively
annotated, and ``not_exhaustive_category_ids: []``; annotations with polygons, ``area`` and ``bbox``), plus
``file_name`` and ``iscrowd`` so `load_coco_json` reads them too. Output is identical for a seed whatever the
number of worker processes, and it appears atomically (temporary directory + rename).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np

from lazytrain.data.datasets.synthetic_images import COLORS, SHAPES, draw_image

__all__ = [
    "CATEGORY_NAMES",
    "CLUTTERED_STYLE",
    "generate_synthetic_lt",
    "is_complete",
    "synthetic_category_plan",
]

logger = logging.getLogger(__name__)

CATEGORY_NAMES = [f"{color}_{shape}" for shape in SHAPES for color in COLORS]  # json id = index + 1
BUCKETS = (
    ("r", 8, 1, 10),
    ("c", 12, 11, 100),
    ("f", 10, 101, 550),
)  # bucket, categories, train images at 1000
MARKER = "synthetic_lt.json"
_FORMAT_VERSION = 4
_STYLE_KEYS = ("size_range", "textured_background", "clutter", "occlusion", "color_jitter", "max_rotation")
CLUTTERED_STYLE = dict(
    size_range=(128, 320),
    max_instances=8,
    textured_background=True,
    clutter=3,
    occlusion=True,
    color_jitter=25,
    max_rotation=180,
)
"""The harder look: varied image sizes, multi-hue textured backgrounds, unannotated grey clutter, occlusion and
stronger colour drift. ``generate_synthetic_lt(root, **CLUTTERED_STYLE)``."""


def synthetic_category_plan(num_train: int, seed: int = 0) -> list[dict]:
    """Per category (sorted by json id): ``id``, ``name``, ``frequency`` bucket and planned ``train_images``.

    Buckets are assigned to a seed-dependent random permutation of the categories; the image counts are
    LVIS's bucket ranges scaled by ``num_train / 1000``, spaced geometrically (a power law) within a bucket.
    The rare categories are spread over colours and shapes (at most two of any one), so that no colour or
    shape marks a category as rare: LVIS's rare categories are not one look either.
    """
    rng = np.random.default_rng([seed, 7])
    order = rng.permutation(len(CATEGORY_NAMES))
    while not _spread_over_looks(order[: BUCKETS[0][1]]):  # ~10% of permutations pass
        order = rng.permutation(len(CATEGORY_NAMES))
    scale = num_train / 1000
    plan, position = [], 0
    for frequency, count, low, high in BUCKETS:
        low, high = max(1.0, low * scale), max(1.0, high * scale)
        for k in range(count):
            images = low * (high / low) ** (k / max(count - 1, 1))
            category = int(order[position]) + 1
            plan.append(
                {
                    "id": category,
                    "name": CATEGORY_NAMES[category - 1],
                    "frequency": frequency,
                    "train_images": min(num_train, max(1, round(images))),
                }
            )
            position += 1
    return sorted(plan, key=lambda c: c["id"])


def _spread_over_looks(indices: np.ndarray) -> bool:
    """Whether the categories at `indices` (0-based) are spread as evenly as they can be over colours and over
    shapes (8 categories: at most two of one colour and two of one shape)."""
    colors = np.bincount(indices % len(COLORS), minlength=len(COLORS))
    shapes = np.bincount(indices // len(COLORS), minlength=len(SHAPES))
    return colors.max() <= -(-len(indices) // len(COLORS)) and shapes.max() <= -(-len(indices) // len(SHAPES))


def _assign_categories(
    rng: np.random.Generator, num_images: int, counts: dict[int, int], max_instances: int
) -> list[list[int]]:
    """Instances (category ids in drawing order) per image: category c goes to counts[c] distinct images, with
    1 or 2 instances each; images left empty get one instance of a frequent category (drawn in proportion to
    counts)."""
    per_image: list[list[int]] = [[] for _ in range(num_images)]
    for category, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        free = np.array([i for i in range(num_images) if len(per_image[i]) < max_instances], dtype=np.int64)
        chosen = rng.choice(free, size=min(count, len(free)), replace=False) if len(free) else []
        doubles = rng.random(len(chosen)) < 0.25
        for index, double in zip(chosen, doubles):
            room = max_instances - len(per_image[index])
            per_image[index].extend([category] * min(room, 2 if double else 1))
    top = max(counts.values())  # fill from the frequent end only, so bucket boundaries keep their meaning
    ids = np.array(sorted(c for c, n in counts.items() if n * 5 >= top))
    weights = np.array([counts[c] for c in ids], dtype=np.float64)
    for categories in per_image:
        if not categories:
            categories.append(int(rng.choice(ids, p=weights / weights.sum())))
        rng.shuffle(categories)
    return per_image


# ------------------------------------------------------------------------------------------------ writing
def _render_image(task: tuple) -> tuple[dict, list[dict]]:
    """Draw one image and write it; returns its json entry and its annotations (without ids)."""
    root, split, index, seed, categories, style = task
    size_range = style["size_range"]
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, index])
    long_side = int(rng.integers(size_range[0], size_range[1] + 1))
    short_side = int(rng.integers(size_range[0], long_side + 1))
    width, height = (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)
    image, annotations = draw_image(rng, categories, width, height, style)
    file_name = f"{split}/{index:06d}.jpg"
    image.save(os.path.join(root, file_name), quality=90)
    return {"file_name": file_name, "width": width, "height": height}, annotations


def _map_tasks(tasks: list[tuple], workers: int) -> Iterator[tuple[dict, list[dict]]]:
    if workers <= 1 or len(tasks) < 64:
        yield from map(_render_image, tasks)
        return
    # spawn: safe even when the caller has threads (trainer, tqdm); a worker only imports this module's imports.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        yield from pool.map(_render_image, tasks, chunksize=16)


def _write_dataset(root: str, num_train: int, num_val: int, seed: int, options: dict, workers: int) -> None:
    from tqdm import tqdm

    plan = synthetic_category_plan(num_train, seed)
    counts = {
        "train": {c["id"]: c["train_images"] for c in plan},
        "val": {c["id"]: min(options["val_images_per_category"], num_val) for c in plan},
    }
    sizes = {"train": num_train, "val": num_val}
    tasks = []
    for split_code, split in enumerate(("train", "val")):
        os.makedirs(os.path.join(root, split))
        rng = np.random.default_rng([seed, split_code, 2**31])
        assignment = _assign_categories(rng, sizes[split], counts[split], options["max_instances"])
        style = {key: options[key] for key in _STYLE_KEYS}
        tasks += [(root, split, i, seed, cats, style) for i, cats in enumerate(assignment)]
    results = []
    with tqdm(total=len(tasks), desc="generating synthetic_lt", unit="img", mininterval=1.0) as progress:
        for result in _map_tasks(tasks, workers):
            results.append(result)
            progress.update(1)
    splits = {"train": results[:num_train], "val": results[num_train:]}
    categories = _categories_json(plan, splits["train"])
    all_ids = {c["id"] for c in plan}
    for split_code, (split, entries) in enumerate(splits.items()):
        images, annotations = [], []
        for index, (entry, anns) in enumerate(entries):
            image_id = index + 1 + split_code * 1_000_000
            present = {a["category_id"] for a in anns}
            images.append(
                {
                    "id": image_id,
                    **entry,
                    "neg_category_ids": sorted(all_ids - present),
                    "not_exhaustive_category_ids": [],
                }
            )
            for ann in anns:
                annotations.append(
                    {"id": split_code * 10_000_000 + len(annotations) + 1, "image_id": image_id, **ann}
                )
        content = {
            "info": {"description": f"synthetic_lt {split} (lazytrain), seed {seed}"},
            "licenses": [],
            "categories": categories,
            "images": images,
            "annotations": annotations,
        }
        with open(os.path.join(root, f"lvis_v1_{split}.json"), "w") as f:
            json.dump(content, f, separators=(",", ":"))


def _categories_json(plan: list[dict], train: list[tuple[dict, list[dict]]]) -> list[dict]:
    image_count = {c["id"]: 0 for c in plan}
    instance_count = dict(image_count)
    for _, anns in train:
        for category in {a["category_id"] for a in anns}:
            image_count[category] += 1
        for a in anns:
            instance_count[a["category_id"]] += 1
    return [
        {
            "id": c["id"],
            "name": c["name"],
            "synset": c["name"],
            "def": c["name"].replace("_", " "),
            "frequency": c["frequency"],
            "image_count": image_count[c["id"]],
            "instance_count": instance_count[c["id"]],
        }
        for c in plan
    ]


def is_complete(root: str) -> bool:
    """Whether `root` holds a finished data set (both json files; they are written last)."""
    return all(os.path.isfile(os.path.join(root, f"lvis_v1_{split}.json")) for split in ("train", "val"))


def _check_settings(root: str, settings: dict) -> None:
    try:
        with open(os.path.join(root, MARKER)) as f:
            existing = json.load(f)
    except (OSError, ValueError):
        existing = None
    if existing != settings:
        logger.warning(
            "Using the synthetic_lt data set already at %s, made with settings %s (asked for %s); delete the "
            "folder to regenerate it.",
            root,
            existing,
            settings,
        )


def generate_synthetic_lt(
    root: str,
    num_train: int = 1000,
    num_val: int = 250,
    seed: int = 0,
    *,
    size_range: tuple[int, int] = (192, 192),
    val_images_per_category: int = 20,
    max_instances: int = 6,
    textured_background: bool = False,
    clutter: int = 0,
    occlusion: bool = False,
    color_jitter: int = 10,
    max_rotation: float = 15,
    workers: int = 1,
) -> str:
    """Write the data set into `root` unless it is already there: ``train/*.jpg``, ``val/*.jpg``,
    ``lvis_v1_train.json``, ``lvis_v1_val.json`` and the settings in ``synthetic_lt.json``.

    Safe when several processes call it at once (e.g. every rank on first use): `root` appears atomically
    and complete, and the processes that lose the race use the winner's copy (see `_reuse_or_generate`).

    Args:
        root: output directory (its parent is created if needed).
        num_train: number of train images.
        num_val: number of val images.
        seed: the output (json and image bytes) is a function of the seed and the settings only.
        size_range: smallest and largest image side in pixels.
        val_images_per_category: val images each category appears in (at most `num_val`).
        max_instances: most instances in one image.
        textured_background: multi-hue textured backgrounds instead of grey fields with a mild tint.
        clutter: up to this many unannotated grey ellipses per image.
        occlusion: let later instances cover up to half of earlier ones (the visible parts are annotated);
            without it instances never overlap.
        color_jitter: each instance's colour drifts by up to this much per channel (0-255 scale).
        max_rotation: instances are turned by up to this many degrees either way (180: any orientation).
        workers: processes drawing images (the output does not depend on it). One is the default: two
            spawned workers were slower than one on a 2-core machine (docs/benchmarks.md).

    Returns:
        `root` as an absolute path.
    """
    root = os.path.abspath(root)
    _check_arguments(num_train, num_val, size_range, max_instances)
    settings = {
        "version": _FORMAT_VERSION,
        "num_train": num_train,
        "num_val": num_val,
        "seed": seed,
        "size_range": list(size_range),
        "val_images_per_category": val_images_per_category,
        "max_instances": max_instances,
        "textured_background": bool(textured_background),
        "clutter": int(clutter),
        "occlusion": bool(occlusion),
        "color_jitter": int(color_jitter),
        "max_rotation": float(max_rotation),
    }
    return _reuse_or_generate(root, settings, workers)


def _check_arguments(num_train: int, num_val: int, size_range: tuple[int, int], max_instances: int) -> None:
    if min(size_range) < 32 or size_range[0] > size_range[1]:
        raise ValueError(
            f"generate_synthetic_lt(size_range=) must be (min, max) with 32 <= min <= max; got {size_range}"
        )
    if num_train < 1 or num_val < 1 or max_instances < 2:
        raise ValueError(
            "generate_synthetic_lt: num_train and num_val must be >= 1 and max_instances >= 2; got "
            f"{num_train}, {num_val}, {max_instances}"
        )


def _reuse_or_generate(root: str, settings: dict, workers: int) -> str:
    """Use the data set already at `root` (warning when it was made with other `settings`), or generate it.

    Each caller writes into its own temporary directory beside `root` and renames it into place; the rename
    is atomic, so `root` is either absent or complete, and the callers that lose the race discard their copy
    and use the winner's.
    """
    if is_complete(root):
        _check_settings(root, settings)
        return root
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.tmp-", dir=parent)
    try:
        num_train, num_val = settings["num_train"], settings["num_val"]
        logger.info("Generating synthetic_lt into %s (%d train, %d val images)", root, num_train, num_val)
        _write_dataset(tmp, num_train, num_val, settings["seed"], settings, workers)
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump(settings, f)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        _rename_into_place(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _rename_into_place(tmp: str, root: str) -> None:
    """Rename the finished `tmp` to `root`; losing the race to another process that finished first is fine."""
    try:
        os.rename(tmp, root)
    except OSError as e:
        if not is_complete(root):
            raise OSError(
                f"generate_synthetic_lt: {root} exists but holds no complete data set (no lvis_v1_train.json "
                "and lvis_v1_val.json); delete it and retry"
            ) from e
        logger.info("Another process finished %s first; using its copy", root)
