"""COCO/LVIS json -> the records of `load_coco_json`/`load_lvis_json`, one image at a time, from a typed decode.

msgspec decodes the file into the structs of `json_schema` (`json_summary` reads the same ones), which hold
only the fields the records and the checks use; boxes and masks stay raw JSON bytes (views of the file's
bytes) until their image's record is built, so the whole file never exists as Python objects at once, and
building the records costs about one decode of the file. The records equal the plain loaders' exactly (same
keys in the same order, same values and types, same dropped boxes and polygons and the same warning).

This path serves well-formed files only: anything the plain loaders would refuse or that it does not model
(a syntax error, a missing field, an unknown image or category, a repeated annotation id, an odd type, an
``annotations`` object instead of a list) makes `decode_json_file` return None, and the caller uses the plain
loader, which raises its own precise error.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from lazytrain.data.datasets.coco import _clean_polygons
from lazytrain.data.datasets.json_schema import UNSET, JsonAnnotation, JsonImage, decode_json_bytes

__all__ = ["DecodedJson", "decode_json_file"]


class _Unsupported(Exception):
    """Something the plain loader must handle (and, usually, report)."""


@dataclass
class DecodedJson:
    """A decoded COCO/LVIS file, ready to give its records in file order.

    Attributes:
        categories: the json's categories (dicts) sorted by id.
        annotation_pairs: ``(image_id, category_id)`` of every annotation, dropped ones included.
        dropped: what building the records dropped, by reason (filled while `records` runs).
    """

    categories: list[dict]
    images: list[JsonImage]
    annotations: list[JsonAnnotation]
    order: np.ndarray
    bounds: np.ndarray
    contiguous: list[int]
    image_root: str
    lvis: bool
    dropped: Counter

    @property
    def annotation_pairs(self) -> Iterator[tuple[Any, Any]]:
        return ((ann.image_id, ann.category_id) for ann in self.annotations)

    def records(self) -> Iterator[dict]:
        """The records, built one at a time, in the file's image order."""
        id_map = {c["id"]: i for i, c in enumerate(self.categories)}
        for index, image in enumerate(self.images):
            start, end = int(self.bounds[index]), int(self.bounds[index + 1])
            record = {
                "file_name": os.path.join(self.image_root, _file_name(image, self.lvis)),
                "height": image.height,
                "width": image.width,
                "image_id": image.id,
                "annotations": self._annotations(self.order[start:end].tolist()),
            }
            if self.lvis:
                for key in ("neg_category_ids", "not_exhaustive_category_ids"):
                    ids = getattr(image, key)
                    record[key] = [id_map[c] for c in (() if ids is UNSET else ids) if c in id_map]
            yield record

    def _annotations(self, indices: list[int]) -> list[dict]:
        if not indices:
            return []
        anns = [self.annotations[i] for i in indices]
        # One decode for all boxes and masks of the image: a decode call per value costs more than the values.
        parts = []
        for ann in anns:
            parts.append(ann.bbox)
            parts.append(ann.segmentation if len(ann.segmentation) else b"null")
        values = msgspec.json.decode(b"[" + b",".join(parts) + b"]")
        kept = []
        for position, (ann, index) in enumerate(zip(anns, indices)):
            record = self._annotation(
                ann, self.contiguous[index], values[2 * position], values[2 * position + 1]
            )
            if record is not None:
                kept.append(record)
        return kept

    def _annotation(self, ann: JsonAnnotation, category: int, bbox: Any, segmentation: Any) -> dict | None:
        """`lazytrain.data.datasets.coco._attach_annotations`'s conversion of one annotation."""
        if bbox[2] <= 0 or bbox[3] <= 0:
            self.dropped["degenerate boxes (w or h <= 0)"] += 1
            return None
        record = {"bbox": bbox, "bbox_mode": "XYWH_ABS", "category_id": category, "iscrowd": ann.iscrowd}
        if segmentation.__class__ is list:
            for polygon in segmentation:
                if len(polygon) < 6 or len(polygon) & 1:
                    segmentation = _clean_polygons(segmentation, self.dropped)
                    break
            if not segmentation:
                self.dropped["annotations left without a polygon"] += 1
                return None
        if segmentation is not None:
            record["segmentation"] = segmentation
        return record


def _file_name(image: JsonImage, lvis: bool) -> str:
    if image.file_name is UNSET and lvis and image.coco_url is not UNSET:
        return "/".join(image.coco_url.split("/")[-2:])
    return image.file_name


def _check_images(images: list[JsonImage], lvis: bool) -> None:
    for image in images:
        if UNSET in (image.id, image.height, image.width):
            raise _Unsupported
        name = image.file_name
        if name is UNSET and lvis and image.coco_url is not UNSET:
            name = image.coco_url
        if name.__class__ is not str:
            raise _Unsupported
        if lvis:
            for ids in (image.neg_category_ids, image.not_exhaustive_category_ids):
                if ids is not UNSET and ids.__class__ is not list:
                    raise _Unsupported


def _group_by_image(
    images: list[JsonImage], annotations: list[JsonAnnotation]
) -> tuple[np.ndarray, np.ndarray]:
    """Annotation indices sorted by image (file order within an image) and each image's bounds in them."""
    # Later images with a repeated id take its annotations, as the plain loader's dict does.
    position = {image.id: index for index, image in enumerate(images)}
    owners = [position.get(ann.image_id, -1) for ann in annotations]
    owner = np.asarray(owners, dtype=np.int64)
    if len(owner) and owner.min() < 0:
        raise _Unsupported
    bounds = np.zeros(len(images) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(images)), out=bounds[1:])
    return np.argsort(owner, kind="stable"), bounds


def _decode(json_file: str, image_root: str, lvis: bool) -> DecodedJson:
    with open(json_file, "rb") as f:
        data = decode_json_bytes(f.read())
    if data.images is None or data.categories is None:
        raise _Unsupported
    annotations = data.annotations or []
    categories = sorted(data.categories, key=lambda c: c["id"])
    id_map = {c["id"]: i for i, c in enumerate(categories)}
    _check_images(data.images, lvis)
    ids = [ann.id for ann in annotations]
    if len(set(ids)) != len(ids):
        raise _Unsupported
    contiguous = [id_map.get(ann.category_id, -1) for ann in annotations]
    if -1 in contiguous or any(len(ann.bbox) == 0 for ann in annotations):
        raise _Unsupported
    order, bounds = _group_by_image(data.images, annotations)
    return DecodedJson(
        categories, data.images, annotations, order, bounds, contiguous, image_root, lvis, Counter()
    )


def decode_json_file(json_file: str, image_root: str, *, lvis: bool) -> DecodedJson | None:
    """Decode a local COCO (``lvis=False``) or LVIS json; None when the plain loader must read it.

    Args:
        json_file: a local file.
        image_root: joined before each image's ``file_name``.
        lvis: build LVIS records (``file_name`` from ``coco_url``, the negative and not-exhaustive ids).
    """
    try:
        return _decode(json_file, image_root, lvis)
    except (_Unsupported, msgspec.DecodeError, msgspec.ValidationError, TypeError, AttributeError, KeyError):
        return None
