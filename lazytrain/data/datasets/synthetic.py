"""`synthetic_lt`: the embedded long-tailed instance-segmentation data set, written as real files.

30 categories (6 shapes x 5 colours) on grey, lightly tinted and textured backgrounds, in 192 px JPEG images
with 1-6 non-overlapping, nearly upright (+-15 degrees) instances each (the defaults). The train split is
long-tailed like LVIS: the categories are split 8 rare / 12 common / 10 frequent (27 / 40 / 33 %; LVIS v1 has
28 / 38 / 34 %), with train image counts following a power law inside each bucket (for 1000 train images: rare
1-10, common 11-100, frequent 101-550, LVIS's thresholds). The rare categories are spread over colours and
shapes, at most two of any one colour or shape (format version 4; in version 3's draw four of the six green
shapes were rare, so that learning the rare categories was mostly telling green shapes apart). In val every
category appears in `val_images_per_category` images (1-2 instances each), so per-category AP is measurable.

`CLUTTERED_STYLE` is the harder look (format version 2, kept as an option): image sides of 128-320 px,
multi-hue textured backgrounds, unannotated grey clutter, up to 8 instances in any orientation, stronger
colour drift, and occlusion: instances are drawn in order, later ones on top, and a placement is rejected when it would leave
an earlier instance less than half visible. Each shape is a union of convex parts, so the visible region of
an occluded instance is computed exactly by clipping its convex parts against the convex parts of the shapes
drawn over it; its segmentation is the resulting list of convex polygons (their union is the visible region,
matching the pixels up to rasterization). Unoccluded instances have their outline as one polygon. Why two
looks: a detector trained from random init for a few hundred iterations on 2 CPU cores learns the default
set well enough to show the long-tail effect (docs/results.md); the cluttered set needs several times longer.

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
import math
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "CATEGORY_NAMES",
    "CLUTTERED_STYLE",
    "generate_synthetic_lt",
    "is_complete",
    "synthetic_category_plan",
]

logger = logging.getLogger(__name__)

SHAPES = ("circle", "square", "triangle", "star", "cross", "hexagon")
COLORS = {
    "red": (215, 45, 40),
    "green": (45, 170, 70),
    "blue": (50, 85, 215),
    "yellow": (235, 205, 45),
    "magenta": (195, 55, 195),
}
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
"""The harder look of format version 2: varied image sizes, multi-hue textured backgrounds, unannotated grey
clutter, occlusion and stronger colour drift. ``generate_synthetic_lt(root, **CLUTTERED_STYLE)``."""
_MIN_VISIBLE_FRACTION = 0.5

Polygon = list[tuple[float, float]]


# ---------------------------------------------------------------------------------------------- geometry
def _regular(count: int, radius: float = 1.0, phase: float = -math.pi / 2) -> Polygon:
    return [
        (
            radius * math.cos(phase + 2 * math.pi * k / count),
            radius * math.sin(phase + 2 * math.pi * k / count),
        )
        for k in range(count)
    ]


def _box(x0: float, y0: float, x1: float, y1: float) -> Polygon:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _unit_shape(shape: str) -> tuple[Polygon, list[Polygon]]:
    """The outline of `shape` (radius about 1, centred at 0) and convex parts that tile it exactly."""
    if shape == "circle":
        outline = _regular(20)
    elif shape == "square":
        outline = _box(-0.7, -0.7, 0.7, 0.7)
    elif shape == "triangle":
        outline = _regular(3)
    elif shape == "hexagon":
        outline = _regular(6, phase=0.0)
    elif shape == "star":
        tips, inner = _regular(5), _regular(5, 0.45, -math.pi / 2 + math.pi / 5)
        outline = [point for k in range(5) for point in (tips[k], inner[k])]
        return outline, [inner] + [[inner[k - 1], tips[k], inner[k]] for k in range(5)]
    else:  # cross
        a, b = 0.28, 0.95
        outline = [
            (-a, -b),
            (a, -b),
            (a, -a),
            (b, -a),
            (b, a),
            (a, a),
            (a, b),
            (-a, b),
            (-a, a),
            (-b, a),
            (-b, -a),
            (-a, -a),
        ]
        return outline, [_box(-a, -b, a, b), _box(-b, -a, -a, a), _box(a, -a, b, a)]
    return outline, [outline]


def _area(polygon: Polygon) -> float:
    """Signed shoelace area (positive for the orientation every unit shape above uses)."""
    total = 0.0
    for (x0, y0), (x1, y1) in zip(polygon, polygon[1:] + polygon[:1]):
        total += x0 * y1 - x1 * y0
    return total / 2


def _clip(polygon: Polygon, a: float, b: float, c: float) -> Polygon:
    """The part of a convex polygon where ``a*x + b*y + c >= 0`` (one Sutherland-Hodgman step)."""
    values = [a * x + b * y + c for x, y in polygon]
    out = []
    for i, point in enumerate(polygon):
        j = (i + 1) % len(polygon)
        if values[i] >= 0:
            out.append(point)
        if (values[i] >= 0) != (values[j] >= 0):
            t = values[i] / (values[i] - values[j])
            q = polygon[j]
            out.append((point[0] + t * (q[0] - point[0]), point[1] + t * (q[1] - point[1])))
    return out


def _extent(polygon: Polygon) -> tuple[float, float, float, float]:
    xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
    return min(xs), min(ys), max(xs), max(ys)


def _subtract(piece: Polygon, cutter: Polygon, min_area: float = 0.25) -> list[Polygon]:
    """``piece`` minus ``cutter`` (both convex) as disjoint convex polygons: for each edge of the cutter,
    the part of what is left that lies outside that edge."""
    px0, py0, px1, py1 = _extent(piece)
    cx0, cy0, cx1, cy1 = _extent(cutter)
    if px1 <= cx0 or cx1 <= px0 or py1 <= cy0 or cy1 <= py0:
        return [piece]
    edges = []
    for (x0, y0), (x1, y1) in zip(cutter, cutter[1:] + cutter[:1]):
        a, b = y0 - y1, x1 - x0  # inside the cutter: a*x + b*y + c >= 0
        edges.append((a, b, -(a * x0 + b * y0)))
    overlap = piece
    for a, b, c in edges:
        overlap = _clip(overlap, a, b, c)
        if len(overlap) < 3 or _area(overlap) <= min_area:
            return [piece]  # (almost) no overlap: keep the piece whole rather than split along the edges
    pieces, remaining = [], piece
    for a, b, c in edges:
        outside = _clip(remaining, -a, -b, -c)
        if len(outside) >= 3 and _area(outside) > min_area:
            pieces.append(outside)
        remaining = _clip(remaining, a, b, c)
        if len(remaining) < 3 or _area(remaining) <= 1e-9:
            break
    return pieces


def _subtract_all(pieces: list[Polygon], cutters: list[Polygon]) -> list[Polygon]:
    """Convex `pieces` minus every convex cutter; the same list object when no cutter overlaps them."""
    for cutter in cutters:
        cut = [q for p in pieces for q in _subtract(p, cutter)]
        if len(cut) != len(pieces) or any(a is not b for a, b in zip(cut, pieces)):
            pieces = cut
    return pieces


class _Instance:
    """One object: its outline (for drawing), its convex parts and the convex pieces still visible."""

    def __init__(self, category: int, outline: Polygon, parts: list[Polygon]) -> None:
        self.category = category
        self.outline = outline
        self.parts = parts
        self.visible = parts
        self.area = sum(_area(p) for p in parts)
        self.occluded = False


def _random_instance(
    rng: np.random.Generator, category: int, width: int, height: int, shrink: float, max_rotation: float
) -> _Instance:
    shape = SHAPES[(category - 1) // len(COLORS)]
    outline, parts = _unit_shape(shape)
    radius = rng.uniform(0.08, 0.22) * min(width, height) * shrink
    cx, cy = rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)
    angle = rng.uniform(0, 2 * math.pi)
    if max_rotation < 180:  # the same draw, mapped into [-max_rotation, max_rotation] degrees
        angle = (angle / math.pi - 1) * math.radians(max_rotation)
    cos, sin = math.cos(angle) * radius, math.sin(angle) * radius

    def place(polygon: Polygon) -> Polygon:
        return [(cx + cos * x - sin * y, cy + sin * x + cos * y) for x, y in polygon]

    return _Instance(category, place(outline), [place(p) for p in parts])


def _overlaps(a: _Instance, b: _Instance) -> bool:
    ax0, ay0, ax1, ay1 = _extent(a.outline)
    bx0, by0, bx1, by1 = _extent(b.outline)
    return ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1


def _place_instances(
    rng: np.random.Generator, categories: Sequence[int], width: int, height: int, style: dict
) -> list[_Instance]:
    """Place instances in drawing order. With `occlusion`, reject positions that would hide more than half of
    an earlier instance; without, reject positions whose bounding box meets an earlier one's."""
    placed: list[_Instance] = []
    for category in categories:
        for attempt in range(40 if style["occlusion"] else 100):  # shrinking: 0.95**100 = 0.6% of the size
            candidate = _random_instance(
                rng, category, width, height, shrink=0.95**attempt, max_rotation=style["max_rotation"]
            )
            if not style["occlusion"]:
                if not any(_overlaps(candidate, earlier) for earlier in placed):
                    placed.append(candidate)
                    break
                continue
            updated = []
            for earlier in placed:
                pieces = _subtract_all(earlier.visible, candidate.parts)
                if sum(_area(p) for p in pieces) < _MIN_VISIBLE_FRACTION * earlier.area:
                    break
                updated.append(pieces)
            else:
                for earlier, pieces in zip(placed, updated):
                    if pieces is not earlier.visible:
                        earlier.occluded, earlier.visible = True, pieces
                placed.append(candidate)
                break
        else:
            logger.debug("synthetic_lt: no room for category %d in a %dx%d image", category, width, height)
    return placed


# --------------------------------------------------------------------------------------------- rendering
def _background(rng: np.random.Generator, width: int, height: int, style: dict) -> Image.Image:
    if style["textured_background"]:  # a random colour and multi-hue texture
        base, channels, amplitude = rng.integers(70, 190, size=3), 3, 28
    else:  # a grey field with a mild tint and a grey texture
        base, channels, amplitude = rng.integers(80, 180) + rng.integers(-10, 11, size=3), 1, 12
    coarse = rng.normal(0, amplitude, size=(max(2, height // 24), max(2, width // 24), channels))
    coarse = np.repeat(coarse, 3 // channels, axis=2)
    coarse_image = Image.fromarray(np.clip(coarse + 128, 0, 255).astype(np.uint8))
    texture = np.asarray(coarse_image.resize((width, height), Image.BICUBIC), dtype=np.float32) - 128
    image = Image.fromarray(np.clip(base + texture, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, style["clutter"] + 1))):  # unannotated grey clutter
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(0.05, 0.2, size=2) * min(width, height)
        grey = int(rng.integers(60, 200))
        draw.ellipse([x - rx, y - ry, x + rx, y + ry], fill=(grey, grey, grey))
    return image


def _is_visible_piece(polygon: Polygon) -> bool:
    """Whether a clipped piece is worth annotating: at least 1 px^2 and not a sliver thinner than ~0.4 px."""
    area = _area(polygon)
    perimeter = sum(math.dist(p, q) for p, q in zip(polygon, polygon[1:] + polygon[:1]))
    return area >= 1.0 and 2 * area >= 0.4 * perimeter


def _annotation(instance: _Instance) -> dict:
    if instance.occluded:
        instance.visible = [p for p in instance.visible if _is_visible_piece(p)]
    polygons = [instance.outline] if not instance.occluded else instance.visible
    xs = [x for polygon in polygons for x, _ in polygon]
    ys = [y for polygon in polygons for _, y in polygon]
    x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
    return {
        "category_id": instance.category,
        "segmentation": [[round(v, 2) for point in polygon for v in point] for polygon in polygons],
        "area": round(sum(_area(p) for p in instance.visible), 2),
        "bbox": [round(x0, 2), round(y0, 2), round(max(xs) - x0, 2), round(max(ys) - y0, 2)],
        "iscrowd": 0,
    }


def _render_image(task: tuple) -> tuple[dict, list[dict]]:
    """Draw one image and write it; returns its json entry and its annotations (without ids)."""
    root, split, index, seed, categories, style = task
    size_range = style["size_range"]
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, index])
    long_side = int(rng.integers(size_range[0], size_range[1] + 1))
    short_side = int(rng.integers(size_range[0], long_side + 1))
    width, height = (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)
    image = _background(rng, width, height, style)
    draw = ImageDraw.Draw(image)
    instances = _place_instances(rng, categories, width, height, style)
    jitter = style["color_jitter"]
    for instance in instances:
        color = np.clip(
            np.array(COLORS[list(COLORS)[(instance.category - 1) % len(COLORS)]])
            + rng.integers(-jitter, jitter + 1, 3),
            0,
            255,
        )
        edge = tuple(int(v) for v in color * 0.7)
        draw.polygon(instance.outline, fill=tuple(int(v) for v in color), outline=edge)
    noise = rng.standard_normal(size=(height, width, 3), dtype=np.float32) * 6
    pixels = np.asarray(image, dtype=np.float32) + noise
    file_name = f"{split}/{index:06d}.jpg"
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(os.path.join(root, file_name), quality=90)
    entry = {"file_name": file_name, "width": width, "height": height}
    return entry, [_annotation(instance) for instance in instances]


# ------------------------------------------------------------------------------------------------- plan
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
def _map_tasks(tasks: list[tuple], workers: int) -> Iterator[tuple[dict, list[dict]]]:
    if workers <= 1 or len(tasks) < 64:
        yield from map(_render_image, tasks)
        return
    # spawn: safe even when the caller has threads (trainer, tqdm); the module imports in ~0.2 s.
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
        workers: processes drawing images (the output does not depend on it). One is the default: on the
            shared 2-core machine two spawned workers were slower (12 s vs 8 s for the default size).

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
