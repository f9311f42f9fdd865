"""Tiny COCO/LVIS ground truth written by the tests themselves, and model-style outputs built from it."""

from __future__ import annotations

import json

import numpy as np
import pycocotools.mask as mask_util
import torch

CATEGORY_IDS = [1, 5, 9]  # deliberately not contiguous
FREQUENCIES = {1: "f", 5: "c", 9: "r"}
IMAGE_COUNTS = {1: 150, 5: 40, 9: 3}


def _polygon(rng: np.random.Generator, width: int, height: int) -> list[float]:
    """A random convex-ish polygon (a jittered rectangle, sometimes a triangle) inside the image."""
    w, h = rng.uniform(0.2, 0.7) * width, rng.uniform(0.2, 0.7) * height
    x0, y0 = rng.uniform(0, width - w), rng.uniform(0, height - h)
    if rng.random() < 0.5:
        points = [x0, y0, x0 + w, y0, x0 + w, y0 + h, x0, y0 + h]
    else:
        points = [x0, y0 + h, x0 + w / 2, y0, x0 + w, y0 + h]
    return [round(float(p), 2) for p in points]


def make_ground_truth(num_images: int = 6, seed: int = 0, lvis: bool = False) -> dict:
    """A small data set: images of 64-160 px (non-square), 1-4 polygon instances each, 3 categories."""
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        width, height = int(rng.integers(64, 161)), int(rng.integers(64, 161))
        image = {"id": image_id, "width": width, "height": height, "file_name": f"{image_id}.png"}
        present = set()
        for _ in range(int(rng.integers(1, 5))):
            category_id = CATEGORY_IDS[int(rng.integers(0, len(CATEGORY_IDS)))]
            polygon = _polygon(rng, width, height)
            rle = mask_util.merge(mask_util.frPyObjects([polygon], height, width))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category_id,
                    "segmentation": [polygon],
                    "area": float(mask_util.area(rle)),
                    "bbox": [float(v) for v in mask_util.toBbox(rle)],
                    "iscrowd": 0,
                }
            )
            present.add(category_id)
        if lvis:
            image["neg_category_ids"] = sorted(set(CATEGORY_IDS) - present)
            image["not_exhaustive_category_ids"] = []
        images.append(image)
    categories = [{"id": c, "name": f"shape{c}"} for c in CATEGORY_IDS]
    if lvis:
        for category in categories:
            category.update(frequency=FREQUENCIES[category["id"]], image_count=IMAGE_COUNTS[category["id"]])
    return {"images": images, "annotations": annotations, "categories": categories}


def write_json(data: dict, path) -> str:
    with open(path, "w") as f:
        json.dump(data, f)
    return str(path)


def ground_truth_as_outputs(
    data: dict, *, masks: bool = True, relabel=None, noise: float = 0.0, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) as `inference_on_dataset` would pass them, predicting the ground truth.

    Args:
        relabel: optional function contiguous class -> contiguous class (e.g. to shuffle labels).
        noise: box jitter in pixels and random scores; > 0 also adds one random false positive per image.
    """
    rng = np.random.default_rng(seed)
    contiguous = {c: i for i, c in enumerate(sorted(c["id"] for c in data["categories"]))}
    inputs, outputs = [], []
    for image in data["images"]:
        height, width = image["height"], image["width"]
        anns = [a for a in data["annotations"] if a["image_id"] == image["id"]]
        boxes, classes, mask_list = [], [], []
        for ann in anns:
            x, y, w, h = ann["bbox"]
            boxes.append([x, y, x + w, y + h])
            classes.append(contiguous[ann["category_id"]])
            rle = mask_util.merge(mask_util.frPyObjects(ann["segmentation"], height, width))
            mask_list.append(mask_util.decode(rle))
        if noise:
            x0, y0 = rng.uniform(0, width / 2), rng.uniform(0, height / 2)
            boxes.append([x0, y0, x0 + width / 3, y0 + height / 3])
            classes.append(int(rng.integers(0, len(contiguous))))
            fp_mask = np.zeros((height, width), dtype=np.uint8)
            fp_mask[int(y0) : int(y0 + height / 3), int(x0) : int(x0 + width / 3)] = 1
            mask_list.append(fp_mask)
        box_tensor = torch.tensor(boxes, dtype=torch.float32)
        if noise:
            box_tensor += torch.from_numpy(rng.normal(0, noise, box_tensor.shape)).float()
        mask_tensor = torch.from_numpy(np.stack(mask_list)).to(torch.uint8)
        if noise:
            flip = torch.from_numpy(rng.random(mask_tensor.shape) < 0.05)
            mask_tensor = torch.where(flip, 1 - mask_tensor, mask_tensor)
        scores = (
            torch.from_numpy(rng.uniform(0.1, 1.0, len(boxes))).float() if noise else torch.ones(len(boxes))
        )
        class_tensor = torch.tensor([relabel(c) if relabel else c for c in classes], dtype=torch.int64)
        instances = {"boxes": box_tensor, "scores": scores, "classes": class_tensor}
        if masks:
            instances["masks"] = mask_tensor
        inputs.append({"image_id": image["id"], "height": height, "width": width})
        outputs.append({"instances": instances})
    return inputs, outputs
