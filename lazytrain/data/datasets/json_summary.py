"""A fast first look at a COCO- or LVIS-format json: what the preflight checks and the config's derived values
(number of classes, repeat threshold) need, without building the records.

msgspec decodes the file into the structs of `json_schema` (the annotation cache's record stream reads the
same ones): it checks the whole file's JSON syntax but skips the bulk (polygons and RLE counts are kept as raw
bytes, unknown fields are not built), which makes it many times faster than `json.load` (docs/benchmarks.md,
"Annotation loading"). A field that is absent (``UNSET``) or null counts as missing here. Summaries are cached
per (path, size, modification time), so the preflight, the resolvers and the registration share one parse per
process.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from lazytrain.data.datasets.json_schema import UNSET, JsonAnnotation, JsonFile, JsonImage, decode_json_bytes

__all__ = ["JsonSummary", "summarize_json"]

_FIRST = 5  # offending ids named in a message


@dataclass
class JsonSummary:
    """What a COCO/LVIS json holds, in the terms the checks need.

    Attributes:
        json_file: the file summarized.
        file_names: each image's ``file_name`` (LVIS: from ``coco_url`` when absent), None when it has neither.
        image_ids: image ids in file order.
        categories: ``(id, name)`` sorted by id (the contiguous class order of the loaders).
        json_frequency: ``frequency`` (r/c/f) per category id when every category has one, else None.
        class_image_count: number of images in which each category id is annotated (0 for none).
        num_annotations: annotations in the file.
        images_with_annotations: images having at least one annotation.
        has_negative_category_ids: some image lists ``neg_category_ids`` (LVIS's federated annotation).
        problems: ``(what, first offending ids, count)`` for malformed entries.
        without_segmentation: annotations with no ``segmentation`` (first ids, count).
    """

    json_file: str
    file_names: list[str | None] = field(default_factory=list)
    image_ids: list[Any] = field(default_factory=list)
    categories: list[tuple[Any, Any]] = field(default_factory=list)
    json_frequency: dict[Any, str] | None = None
    class_image_count: dict[Any, int] = field(default_factory=dict)
    num_annotations: int = 0
    images_with_annotations: int = 0
    has_negative_category_ids: bool = False
    problems: list[tuple[str, list, int]] = field(default_factory=list)
    without_segmentation: tuple[list, int] = ([], 0)

    @property
    def num_images(self) -> int:
        return len(self.image_ids)


_CACHE_SIZE = 4  # a run reads two files (train, val); sweeps reuse them
_cache: dict[tuple[str, int, int], JsonSummary] = {}


def summarize_json(json_file: str) -> JsonSummary:
    """Parse `json_file` (cached per path, size and modification time) into a `JsonSummary`.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not JSON (line and column given) or not a COCO-format object.
    """
    path = os.path.abspath(os.path.expanduser(json_file))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{json_file}: no such file")
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _cache:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = _summarize(_decode(json_file, path), json_file)
    return _cache[key]


def _decode(json_file: str, path: str) -> JsonFile:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return decode_json_bytes(raw)
    except msgspec.ValidationError as e:
        raise ValueError(
            f"{json_file}: not a COCO-format annotation file ({e}); expected an object with lists 'images', "
            "'annotations' and 'categories', each entry an object. Re-export it in COCO or LVIS format."
        ) from None
    except msgspec.DecodeError as e:
        match = re.search(r"byte (\d+)", str(e))
        where = ""
        if match:
            offset = int(match.group(1))
            line = raw.count(b"\n", 0, offset) + 1
            column = offset - (raw.rfind(b"\n", 0, offset) + 1) + 1
            where = f", line {line} column {column}"
        reason = re.sub(r"^JSON is malformed: | \(byte \d+\)$", "", str(e))
        raise ValueError(
            f"{json_file}: malformed JSON{where}: {reason}. The file is truncated or was not written as JSON; "
            "re-export or re-download it."
        ) from None


def _file_name(image: JsonImage) -> str | None:
    if isinstance(image.file_name, str):
        return image.file_name
    if isinstance(image.coco_url, str):  # LVIS v1: images live in COCO's folders
        return "/".join(image.coco_url.split("/")[-2:])
    return None


def _given(value: Any) -> bool:
    """Present and not null."""
    return value is not None and value is not UNSET


def _is_empty(raw: msgspec.Raw) -> bool:
    """Absent, null, [] or {} (raw JSON bytes)."""
    return len(raw) < 3 or len(raw) == 4 and bytes(raw) == b"null"


def _first(items: list) -> list:
    return items[:_FIRST]


def _ids(items: list) -> list[str]:
    """The first ids of `items` as a message shows them (JSON: "7" is a string, 7 a number)."""
    return [_value_text(item) for item in _first(items)]


def _value_text(value: Any) -> str:
    """A value as a message shows it: a string in quotes, so that "3" (a string) is not read as 3."""
    return "absent" if value is UNSET else msgspec.json.encode(value).decode()


def _is_size(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


_FOUR_NUMBERS = re.compile(
    rb"\[\s*(?:-?[0-9.]+(?:[eE][-+]?[0-9]+)?\s*,\s*){3}-?[0-9.]+(?:[eE][-+]?[0-9]+)?\s*\]"
)
# Bytes a bbox of numbers ([x, y, w, h]) never holds: a quote (a number written as a string), a letter of
# null/true/false or a brace.
_NOT_IN_A_NUMBER_LIST = np.zeros(256, dtype=bool)
_NOT_IN_A_NUMBER_LIST[list(b'"{}abcdfghijklmnopqrstuvwxyzABCDFGHIJKLMNOPQRSTUVWXYZ')] = True


def _boxes_not_numbers(annotations: list[JsonAnnotation], lengths: np.ndarray) -> list[str]:
    """The annotations whose bbox is present (`lengths`, its raw bytes: 5 or more) but not a list of four
    numbers, as "id (its bbox)". All boxes are screened at once, on their raw bytes joined (LVIS: 1.27M): each
    must hold one '[', three ',' and no byte that a list of numbers never holds; only the suspects are matched
    one by one."""
    joined = b"".join([ann.bbox for ann in annotations])  # msgspec.Raw is a buffer: no copy each
    ends = np.cumsum(lengths)
    starts = ends - lengths
    data = np.frombuffer(joined, dtype=np.uint8)

    def count_in_each(where: np.ndarray) -> np.ndarray:
        positions = np.flatnonzero(where)
        return np.searchsorted(positions, ends) - np.searchsorted(positions, starts)

    suspect = (lengths >= 5) & (
        (count_in_each(data == ord(",")) != 3)
        | (count_in_each(data == ord("[")) != 1)
        | (count_in_each(_NOT_IN_A_NUMBER_LIST[data]) > 0)
    )
    offenders = []
    for index in np.flatnonzero(suspect).tolist():
        box = bytes(annotations[index].bbox)
        if not _FOUR_NUMBERS.fullmatch(box):
            offenders.append(f"{_value_text(annotations[index].id)} ({box.decode(errors='replace')})")
    return offenders


def _summarize(data: JsonFile, json_file: str) -> JsonSummary:
    summary = JsonSummary(json_file)
    if data.images is None or data.categories is None:
        missing = [key for key in ("images", "categories") if getattr(data, key) is None]
        raise ValueError(
            f"{json_file}: has no {' and no '.join(repr(k) for k in missing)} list; COCO-format instance "
            "annotations need 'images', 'annotations' and 'categories'. Re-export it in COCO or LVIS format."
        )
    images, annotations = data.images, data.annotations or []
    summary.image_ids = [None if image.id is UNSET else image.id for image in images]
    summary.file_names = [_file_name(image) for image in images]
    summary.has_negative_category_ids = any(_given(image.neg_category_ids) for image in images)
    categories = data.categories
    ids = [c.get("id") for c in categories]
    not_int = [i for i in ids if not isinstance(i, int) or isinstance(i, bool)]
    if not_int:
        raise ValueError(
            f"{json_file}: category ids must be integers; got {', '.join(_ids(not_int))} "
            f"({len(not_int)} categories). Give every category an integer 'id' and use it as the annotations' 'category_id'."
        )
    summary.categories = sorted(((c["id"], c.get("name")) for c in categories), key=lambda c: c[0])
    if categories and all(c.get("frequency") in ("r", "c", "f") for c in categories):
        summary.json_frequency = {c["id"]: c["frequency"] for c in categories}
    summary.num_annotations = len(annotations)
    _check_entries(summary, images, categories, annotations)
    return summary


def _check_entries(
    summary: JsonSummary, images: list[JsonImage], categories: list[dict], annotations: list[JsonAnnotation]
) -> None:
    problems = summary.problems
    image_ids = set(summary.image_ids)
    if len(image_ids) != len(images):
        repeated = [i for i, n in Counter(summary.image_ids).items() if n > 1]
        problems.append(("repeated image ids", _ids(repeated), len(repeated)))
    no_name = [i for i, name in zip(summary.image_ids, summary.file_names) if name is None]
    if no_name:
        problems.append(("images without 'file_name'", _ids(no_name), len(no_name)))
    no_size = [
        i for i, image in zip(summary.image_ids, images) if not (_given(image.height) and _given(image.width))
    ]
    if no_size:
        problems.append(("images without 'height'/'width'", _ids(no_size), len(no_size)))
    bad_size = [
        f"{_value_text(i)} ({_value_text(image.height)} x {_value_text(image.width)})"
        for i, image in zip(summary.image_ids, images)
        if _given(image.height)
        and _given(image.width)
        and not (_is_size(image.height) and _is_size(image.width))
    ]
    if bad_size:
        problems.append(
            ("images whose 'height'/'width' is not a positive number", _first(bad_size), len(bad_size))
        )
    category_ids = {c["id"] for c in categories}
    if len(category_ids) != len(categories):
        repeated = [i for i, n in Counter(c["id"] for c in categories).items() if n > 1]
        problems.append(("repeated category ids", _ids(repeated), len(repeated)))
    no_category_name = [c["id"] for c in categories if not isinstance(c.get("name"), str)]
    if no_category_name:
        problems.append(("categories without a 'name'", _ids(no_category_name), len(no_category_name)))
    ann_images = [ann.image_id for ann in annotations]
    ann_categories = [ann.category_id for ann in annotations]
    for field_name, values, known, where in (
        ("image_id", ann_images, image_ids, "'images'"),
        ("category_id", ann_categories, category_ids, "'categories'"),
    ):
        if not set(values) <= known:  # set algebra first: listing the offenders is the rare, slow path
            what = f"annotations whose {field_name} is not in {where}"
            offenders = [(ann.id, value) for ann, value in zip(annotations, values) if value not in known]
            first = [f"{_value_text(i)} ({field_name} {_value_text(v)})" for i, v in _first(offenders)]
            problems.append((what, first, len(offenders)))
    bbox_lengths = np.fromiter((len(ann.bbox) for ann in annotations), dtype=np.int64, count=len(annotations))
    no_bbox = np.flatnonzero(bbox_lengths < 5)  # absent, null or shorter than [0,0,0,0]
    if len(no_bbox):
        problems.append(
            ("annotations without 'bbox'", _ids([annotations[i].id for i in no_bbox[:_FIRST]]), len(no_bbox))
        )
    not_numbers = _boxes_not_numbers(annotations, bbox_lengths)
    if not_numbers:
        problems.append(("annotations whose 'bbox' is not 4 numbers", _first(not_numbers), len(not_numbers)))
    no_segmentation = [ann.id for ann in annotations if _is_empty(ann.segmentation)]
    summary.without_segmentation = (_ids(no_segmentation), len(no_segmentation))
    summary.class_image_count, summary.images_with_annotations = _image_counts(
        ann_images, ann_categories, [c["id"] for c in categories], image_ids
    )


def _image_counts(
    ann_images: list, ann_categories: list, category_ids: list, image_ids: set
) -> tuple[dict[Any, int], int]:
    """(images annotated with each category, images with any annotation); numpy when ids are integers."""
    ordered = np.asarray(sorted(category_ids), dtype=np.int64)
    try:
        images = np.asarray(ann_images, dtype=np.int64)
        categories = np.asarray(ann_categories, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        images = categories = None
    if images is None or images.size == 0 or not ordered.size:
        return _image_counts_python(ann_images, ann_categories, category_ids, image_ids)
    index = np.searchsorted(ordered, categories).clip(0, len(ordered) - 1)
    known = ordered[index] == categories  # unknown categories are reported as problems
    images, index = images[known], index[known]
    low = int(images.min()) if images.size else 0
    span = int(images.max()) - low + 1 if images.size else 1
    if span * len(ordered) >= 2**62:
        return _image_counts_python(ann_images, ann_categories, category_ids, image_ids)
    # one int64 key per distinct (category, image) pair: sorting 1-d keys is much faster than unique rows
    pairs = _distinct(index * span + (images - low))
    counts = np.bincount(pairs // span, minlength=len(ordered))
    by_category = dict(zip(ordered.tolist(), counts.tolist()))
    annotated = set(_distinct(images).tolist()) & image_ids
    return {c: by_category[c] for c in category_ids}, len(annotated)


def _distinct(values: np.ndarray) -> np.ndarray:
    # a sort and a neighbour comparison: np.unique (numpy 2.x) takes much longer here
    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])]


def _image_counts_python(
    ann_images: list, ann_categories: list, category_ids: list, image_ids: set
) -> tuple[dict[Any, int], int]:
    pairs = set(zip(ann_images, ann_categories))
    counts = Counter(category for _, category in pairs)
    return {c: counts.get(c, 0) for c in category_ids}, len({image for image, _ in pairs} & image_ids)
