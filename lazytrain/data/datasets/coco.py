"""COCO-format instance annotations -> lazytrain records (the LVIS loader builds on it).

One record per image: ``file_name``, ``height``, ``width``, ``image_id`` and ``annotations``, each with
``bbox`` (XYWH, absolute pixels), ``bbox_mode`` ``"XYWH_ABS"``, ``category_id`` (contiguous 0..K-1 in the
order of the sorted json category ids), ``iscrowd`` and ``segmentation`` (polygons or an RLE dict).

Bad input is reported precisely: a missing file names the path and ``$LAZYTRAIN_DATASETS``; malformed JSON
gives the line and column; an annotation pointing at an unknown image or category, or a repeated annotation
id, names the annotation id. Degenerate boxes (w or h <= 0) and polygons with fewer than 3 points are dropped
with one summary warning (through `logging`) per file.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Any

# PathManager is re-exported (it was defined here): the one instance that reads every file.
from lazytrain.utils.file_io import PathManager

__all__ = ["PathManager", "load_coco_json", "read_json"]

logger = logging.getLogger(__name__)

DATA_LAYOUT = (
    "$LAZYTRAIN_DATASETS/coco/{train2017,val2017}/*.jpg, "
    "$LAZYTRAIN_DATASETS/coco/annotations/instances_{train,val}2017.json, "
    "$LAZYTRAIN_DATASETS/lvis/lvis_v1_{train,val}.json (LVIS images are read from coco/), "
    "$LAZYTRAIN_DATASETS/synthetic_lt/ (generated on first use)"
)


def read_json(json_file: str) -> dict:
    """Parse an annotation file read through iopath.

    Raises:
        FileNotFoundError: the file does not exist (the message names it, ``$LAZYTRAIN_DATASETS`` and the layout).
        ValueError: the file is not valid JSON (the message gives the line and column).
    """
    if not PathManager.exists(json_file):
        root = os.environ.get("LAZYTRAIN_DATASETS")
        where = (
            f"LAZYTRAIN_DATASETS={root!r}" if root else "LAZYTRAIN_DATASETS is unset, so ./datasets is used"
        )
        raise FileNotFoundError(
            f"annotation file not found: {json_file} ({where}). Set LAZYTRAIN_DATASETS to the folder that holds "
            f"the data laid out as {DATA_LAYOUT}."
        )
    with PathManager.open(json_file, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"malformed JSON in {json_file}, line {e.lineno} column {e.colno}: {e.msg}. Re-download or re-export it."
        ) from e


def _check_top_level(data: Any, json_file: str) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(
            f"{json_file}: expected a COCO-format object with 'images', 'annotations', 'categories'"
        )
    if not isinstance(data.get("categories"), list):
        raise ValueError(f"{json_file}: has no 'categories' list; COCO-format instance annotations need one")


def _check_annotation_ids(annotations: list[dict], json_file: str) -> None:
    ids = [a.get("id") for a in annotations]
    if len(set(ids)) == len(ids):
        return
    seen: set = set()
    for index, ann_id in enumerate(ids):
        if ann_id is None:
            raise ValueError(
                f"{json_file}: annotation number {index} has no 'id'; every annotation needs a unique id."
            )
        if ann_id in seen:
            raise ValueError(
                f"{json_file}: duplicate annotation id {ann_id}; every annotation needs a unique 'id'."
            )
        seen.add(ann_id)


def _clean_polygons(polygons: list, dropped: Counter) -> list:
    kept = [p for p in polygons if len(p) >= 6 and len(p) % 2 == 0]
    if len(kept) != len(polygons):
        dropped["polygons with < 3 points"] += len(polygons) - len(kept)
    return kept


def records_from_coco_dict(data: dict, json_file: str, image_root: str) -> list[dict]:
    """Build the records from an already parsed COCO-format dict (see `load_coco_json`).

    Args:
        data: the parsed json; image entries need ``file_name`` (the LVIS loader fills it in).
        json_file: named in error messages.
        image_root: joined before each ``file_name``.
    """
    _check_top_level(data, json_file)
    categories = sorted(data["categories"], key=lambda c: c["id"])
    id_map = {c["id"]: i for i, c in enumerate(categories)}
    records, by_id = _image_records(data["images"], json_file, image_root)
    annotations = data.get("annotations") or []
    _check_annotation_ids(annotations, json_file)
    dropped = _attach_annotations(annotations, by_id, id_map, json_file)
    if dropped:
        summary = ", ".join(f"{count} {what}" for what, count in sorted(dropped.items()))
        logger.warning("%s: dropped %s.", json_file, summary)
    return records


def _image_records(
    images: list[dict], json_file: str, image_root: str
) -> tuple[list[dict], dict[Any, list[dict]]]:
    """One record per image, in file order, with an empty ``annotations`` list, and that list by image id."""
    records = []
    by_id: dict[Any, list[dict]] = {}
    for image in images:
        if "file_name" not in image:
            raise ValueError(f"{json_file}: image id {image.get('id')} has no 'file_name'.")
        annotations: list[dict] = []
        by_id[image["id"]] = annotations
        records.append(
            {
                "file_name": os.path.join(image_root, image["file_name"]),
                "height": image["height"],
                "width": image["width"],
                "image_id": image["id"],
                "annotations": annotations,
            }
        )
    return records, by_id


def _attach_annotations(
    annotations: list[dict], by_id: dict[Any, list[dict]], id_map: dict[Any, int], json_file: str
) -> Counter:
    """Convert each annotation and append it to its image's list in `by_id`; returns what was dropped, counted
    by reason (degenerate boxes, bad polygons)."""
    dropped: Counter = Counter()
    for ann in annotations:  # one pass; this loop is most of the loading time after json parsing
        target = by_id.get(ann["image_id"])
        if target is None:
            raise _unknown_image_error(ann, json_file)
        category = id_map.get(ann["category_id"])
        if category is None:
            raise _unknown_category_error(ann, json_file)
        bbox = ann["bbox"]
        if bbox[2] <= 0 or bbox[3] <= 0:
            dropped["degenerate boxes (w or h <= 0)"] += 1
            continue
        record = {
            "bbox": bbox,
            "bbox_mode": "XYWH_ABS",
            "category_id": category,
            "iscrowd": ann.get("iscrowd", 0),
        }
        segmentation = ann.get("segmentation")
        if segmentation.__class__ is list:
            for polygon in segmentation:  # inline check: a function call per annotation is measurable
                if len(polygon) < 6 or len(polygon) & 1:
                    segmentation = _clean_polygons(segmentation, dropped)
                    break
            if not segmentation:
                dropped["annotations left without a polygon"] += 1
                continue
        if segmentation is not None:
            record["segmentation"] = segmentation
        target.append(record)
    return dropped


def _unknown_image_error(ann: dict, json_file: str) -> ValueError:
    return ValueError(
        f"{json_file}: annotation id {ann.get('id')} refers to image_id {ann['image_id']}, which is not in "
        "'images'. Remove the annotation or add the image."
    )


def _unknown_category_error(ann: dict, json_file: str) -> ValueError:
    return ValueError(
        f"{json_file}: annotation id {ann.get('id')} has category_id {ann['category_id']}, which is not in "
        "'categories'. Remove the annotation or add the category."
    )


def set_coco_metadata(
    dataset_name: str, data: dict, json_file: str, image_root: str, evaluator_type: str
) -> None:
    """Fill the `MetadataCatalog` entry of `dataset_name` from a parsed COCO-format dict."""
    from lazytrain.data.catalog import MetadataCatalog

    categories = sorted(data["categories"], key=lambda c: c["id"])
    MetadataCatalog.get(dataset_name).set(
        thing_classes=[c["name"] for c in categories],
        thing_dataset_id_to_contiguous_id={c["id"]: i for i, c in enumerate(categories)},
        json_file=json_file,
        image_root=image_root,
        evaluator_type=evaluator_type,
    )


def log_loaded(records: list[dict], json_file: str) -> None:
    """One INFO line: how many images and annotations were read from `json_file`."""
    num_annotations = sum(len(r["annotations"]) for r in records)
    logger.info("Loaded %d images with %d annotations from %s", len(records), num_annotations, json_file)


def load_coco_json(json_file: str, image_root: str, dataset_name: str | None = None) -> list[dict]:
    """Load COCO-format instance annotations as records (LVIS-format files load too, without their extras).

    Args:
        json_file: path or iopath URL of the annotation file.
        image_root: directory the images' ``file_name`` are relative to.
        dataset_name: when given, its `MetadataCatalog` entry gets ``thing_classes``,
            ``thing_dataset_id_to_contiguous_id``, ``json_file``, ``image_root`` and ``evaluator_type``
            (``"coco"`` unless already set).

    Returns:
        One record per image, in the file's order, including images without annotations.
    """
    data = read_json(json_file)
    records = records_from_coco_dict(data, json_file, image_root)
    if dataset_name is not None:
        from lazytrain.data.catalog import MetadataCatalog

        evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type") or "coco"
        set_coco_metadata(dataset_name, data, json_file, image_root, evaluator_type)
    log_loaded(records, json_file)
    return records
