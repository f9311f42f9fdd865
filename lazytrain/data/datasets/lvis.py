"""LVIS v1 annotations -> lazytrain records: the COCO records plus the federated-evaluation fields.

LVIS images carry ``neg_category_ids`` (verified absent) and ``not_exhaustive_category_ids``; categories carry
``frequency`` (r/c/f) and ``image_count``. LVIS v1 images live in COCO's folders: an image without
``file_name`` is found from its ``coco_url`` (``.../train2017/000000391895.jpg``) under `image_root`.
"""

from __future__ import annotations

import os

from lazytrain.data.datasets.coco import load_coco_json, read_json

__all__ = ["load_lvis_json"]


def load_lvis_json(json_file: str, image_root: str, dataset_name: str | None = None) -> list[dict]:
    """Load LVIS-format annotations; ids in the federated fields are mapped to contiguous ids.

    Args:
        json_file: path of the LVIS json.
        image_root: directory the images are under (``coco/`` for LVIS v1: train2017/ and val2017/ inside).
        dataset_name: if given, its metadata gets evaluator_type "lvis", class_image_count and
            class_frequency besides what `load_coco_json` sets.
    """
    data = read_json(json_file)
    for image in data["images"]:
        if "file_name" not in image:
            split_folder, base = image["coco_url"].split("/")[-2:]
            image["file_name"] = os.path.join(split_folder, base)
    records = load_coco_json(json_file, image_root, None, data=data)
    categories = sorted(data["categories"], key=lambda c: c["id"])
    id_map = {c["id"]: i for i, c in enumerate(categories)}
    for record, image in zip(records, data["images"]):
        record["neg_category_ids"] = [id_map[c] for c in image.get("neg_category_ids", []) if c in id_map]
        record["not_exhaustive_category_ids"] = [id_map[c] for c in image.get("not_exhaustive_category_ids", []) if c in id_map]
    if dataset_name is not None:
        from lazytrain.data.catalog import MetadataCatalog

        MetadataCatalog.get(dataset_name).set(
            thing_classes=[c["name"] for c in categories],
            thing_dataset_id_to_contiguous_id=id_map,
            json_file=json_file,
            image_root=image_root,
            evaluator_type="lvis",
            class_image_count=[{"id": c["id"], "image_count": c.get("image_count", 0), "frequency": c.get("frequency", "f")} for c in categories],
            class_frequency=[c.get("frequency", "f") for c in categories],
        )
    return records
