"""Small COCO-format exports written the way annotation tools write them, with the messy variants real
exports have (each a function of the clean data set), for the custom data set tests."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pycocotools.mask as mask_util
from PIL import Image, ImageDraw

# Non-contiguous ids including 0; id 41 has no annotation anywhere.
CATEGORIES = [(0, "zero"), (3, "three"), (7, "seven"), (12, "twelve"), (41, "unused")]
COLORS = {0: (220, 40, 40), 3: (40, 200, 40), 7: (40, 40, 220), 12: (230, 220, 40)}


def _instance(rng: np.random.Generator, width: int, height: int) -> list[float]:
    w, h = rng.uniform(0.3, 0.5) * width, rng.uniform(0.3, 0.5) * height
    x0, y0 = rng.uniform(0, width - w), rng.uniform(0, height - h)
    return [round(float(v), 2) for v in (x0, y0, x0 + w, y0, x0 + w, y0 + h, x0, y0 + h)]


def _split(rng: np.random.Generator, root: str, split: str, num_images: int, first_id: int) -> dict:
    images, annotations = [], []
    folder = os.path.join(root, "images", split)
    os.makedirs(folder, exist_ok=True)
    for index in range(num_images):
        image_id = first_id + index
        width, height = (64, 48) if index % 2 else (48, 64)
        picture = Image.new("RGB", (width, height), (128, 128, 128))
        draw = ImageDraw.Draw(picture)
        # the last val image has no annotation (kept for evaluation, dropped for training)
        count = 0 if split == "val" and index == num_images - 1 else 1 + index % 2
        for k in range(count):
            category = CATEGORIES[(index + k) % 4][0]
            polygon = _instance(rng, width, height)
            draw.polygon(polygon, fill=COLORS[category])
            rle = mask_util.merge(mask_util.frPyObjects([polygon], height, width))
            annotations.append(
                {
                    "id": 1000 * first_id + len(annotations),
                    "image_id": image_id,
                    "category_id": category,
                    "segmentation": [polygon],
                    "area": float(mask_util.area(rle)),
                    "bbox": [float(v) for v in mask_util.toBbox(rle)],
                    "iscrowd": 0,
                }
            )
        name = f"{split}/{image_id:04d}.png"
        picture.save(os.path.join(root, "images", name))
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
    categories = [{"id": c, "name": n, "supercategory": "thing"} for c, n in CATEGORIES]
    return {"images": images, "annotations": annotations, "categories": categories}


def write_export(root: str, variant: str = "clean", num_train: int = 8, num_val: int = 5) -> dict[str, str]:
    """Write ``root/images/{train,val}/*.png`` and ``root/{train,val}.json`` in `variant`; return the
    ``data.*`` overrides (json and image folder of each split)."""
    rng = np.random.default_rng(0)
    splits = {
        "train": _split(rng, root, "train", num_train, 1),
        "val": _split(rng, root, "val", num_val, 100),
    }
    for data in splits.values():
        VARIANTS[variant](data, root)
    paths = {}
    for split, data in splits.items():
        paths[f"data.{split}.json"] = os.path.join(root, f"{split}.json")
        paths[f"data.{split}.images"] = os.path.join(root, "images")
        with open(paths[f"data.{split}.json"], "w") as f:
            json.dump(data, f)
    return paths


def _clean(data: dict, root: str) -> None:
    pass


def _no_iscrowd_no_area(data: dict, root: str) -> None:
    for annotation in data["annotations"]:
        del annotation["iscrowd"], annotation["area"]


def _rle(data: dict, root: str, compressed: bool) -> None:
    sizes = {image["id"]: (image["height"], image["width"]) for image in data["images"]}
    for annotation in data["annotations"]:
        height, width = sizes[annotation["image_id"]]
        rle = mask_util.merge(mask_util.frPyObjects(annotation["segmentation"], height, width))
        if compressed:
            annotation["segmentation"] = {"size": [height, width], "counts": rle["counts"].decode("ascii")}
        else:  # counts as a list: run lengths of the column-major mask, starting with a run of zeros
            flat = mask_util.decode(rle).flatten(order="F")
            boundaries = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
            counts = np.diff(boundaries).tolist()
            annotation["segmentation"] = {
                "size": [height, width],
                "counts": [0, *counts] if flat[0] else counts,
            }


def _float_boxes(data: dict, root: str) -> None:
    for annotation in data["annotations"]:
        annotation["bbox"] = [v + 0.37 for v in annotation["bbox"][:2]] + annotation["bbox"][2:]


def _absolute_and_nested_paths(data: dict, root: str) -> None:
    for index, image in enumerate(data["images"]):
        if index % 2:
            image["file_name"] = os.path.join(root, "images", image["file_name"])  # absolute


def _extra_fields(data: dict, root: str) -> None:
    data["info"], data["licenses"] = {"description": "tool export"}, [{"id": 1, "name": "x"}]
    for image in data["images"]:
        image.update(license=1, date_captured="2026-01-01", flickr_url="", extra={"tags": ["a"]})
    for annotation in data["annotations"]:
        annotation.update(attributes={"occluded": False}, track_id=None)


def _no_supercategory(data: dict, root: str) -> None:
    for category in data["categories"]:
        category.pop("supercategory")


def _box_only(data: dict, root: str) -> None:
    for annotation in data["annotations"]:
        del annotation["segmentation"]


VARIANTS = {
    "clean": _clean,
    "no_iscrowd_no_area": _no_iscrowd_no_area,
    "compressed_rle": lambda data, root: _rle(data, root, compressed=True),
    "uncompressed_rle": lambda data, root: _rle(data, root, compressed=False),
    "float_boxes": _float_boxes,
    "absolute_paths": _absolute_and_nested_paths,
    "extra_fields": _extra_fields,
    "no_supercategory": _no_supercategory,
    "box_only": _box_only,
}


def perfect_outputs(data: dict) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) as the model would give them if it predicted the ground truth exactly."""
    import torch

    contiguous = {c: i for i, (c, _) in enumerate(CATEGORIES)}
    inputs, outputs = [], []
    for image in data["images"]:
        annotations = [a for a in data["annotations"] if a["image_id"] == image["id"]]
        height, width = image["height"], image["width"]
        boxes = torch.tensor([a["bbox"] for a in annotations], dtype=torch.float64).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        instances = {
            "boxes": boxes,
            "scores": torch.ones(len(annotations)),
            "classes": torch.tensor([contiguous[a["category_id"]] for a in annotations], dtype=torch.long),
        }
        if all("segmentation" in a for a in annotations):
            masks = [_decode(a["segmentation"], height, width) for a in annotations]
            instances["masks"] = torch.from_numpy(np.stack(masks)) if masks else torch.zeros(0, height, width)
        inputs.append({"image_id": image["id"]})
        outputs.append({"instances": instances})
    return inputs, outputs


def _decode(segmentation, height: int, width: int) -> np.ndarray:
    if isinstance(segmentation, list):
        rle = mask_util.merge(mask_util.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation["counts"], list):
        rle = mask_util.frPyObjects(segmentation, height, width)
    else:
        rle = {"size": segmentation["size"], "counts": segmentation["counts"].encode("ascii")}
    return mask_util.decode(rle)


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def rewrite(path: str, change) -> None:
    """Apply `change(data)` to the json at `path` in place."""
    data = load(path)
    change(data)
    with open(path, "w") as f:
        json.dump(data, f)


def copy_data(data: dict) -> dict:
    return copy.deepcopy(data)
