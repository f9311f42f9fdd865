"""`synthetic_lt`: the embedded long-tailed instance-segmentation data set, generated as real files.

30 categories (6 shapes x 5 colours) on noisy textured backgrounds, 1-8 instances per image, images of
varied size (128-320 px, both orientations). Train image counts per category follow LVIS's buckets:
8 rare (1-10 train images), 12 common (11-100), 10 frequent (> 100), power-law within each bucket. Every
category appears in ~20 validation images so per-category AP is measurable.

Occlusion: instances are drawn in order, later ones on top. A fully visible instance keeps its polygon; an
occluded one gets the RLE of its visible pixels (COCO allows RLE with iscrowd=0), so masks always match the
pixels. The json is LVIS v1 format (``frequency``, ``image_count``; per image ``neg_category_ids`` listing
every absent category, since the set is exhaustively annotated, and ``not_exhaustive_category_ids: []``),
which `load_coco_json` reads as well. Generation is deterministic for a seed and atomic (temp dir + rename).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["CATEGORY_NAMES", "ensure_synthetic_lt", "generate_synthetic_lt", "synthetic_category_plan"]

logger = logging.getLogger(__name__)

SHAPES = ("circle", "square", "triangle", "star", "cross", "hexagon")
COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 220), "yellow": (230, 210, 40), "magenta": (200, 50, 200)}
CATEGORY_NAMES = [f"{color}_{shape}" for shape in SHAPES for color in COLORS]
NUM_RARE, NUM_COMMON = 8, 12


def _unit_polygon(shape: str) -> np.ndarray:
    """Vertices of `shape` on the unit circle scale, centred at 0."""
    if shape == "circle":
        angles = np.linspace(0, 2 * math.pi, 24, endpoint=False)
        return np.stack([np.cos(angles), np.sin(angles)], 1)
    if shape == "square":
        return np.array([[-0.8, -0.8], [0.8, -0.8], [0.8, 0.8], [-0.8, 0.8]])
    if shape == "triangle":
        angles = np.array([-90, 30, 150]) * math.pi / 180
        return np.stack([np.cos(angles), np.sin(angles)], 1)
    if shape == "hexagon":
        angles = np.arange(6) * math.pi / 3
        return np.stack([np.cos(angles), np.sin(angles)], 1)
    if shape == "star":
        angles = np.arange(10) * math.pi / 5 - math.pi / 2
        radii = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        return np.stack([radii * np.cos(angles), radii * np.sin(angles)], 1)
    a, b = 0.3, 1.0  # cross
    return np.array([[-a, -b], [a, -b], [a, -a], [b, -a], [b, a], [a, a], [a, b], [-a, b], [-a, a], [-b, a], [-b, -a], [-a, -a]])


def synthetic_category_plan(num_train: int, seed: int = 0) -> list[dict]:
    """Per category: name, frequency bucket and the number of train images it should appear in."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(CATEGORY_NAMES))
    plan = []
    num_frequent = len(CATEGORY_NAMES) - NUM_RARE - NUM_COMMON
    buckets = [("r", NUM_RARE, 1, 10), ("c", NUM_COMMON, 11, 100), ("f", num_frequent, 101, int(0.55 * num_train))]
    position = 0
    scale = num_train / 1000  # bucket edges are LVIS's for 1000 images; smaller sets shrink them
    for frequency, count, low, high in buckets:
        low, high = max(1, round(low * scale)), max(1, round(high * scale))
        for k in range(count):
            # power law within the bucket: the k-th category gets low * (high/low)^(k/(count-1))
            value = low * (high / low) ** (k / max(count - 1, 1))
            plan.append({"id": int(order[position]) + 1, "frequency": frequency, "train_images": max(1, int(round(value)))})
            position += 1
    return sorted(plan, key=lambda c: c["id"])


@dataclass
class _Instance:
    category: int  # json id
    polygon: np.ndarray  # [P, 2]


def _place_instances(rng: np.random.Generator, categories: list[int], width: int, height: int) -> list[_Instance]:
    instances = []
    for category in categories:
        shape = SHAPES[(category - 1) // len(COLORS)]
        radius = rng.uniform(0.08, 0.22) * min(width, height)
        cx, cy = rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)
        angle = rng.uniform(0, 2 * math.pi)
        rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        points = _unit_polygon(shape) @ rotation.T * radius + np.array([cx, cy])
        instances.append(_Instance(category, points))
    return instances


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    base = rng.integers(60, 200, size=3)
    coarse = rng.normal(0, 25, size=(max(2, height // 16), max(2, width // 16), 3))
    texture = np.asarray(Image.fromarray(np.clip(coarse + 128, 0, 255).astype(np.uint8)).resize((width, height), Image.BILINEAR), dtype=np.float32) - 128
    noise = rng.normal(0, 12, size=(height, width, 3))
    return np.clip(base + texture + noise, 0, 255).astype(np.uint8)


def _render(rng: np.random.Generator, instances: list[_Instance], width: int, height: int) -> tuple[Image.Image, list[dict]]:
    """Draw the instances in order; return the image and their annotations (polygon or visible-part RLE)."""
    from pycocotools import mask as mask_util

    image = Image.fromarray(_background(rng, width, height))
    draw = ImageDraw.Draw(image)
    masks = []
    for instance in instances:
        color = np.array(COLORS[list(COLORS)[(instance.category - 1) % len(COLORS)]]) + rng.integers(-20, 21, size=3)
        xy = [tuple(p) for p in instance.polygon.tolist()]
        draw.polygon(xy, fill=tuple(int(c) for c in np.clip(color, 0, 255)))
        canvas = Image.new("L", (width, height), 0)
        ImageDraw.Draw(canvas).polygon(xy, fill=1)
        masks.append(np.asarray(canvas, dtype=bool))
    annotations, covered = [], np.zeros((height, width), dtype=bool)
    for instance, mask in reversed(list(zip(instances, masks))):
        visible = mask & ~covered
        covered |= mask
        area = int(visible.sum())
        if area < 20:
            continue  # hidden almost entirely: not annotated
        ys, xs = np.nonzero(visible)
        bbox = [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)]
        if area == int(mask.sum()):
            segmentation = [[round(v, 2) for v in instance.polygon.reshape(-1).tolist()]]
        else:
            rle = mask_util.encode(np.asfortranarray(visible.astype(np.uint8)))
            segmentation = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
        annotations.append({"category_id": instance.category, "bbox": bbox, "area": area, "segmentation": segmentation, "iscrowd": 0})
    return image, annotations[::-1]


def _assign_categories(rng: np.random.Generator, num_images: int, counts: dict[int, int], max_per_image: int = 8) -> list[list[int]]:
    """Put category c in counts[c] distinct images (fewer if images are full); empty images get one instance."""
    per_image: list[list[int]] = [[] for _ in range(num_images)]
    for category, count in sorted(counts.items(), key=lambda kv: kv[1]):  # rare first: they must fit
        free = [i for i in range(num_images) if len(per_image[i]) < max_per_image - 1]
        for index in rng.choice(free, size=min(count, len(free)), replace=False):
            per_image[index].extend([category] * int(rng.choice([1, 1, 1, 2])))
    frequent = max(counts, key=counts.get)
    for categories in per_image:
        if not categories:
            categories.append(frequent)
        rng.shuffle(categories)
    return per_image


def _write_split(root: str, split: str, per_image: list[list[int]], seed: int, size_range: tuple[int, int], plan: list[dict], progress) -> dict:
    os.makedirs(os.path.join(root, split))
    images, annotations = [], []
    all_ids = {c["id"] for c in plan}
    for index, categories in enumerate(per_image):
        rng = np.random.default_rng([seed, 0 if split == "train" else 1, index])
        long_side = int(rng.integers(size_range[0], size_range[1] + 1))
        short_side = int(rng.integers(size_range[0], long_side + 1))
        width, height = (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)
        image, anns = _render(rng, _place_instances(rng, categories, width, height), width, height)
        file_name = f"{split}/{index:06d}.jpg"
        image.save(os.path.join(root, file_name), quality=92)
        image_id = index + 1 if split == "train" else 100000 + index + 1
        present = {a["category_id"] for a in anns}
        images.append({"id": image_id, "file_name": file_name, "width": width, "height": height,
                       "neg_category_ids": sorted(all_ids - present), "not_exhaustive_category_ids": []})
        for ann in anns:
            annotations.append({"id": len(annotations) + 1 + (0 if split == "train" else 10**7), "image_id": image_id, **ann})
        progress.update(1)
    return {"images": images, "annotations": annotations}


def generate_synthetic_lt(root: str, num_train: int = 1000, num_val: int = 250, seed: int = 0, size_range: tuple[int, int] = (128, 320), val_images_per_category: int = 20) -> str:
    """Write the data set into `root` (must not exist): ``train/``, ``val/``, ``lvis_v1_{train,val}.json``.

    Returns:
        `root`.
    """
    from tqdm import tqdm

    plan = synthetic_category_plan(num_train, seed)
    rng = np.random.default_rng(seed)
    train_assign = _assign_categories(rng, num_train, {c["id"]: c["train_images"] for c in plan})
    val_assign = _assign_categories(rng, num_val, {c["id"]: min(val_images_per_category, num_val) for c in plan})
    os.makedirs(root)
    with tqdm(total=num_train + num_val, desc="generating synthetic_lt", unit="img", mininterval=1.0) as progress:
        splits = {split: _write_split(root, split, assign, seed, size_range, plan, progress)
                  for split, assign in (("train", train_assign), ("val", val_assign))}
    image_count = {c["id"]: 0 for c in plan}
    for image in splits["train"]["images"]:
        for category in set(c["id"] for c in plan) - set(image["neg_category_ids"]):
            image_count[category] += 1
    categories = []
    for c in plan:
        count = image_count[c["id"]]
        frequency = "r" if count <= 10 * num_train / 1000 else "c" if count <= 100 * num_train / 1000 else "f"
        categories.append({"id": c["id"], "name": CATEGORY_NAMES[c["id"] - 1], "frequency": frequency, "image_count": count,
                           "instance_count": 0, "synset": CATEGORY_NAMES[c["id"] - 1]})
    for split, content in splits.items():
        with open(os.path.join(root, f"lvis_v1_{split}.json"), "w") as f:
            json.dump({"info": {"description": f"synthetic_lt {split}, seed {seed}"}, "licenses": [], "categories": categories, **content}, f)
    return root


def ensure_synthetic_lt(root: str, **kwargs) -> str:
    """Generate the data set at `root` unless it exists; safe when several processes call it at once.

    Each caller generates into its own temporary directory beside `root` and renames it into place; the
    rename is atomic, so `root` is either absent or complete, and a loser of the race discards its copy.
    """
    if os.path.isdir(root):
        return root
    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".synthetic_lt.tmp-", dir=parent)
    try:
        logger.info("Generating the synthetic_lt data set into %s (first use)", root)
        generate_synthetic_lt(os.path.join(tmp, "data"), **kwargs)
        try:
            os.rename(os.path.join(tmp, "data"), root)
        except OSError:
            if not os.path.isdir(root):
                raise
            logger.info("Another process generated %s first; using it", root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
