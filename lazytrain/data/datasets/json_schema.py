"""The schema of a COCO- or LVIS-format json for msgspec's typed decode, shared by `json_summary` (the checks'
first look at a file) and `record_stream` (the records the annotation cache writes).

A field the file does not have is ``UNSET`` and a JSON ``null`` is None, so a reader can tell the two apart as
the plain loaders do (``"height": null`` gives a record whose height is None; no ``height`` is an error). The
exceptions are an annotation's ``id`` (None when absent, as the plain loaders' ``ann.get("id")``) and
``iscrowd`` (0). Boxes and masks stay raw JSON bytes (`msgspec.Raw`, views of the file's bytes) until a reader
decodes them, and fields outside the schema are checked for syntax but never built: both keep the decode
fast and small (docs/benchmarks.md, "Annotation loading"). Categories are decoded whole, as dicts: they are
few, and the metadata keeps their fields.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["UNSET", "JsonAnnotation", "JsonFile", "JsonImage", "decode_json_bytes"]

UNSET: Any = msgspec.UNSET


class JsonImage(msgspec.Struct):
    id: Any = UNSET
    file_name: Any = UNSET
    coco_url: Any = UNSET  # LVIS v1: the file name is its last two parts
    height: Any = UNSET
    width: Any = UNSET
    neg_category_ids: Any = UNSET  # LVIS's federated annotation
    not_exhaustive_category_ids: Any = UNSET


class JsonAnnotation(msgspec.Struct):
    id: Any = None
    image_id: Any = UNSET
    category_id: Any = UNSET
    iscrowd: Any = 0
    bbox: msgspec.Raw = msgspec.Raw(b"")
    segmentation: msgspec.Raw = msgspec.Raw(b"")


class JsonFile(msgspec.Struct):
    images: list[JsonImage] | None = None
    categories: list[dict] | None = None
    annotations: list[JsonAnnotation] | None = None


_decoder = msgspec.json.Decoder(JsonFile)


def decode_json_bytes(raw: bytes) -> JsonFile:
    """Decode a COCO/LVIS json's bytes; the views in its `msgspec.Raw` fields keep `raw` alive.

    Raises:
        msgspec.DecodeError: not JSON (the message names the byte offset).
        msgspec.ValidationError: JSON of another shape (e.g. ``images`` is not a list of objects).
    """
    return _decoder.decode(raw)
