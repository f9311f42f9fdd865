"""LVIS v1 annotations -> lazytrain records: the COCO records plus the federated-evaluation fields.

LVIS images carry ``neg_category_ids`` (categories verified absent) and ``not_exhaustive_category_ids``;
records carry both as contiguous ids. Categories carry ``frequency`` (r/c/f) and ``image_count``, which
the metadata keeps for repeat-factor sampling and for the APr/APc/APf split. LVIS v1 images live in COCO's
folders and have no ``file_name``: it is taken from ``coco_url`` (``.../train2017/000000391895.jpg`` ->
``train2017/000000391895.jpg`` under `image_root`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from lazytrain.data.datasets.coco import log_loaded, read_json, records_from_coco_dict, set_coco_metadata

__all__ = [
    "frequency_of_image_count",
    "get_class_image_count",
    "load_lvis_json",
    "records_from_lvis_dict",
    "set_lvis_metadata",
]

logger = logging.getLogger(__name__)


def frequency_of_image_count(image_count: int) -> str:
    """LVIS's frequency bucket of a category seen in `image_count` train images: r (<= 10), c (<= 100), f."""
    return "r" if image_count <= 10 else "c" if image_count <= 100 else "f"


def get_class_image_count(categories: list[dict], annotation_pairs: Iterable[tuple[Any, Any]]) -> list[dict]:
    """``{"id", "image_count", "frequency"}`` per category (json ids), computed when the file lacks them.

    Args:
        categories: the json's categories sorted by id.
        annotation_pairs: ``(image_id, category_id)`` of every annotation; read only when a category lacks
            ``image_count`` or ``frequency``.
    """
    if all("image_count" in c and "frequency" in c for c in categories):
        return [
            {"id": c["id"], "image_count": c["image_count"], "frequency": c["frequency"]} for c in categories
        ]
    counts = Counter(category for _, category in set(annotation_pairs))
    entries = []
    for c in categories:
        count = c.get("image_count", counts.get(c["id"], 0))
        entries.append(
            {
                "id": c["id"],
                "image_count": count,
                "frequency": c.get("frequency") or frequency_of_image_count(count),
            }
        )
    return entries


def records_from_lvis_dict(data: dict, json_file: str, image_root: str) -> list[dict]:
    """The records of an already parsed LVIS-format dict (see `load_lvis_json`); fills in the images'
    ``file_name`` from ``coco_url`` where it is missing."""
    images = data.get("images") if isinstance(data, dict) else None
    for image in images if isinstance(images, list) else []:
        if "file_name" not in image and "coco_url" in image:
            image["file_name"] = "/".join(image["coco_url"].split("/")[-2:])
    records = records_from_coco_dict(data, json_file, image_root)
    categories = sorted(data["categories"], key=lambda c: c["id"])
    id_map = {c["id"]: i for i, c in enumerate(categories)}
    for record, image in zip(records, data["images"]):
        record["neg_category_ids"] = [id_map[c] for c in image.get("neg_category_ids", ()) if c in id_map]
        record["not_exhaustive_category_ids"] = [
            id_map[c] for c in image.get("not_exhaustive_category_ids", ()) if c in id_map
        ]
    return records


def set_lvis_metadata(
    dataset_name: str, data: dict, json_file: str, image_root: str, class_image_count: list[dict]
) -> None:
    """Fill the `MetadataCatalog` entry of `dataset_name` as `load_lvis_json` does."""
    from lazytrain.data.catalog import MetadataCatalog

    set_coco_metadata(dataset_name, data, json_file, image_root, evaluator_type="lvis")
    MetadataCatalog.get(dataset_name).set(
        class_image_count=class_image_count,
        class_frequency=[entry["frequency"] for entry in class_image_count],
    )


def load_lvis_json(json_file: str, image_root: str, dataset_name: str | None = None) -> list[dict]:
    """Load LVIS-format annotations as records with ``neg_category_ids`` and ``not_exhaustive_category_ids``.

    Args:
        json_file: path or iopath URL of the LVIS json.
        image_root: directory the images are under (for LVIS v1 the ``coco/`` folder, holding train2017/ and
            val2017/).
        dataset_name: when given, its `MetadataCatalog` entry gets what `load_coco_json` sets with
            ``evaluator_type="lvis"``, plus ``class_image_count`` (list of ``{"id", "image_count",
            "frequency"}`` in json ids) and ``class_frequency`` (r/c/f per contiguous id). Files without
            ``image_count``/``frequency`` get them computed from their annotations (LVIS thresholds 10/100).
    """
    data = read_json(json_file)
    records = records_from_lvis_dict(data, json_file, image_root)
    if dataset_name is not None:
        categories = sorted(data["categories"], key=lambda c: c["id"])
        pairs = ((a["image_id"], a["category_id"]) for a in data.get("annotations") or [])
        set_lvis_metadata(dataset_name, data, json_file, image_root, get_class_image_count(categories, pairs))
    log_loaded(records, json_file)
    return records
