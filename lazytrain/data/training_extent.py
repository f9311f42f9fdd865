"""What a train loader can give at most: instances per image and mapped image size (`get_training_extent`).

A model with fixed capacities (``model.fixed_shapes``: ground truth per image, padded image size) checks them
against this before its first step, so a run stops at once, naming the key to raise, instead of at the batch
that first exceeds them. The instances are those the mapper keeps (crowd annotations left out) plus what
copy-paste may add; the size follows the mapper's augmentations from each record's size where every one of
them is a resize, flip or crop this module knows (otherwise it is unknown: None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from lazytrain.data.common import DatasetFromList, MapDataset
from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.data.transforms import FixedSizeCrop, RandomFlip, ResizeScale, ResizeShortestEdge

__all__ = ["TrainingExtent", "get_training_extent", "largest_output_size", "most_instances_per_image"]


class TrainingExtent(NamedTuple):
    """The most a train loader gives: `most_instances` in one image (`fullest_image` names it: its
    ``file_name``), and `largest_size` [height, width] of a mapped image (each the largest over the data
    set); None where the loader's records, or the mapper's augmentations, do not tell."""

    most_instances: int | None
    fullest_image: str
    largest_size: tuple[int, int] | None


def _non_crowd(record: dict) -> int:
    return sum(1 for a in record.get("annotations", []) if not a.get("iscrowd", 0))


def most_instances_per_image(records: Sequence[dict]) -> tuple[int, str]:
    """The most non-crowd annotations of one record and that record's ``file_name`` (0 and "" without
    records). `CachedRecords` are read from their count arrays; only the records with the most annotations
    are decoded, to leave out their crowd ones."""
    if isinstance(records, DatasetFromList) and records.cached_records is not None:
        records = records.cached_records
    if isinstance(records, CachedRecords):
        counts = records.annotation_counts
        most, fullest = 0, ""
        # Descending annotation counts: once a count is below the best non-crowd count, nothing beats it.
        for index in np.argsort(-counts, kind="stable"):
            if counts[index] <= most:
                break
            record = records[int(index)]
            count = _non_crowd(record)
            if count > most:
                most, fullest = count, str(record.get("file_name", ""))
        return most, fullest
    most, fullest = 0, ""
    for index in range(len(records)):
        record = records[index]
        count = _non_crowd(record)
        if count > most:
            most, fullest = count, str(record.get("file_name", ""))
    return most, fullest


def largest_output_size(augmentations: Iterable[Any], height: int, width: int) -> tuple[int, int] | None:
    """The largest [height, width] the `augmentations` make of a `height` x `width` image, whatever they
    draw; None when one of them is not a `ResizeShortestEdge`, `ResizeScale`, `FixedSizeCrop` or
    `RandomFlip` (a torchvision transform, say: its output size is not known here)."""
    for augmentation in augmentations:
        if isinstance(augmentation, RandomFlip):
            continue
        if isinstance(augmentation, ResizeShortestEdge):
            # ResizeShortestEdge.get_transform's rule at its longest short edge, the largest image it makes.
            scale = max(augmentation.short_edge_length) / min(height, width)
            if max(height, width) * scale > augmentation.max_size:
                scale = augmentation.max_size / max(height, width)
            height, width = max(1, int(height * scale + 0.5)), max(1, int(width * scale + 0.5))
        elif isinstance(augmentation, ResizeScale):
            scale = augmentation.max_scale
            factor = min(
                scale * augmentation.target_height / height, scale * augmentation.target_width / width
            )
            height, width = max(1, round(height * factor)), max(1, round(width * factor))
        elif isinstance(augmentation, FixedSizeCrop):
            crop_height, crop_width = augmentation.crop_size
            height, width = (
                (crop_height, crop_width)
                if augmentation.pad
                else (min(height, crop_height), min(width, crop_width))
            )
        else:
            return None
    return height, width


def _record_sizes(records: Sequence[dict]) -> set[tuple[int, int]] | None:
    """The distinct (height, width) of the records, or None where a record lacks them."""
    if isinstance(records, DatasetFromList) and records.cached_records is not None:
        records = records.cached_records
    if isinstance(records, CachedRecords):
        sizes = records.image_sizes
        if len(sizes) and not np.isfinite(sizes).all():
            return None
        return {(int(h), int(w)) for h, w in np.unique(sizes, axis=0)}
    found = set()
    for index in range(len(records)):
        record = records[index]
        if "height" not in record or "width" not in record:
            return None
        found.add((int(record["height"]), int(record["width"])))
    return found


def _largest_mapped_size(records: Sequence[dict], mapper: Any) -> tuple[int, int] | None:
    augmentations = getattr(mapper, "augmentations", None)
    sizes = _record_sizes(records) if augmentations is not None else None
    if not sizes:
        return None
    largest = [largest_output_size(augmentations, h, w) for h, w in sizes]
    if any(size is None for size in largest):
        return None
    return max(h for h, _ in largest), max(w for _, w in largest)


def get_training_extent(loader: Any) -> TrainingExtent:
    """The `TrainingExtent` of a train loader built by `build_detection_train_loader` (its records and
    mapper); a loader of another kind gives what can be read from its ``dataset`` of records (nothing when
    that is not a list, `DatasetFromList` or `CachedRecords`)."""
    dataset = getattr(loader, "dataset", loader)
    mapper = None
    if isinstance(dataset, MapDataset):
        dataset, mapper = dataset.dataset, dataset.map_func
    if not isinstance(dataset, (list, tuple, DatasetFromList, CachedRecords)):
        return TrainingExtent(None, "", None)
    most, fullest = most_instances_per_image(dataset)
    copy_paste = getattr(mapper, "copy_paste", None)
    if copy_paste is not None and copy_paste.mode != "none":
        most += copy_paste.max_objects  # pasted objects are added to the image's own
        fullest = f"{fullest} with copy-paste's max_objects={copy_paste.max_objects}"
    return TrainingExtent(most, fullest, _largest_mapped_size(dataset, mapper))
