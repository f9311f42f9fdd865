"""COCO-format instance annotations -> lazytrain records (also the base of the LVIS loader).

Records: ``file_name``, ``height``, ``width``, ``image_id``, ``annotations`` (``bbox`` XYWH absolute,
``bbox_mode``, ``category_id`` contiguous 0..K-1 in sorted json-id order, ``iscrowd``, ``segmentation`` as
polygons or RLE). Problems are reported with the file and the annotation id; degenerate boxes and
polygons with fewer than 3 points are dropped with one summary warning.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Any

from iopath.common.file_io import PathManager as _PathManagerClass

__all__ = ["load_coco_json", "read_json"]

logger = logging.getLogger(__name__)
PathManager = _PathManagerClass()


def read_json(json_file: str) -> dict:
    """Read an annotation file; missing file and malformed JSON give errors naming the file and position."""
    local = PathManager.get_local_path(json_file)
    if not os.path.isfile(local):
        root = os.environ.get("LAZYTRAIN_DATASETS", "./datasets")
        raise FileNotFoundError(
            f"annotation file not found: {json_file}. Datasets are read from $LAZYTRAIN_DATASETS (now {root!r}); "
            "put the data there (see README 'Real data') or set LAZYTRAIN_DATASETS to where it lives."
        )
    with open(local, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"malformed JSON in {json_file}, line {e.lineno} column {e.colno}: {e.msg}") from None


def _clean_segmentation(segmentation: Any, dropped: Counter) -> Any:
    if isinstance(segmentation, dict):  # RLE
        return segmentation
    polygons = [p for p in segmentation if len(p) >= 6 and len(p) % 2 == 0]
    if len(polygons) < len(segmentation):
        dropped["polygons with < 3 points"] += len(segmentation) - len(polygons)
    return polygons


def _convert_annotation(ann: dict, id_map: dict[int, int], json_file: str, dropped: Counter) -> dict | None:
    if ann["category_id"] not in id_map:
        raise ValueError(
            f"{json_file}: annotation id {ann.get('id')} has category_id {ann['category_id']}, which is not in "
            "'categories'. Fix the annotation or add the category."
        )
    x, y, w, h = ann["bbox"]
    if w <= 0 or h <= 0:
        dropped["degenerate boxes (w or h <= 0)"] += 1
        return None
    record = {"bbox": [x, y, w, h], "bbox_mode": "XYWH_ABS", "category_id": id_map[ann["category_id"]],
              "iscrowd": ann.get("iscrowd", 0), "id": ann.get("id")}
    if "segmentation" in ann:
        segmentation = _clean_segmentation(ann["segmentation"], dropped)
        if not segmentation:
            dropped["annotations left without a polygon"] += 1
            return None
        record["segmentation"] = segmentation
    return record


def _group_annotations(data: dict, json_file: str) -> dict[int, list[dict]]:
    image_ids = {image["id"] for image in data["images"]}
    seen: set = set()
    by_image: dict[int, list[dict]] = {}
    for ann in data.get("annotations", []):
        ann_id = ann.get("id")
        if ann_id is not None:
            if ann_id in seen:
                raise ValueError(f"{json_file}: duplicate annotation id {ann_id}; annotation ids must be unique.")
            seen.add(ann_id)
        if ann["image_id"] not in image_ids:
            raise ValueError(
                f"{json_file}: annotation id {ann_id} refers to image_id {ann['image_id']}, which is not in 'images'."
            )
        by_image.setdefault(ann["image_id"], []).append(ann)
    return by_image


def load_coco_json(json_file: str, image_root: str, dataset_name: str | None = None, *, data: dict | None = None) -> list[dict]:
    """Load COCO-format instance annotations as records.

    Args:
        json_file: path (or iopath URL) of the annotation file.
        image_root: directory the images' ``file_name`` are relative to.
        dataset_name: if given, its `MetadataCatalog` entry gets thing_classes, the id mapping, json_file,
            image_root and evaluator_type "coco" (unless already set).
        data: the parsed json, when the caller has read it already.
    """
    data = read_json(json_file) if data is None else data
    categories = sorted(data["categories"], key=lambda c: c["id"])
    id_map = {c["id"]: i for i, c in enumerate(categories)}
    by_image = _group_annotations(data, json_file)
    dropped: Counter = Counter()
    records = []
    for image in data["images"]:
        anns = (_convert_annotation(a, id_map, json_file, dropped) for a in by_image.get(image["id"], []))
        records.append({
            "file_name": os.path.join(image_root, image["file_name"]),
            "height": image["height"],
            "width": image["width"],
            "image_id": image["id"],
            "annotations": [a for a in anns if a is not None],
        })
    if dropped:
        summary = ", ".join(f"{count} {what}" for what, count in sorted(dropped.items()))
        logger.warning("%s: dropped %s.", json_file, summary)
    if dataset_name is not None:
        from lazytrain.data.catalog import MetadataCatalog

        meta = MetadataCatalog.get(dataset_name)
        meta.set(thing_classes=[c["name"] for c in categories], thing_dataset_id_to_contiguous_id=id_map,
                 json_file=json_file, image_root=image_root)
        if meta.get("evaluator_type") is None:
            meta.set(evaluator_type="coco")
    logger.info("Loaded %d images with %d annotations from %s", len(records), sum(len(r["annotations"]) for r in records), json_file)
    return records
