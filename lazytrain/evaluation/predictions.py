"""How the instance evaluators keep predictions between `process` and `evaluate`: a few arrays per image.

An LVIS val evaluation keeps 300 detections for each of ~20,000 images, 6 million in all, and the main process
gathers every rank's share. As one COCO result dict per detection (a dict, a box list, floats, an RLE dict) that
is about a kilobyte of Python objects per detection, gigabytes on the main process at LVIS scale
(docs/benchmarks.md). `ImagePredictions` holds the same values in numpy arrays plus one
RLE string per detection, and `get_coco_entries` rebuilds the exact COCO result dicts when they are needed, a
category chunk at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, NamedTuple

import msgspec
import numpy as np
import pycocotools.mask as mask_util
import torch

__all__ = [
    "ENTRY_FIELDS",
    "DetectionTable",
    "ImagePredictions",
    "encode_masks",
    "get_coco_entries",
    "pack_instances",
    "write_coco_results",
]

ENTRY_FIELDS = ("image_id", "category_id", "bbox", "score", "segmentation")
"""The fields of a COCO result entry, in the order `get_coco_entries` gives them."""


class ImagePredictions(NamedTuple):
    """One image's predictions as an evaluator keeps them (all arrays in the model's detection order).

    Attributes:
        image_id: the json image id.
        category_ids: int64 [N] json category id of each detection.
        boxes: [N, 4] XYXY as the model gave them, float32 (float64 when the model gave float64), so the
            COCO XYWH box computed from them in float64 is the one computed from the model's tensor.
        scores: [N] float32 (float64 when the model gave float64).
        mask_size: (height, width) of the masks' RLEs; None when there are no masks or no detections.
        mask_counts: compressed RLE ``counts`` (str) of each detection's mask; None when the outputs had no
            ``masks``.
    """

    image_id: int
    category_ids: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray
    mask_size: tuple[int, int] | None
    mask_counts: list[str] | None

    @property
    def num_detections(self) -> int:
        return len(self.category_ids)

    @property
    def has_masks(self) -> bool:
        return self.mask_counts is not None


def _lossless_float(tensor: torch.Tensor) -> np.ndarray:
    """A copy in float32 for float32 and narrower floats (exact), else in float64 (exact up to 2**53); never
    a view of the model's output, which its caller may reuse."""
    tensor = tensor.detach().cpu()
    dtype = torch.float32 if tensor.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float64
    return tensor.to(dtype, copy=True).numpy()


def encode_masks(masks: Any) -> tuple[tuple[int, int], list[str]]:
    """((height, width), compressed RLE counts of each mask) of [N, H, W] 0/1 masks: the RLEs pycocotools'
    ``encode`` gives, found inside each mask's bounding box.

    ``encode`` wants the masks column-major, and transposing 300 full-size masks would be most of `process`'s
    time (docs/benchmarks.md): a detection's mask covers a small part of the image, so its runs are found in the rows and columns it touches, shifted to
    the image, and compressed by pycocotools.
    """
    masks = torch.as_tensor(masks).detach().cpu().to(torch.uint8)
    count, height, width = masks.shape
    if not count:
        return (height, width), []
    columns, rows = masks.amax(dim=1).numpy(), masks.amax(dim=2).numpy()  # what each mask touches
    pixels = masks.numpy()
    runs = [_column_major_runs(pixels[i], columns[i], rows[i]) for i in range(count)]
    rles = mask_util.frPyObjects([{"size": [height, width], "counts": r} for r in runs], height, width)
    return (height, width), [rle["counts"].decode("ascii") for rle in rles]


def _column_major_runs(mask: np.ndarray, columns: np.ndarray, rows: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts of one [H, W] mask (alternate runs of 0s and 1s in column-major order, the
    first of 0s), from its bounding box; `columns` and `rows` say which of them hold a pixel."""
    height, width = mask.shape
    xs, ys = np.flatnonzero(columns), np.flatnonzero(rows)
    if not len(xs):
        return [height * width]
    x0, x1, y0, y1 = int(xs[0]), int(xs[-1]) + 1, int(ys[0]), int(ys[-1]) + 1
    inside = np.zeros((x1 - x0, y1 - y0 + 2), dtype=np.int8)  # the box's columns with a 0 above and below
    inside[:, 1:-1] = mask[y0:y1, x0:x1].T != 0
    step = np.diff(inside, axis=1)
    column, row = np.nonzero(step == 1)  # in column-major order, as np.nonzero goes row by row of `step`
    starts = (x0 + column) * height + y0 + row
    column, row = np.nonzero(step == -1)
    ends = (x0 + column) * height + y0 + row
    # A run down to the bottom of a column and one from the top of the next are one run in column-major order.
    joined = starts[1:] == ends[:-1]
    starts = np.concatenate([starts[:1], starts[1:][~joined]])
    ends = np.concatenate([ends[:-1][~joined], ends[-1:]])
    bounds = np.concatenate([[0], np.stack([starts, ends], axis=1).ravel(), [height * width]])
    counts = np.diff(bounds)
    return (counts if counts[-1] else counts[:-1]).tolist()  # no empty run of 0s after a mask's last pixel


def pack_instances(
    instances: Mapping[str, Any], image_id: int, category_ids: Sequence[int]
) -> ImagePredictions:
    """Keep one image's predicted instances compactly.

    Args:
        instances: ``boxes`` [N, 4] XYXY, ``scores`` [N], ``classes`` [N] contiguous, optional ``masks``
            [N, H, W] (0/1) in the original image size.
        image_id: the json image id.
        category_ids: json category id of each contiguous class.

    Raises:
        ValueError: a class is outside ``0 .. len(category_ids) - 1``.
    """
    classes = torch.as_tensor(instances["classes"]).detach().cpu().long().reshape(-1).numpy()
    outside = classes[(classes < 0) | (classes >= len(category_ids))]
    if len(outside):
        raise ValueError(
            f"prediction for image {image_id} has class {int(outside[0])}, outside the data set's "
            f"{len(category_ids)} categories (contiguous ids 0..{len(category_ids) - 1}). Does the model's "
            "num_classes match the evaluated data set?"
        )
    masks = instances.get("masks")
    mask_size, mask_counts = None, None if masks is None else []
    if masks is not None and len(classes):
        mask_size, mask_counts = encode_masks(masks)
    return ImagePredictions(
        image_id=int(image_id),
        category_ids=np.asarray(category_ids, dtype=np.int64)[classes],
        boxes=_lossless_float(torch.as_tensor(instances["boxes"])).reshape(-1, 4),
        scores=_lossless_float(torch.as_tensor(instances["scores"])).reshape(-1),
        mask_size=mask_size,
        mask_counts=mask_counts,
    )


class DetectionTable:
    """Every detection of a list of `ImagePredictions` as flat arrays, to pick detections by category.

    Args:
        predictions: the images' predictions, in the order their detections are numbered.
    """

    def __init__(self, predictions: Sequence[ImagePredictions]) -> None:
        counts = np.array([p.num_detections for p in predictions], dtype=np.int64)
        self.image_ids = np.repeat(np.array([p.image_id for p in predictions], dtype=np.int64), counts)
        self.category_ids = _concatenate([p.category_ids for p in predictions], np.int64, (0,))
        # Mixed float32/float64 inputs concatenate to float64, which holds both exactly.
        self.boxes = _concatenate([p.boxes for p in predictions], np.float32, (0, 4))
        self.scores = _concatenate([p.scores for p in predictions], np.float32, (0,))
        self.has_masks = all(p.has_masks for p in predictions)
        self.mask_counts: list[str] = []
        self.mask_sizes: list[list[int]] = []
        if self.has_masks:
            self.mask_counts = list(itertools.chain.from_iterable(p.mask_counts or [] for p in predictions))
            image_sizes = [list(p.mask_size or (0, 0)) for p in predictions]
            self.mask_sizes = [
                image_sizes[i] for i in np.repeat(np.arange(len(predictions)), counts).tolist()
            ]

    def __len__(self) -> int:
        return len(self.category_ids)

    def get_entries(
        self, indices: np.ndarray | None = None, fields: Sequence[str] = ENTRY_FIELDS
    ) -> list[dict[str, Any]]:
        """COCO result dicts of the detections at `indices` (all when None), in that order.

        Args:
            indices: detection numbers.
            fields: which of ``image_id, category_id, bbox, score, segmentation`` to include (in that order;
                ``segmentation`` only with masks). The COCO API takes an instance's area from the box when both
                are given, so box evaluation leaves out ``segmentation`` and mask evaluation ``bbox``.
        """
        selection = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        columns: dict[str, list[Any]] = {}
        if "image_id" in fields:
            columns["image_id"] = self.image_ids[selection].tolist()
        if "category_id" in fields:
            columns["category_id"] = self.category_ids[selection].tolist()
        if "bbox" in fields:
            boxes = self.boxes[selection].astype(np.float64)  # as the COCO API gets them: XYWH in float64
            boxes[:, 2:] -= boxes[:, :2]
            columns["bbox"] = boxes.tolist()
        if "score" in fields:
            columns["score"] = self.scores[selection].tolist()
        if "segmentation" in fields and self.has_masks:
            chosen = selection.tolist()
            # A fresh size list per entry, as pycocotools' encode gives: nothing is shared between entries.
            columns["segmentation"] = [
                {"size": list(self.mask_sizes[i]), "counts": self.mask_counts[i]} for i in chosen
            ]
        names = list(columns)
        return [dict(zip(names, values)) for values in zip(*columns.values())]


def _concatenate(arrays: list[np.ndarray], empty_dtype: type, empty_shape: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(empty_shape, dtype=empty_dtype)


def get_coco_entries(predictions: ImagePredictions) -> list[dict[str, Any]]:
    """COCO result dicts of one image's detections: ``image_id``, ``category_id``, ``bbox`` (XYWH),
    ``score`` and, with masks, ``segmentation`` (compressed RLE, ``counts`` as str)."""
    return DetectionTable([predictions]).get_entries()


def write_coco_results(file: IO[bytes], predictions: Iterable[ImagePredictions]) -> int:
    """Write every detection as a COCO results json list, one image at a time; returns the number written.

    The json holds the entries of `get_coco_entries` of every image (the values ``json.dump`` of them all
    wrote, without its spaces, and NaN as null), without holding them all: 6 million dicts at LVIS scale.
    msgspec encodes them several times faster than the json module (docs/benchmarks.md).

    Args:
        file: opened for writing bytes.
        predictions: the images' predictions, in the order to write them.
    """
    encoder = msgspec.json.Encoder()
    file.write(b"[")
    written = 0
    for prediction in predictions:
        entries = get_coco_entries(prediction)
        if not entries:
            continue
        if written:
            file.write(b",")
        file.write(encoder.encode(entries)[1:-1])
        written += len(entries)
    file.write(b"]")
    return written
