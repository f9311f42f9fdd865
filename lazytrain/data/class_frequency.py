"""How many train images each class appears in, from the data set: what frequency-aware losses are given.

`get_class_image_counts` reads the catalog metadata ``class_image_count`` (LVIS-style json files, the
embedded data set and `register_json_dataset` data sets have it) and otherwise counts the records, so counts
are never typed into a config. The modeling layer receives the plain list (e.g.
``FederatedLoss(class_image_counts=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.repeat_factors import CategoryIndex

__all__ = ["get_class_image_counts"]


def get_class_image_counts(dataset_names: str | Sequence[str]) -> list[int]:
    """Per contiguous class id, the number of images annotated with it, summed over the data sets.

    Args:
        dataset_names: one registered train data set or several (their classes must agree, as for training
            on them together).

    Returns:
        ``counts[c]`` for c in 0..K-1 (K = len(thing_classes) when the metadata has it), 0 for a class in no
        image.
    """
    names = [dataset_names] if isinstance(dataset_names, str) else list(dataset_names)
    if not names:
        raise ValueError("get_class_image_counts(dataset_names=) needs at least one data set name; got []")
    per_set = {name: _image_counts(name) for name in names}
    lengths = {name: len(counts) for name, counts in per_set.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"get_class_image_counts: the data sets have different numbers of classes {lengths}; train on "
            "data sets with the same categories (the same thing_classes)."
        )
    return [int(sum(column)) for column in zip(*per_set.values())]


def _image_counts(name: str) -> list[int]:
    counts = _counts_from_metadata(name)
    if counts is not None:
        return counts
    records = DatasetCatalog.get(name)
    # Loading an LVIS-style file fills in class_image_count; other formats are counted here.
    counts = _counts_from_metadata(name)
    return counts if counts is not None else _counts_from_records(name, records)


def _counts_from_metadata(name: str) -> list[int] | None:
    metadata = MetadataCatalog.get(name)
    entries = metadata.get("class_image_count")
    if not entries:
        return None
    id_map = metadata.get("thing_dataset_id_to_contiguous_id") or {
        entry["id"]: index for index, entry in enumerate(sorted(entries, key=lambda entry: entry["id"]))
    }
    counts = [0] * len(id_map)
    for entry in entries:
        if entry["id"] not in id_map:
            raise ValueError(
                f"get_class_image_counts: {name}'s class_image_count has category id {entry['id']!r}, which "
                f"is not among its thing_dataset_id_to_contiguous_id ids {sorted(id_map)[:10]}...; the "
                "metadata of this data set is inconsistent (re-register it)."
            )
        counts[id_map[entry["id"]]] = int(entry["image_count"])
    return counts


def _counts_from_records(name: str, records: Sequence[dict]) -> list[int]:
    index = CategoryIndex.from_dataset_dicts(records)  # each image's distinct categories
    classes = MetadataCatalog.get(name).get("thing_classes")
    num_classes = len(classes) if classes else int(index.categories.max(initial=-1)) + 1
    if len(index.categories) and int(index.categories.max()) >= num_classes:
        raise ValueError(
            f"get_class_image_counts: {name} has category_id {int(index.categories.max())} but "
            f"{num_classes} thing_classes; category ids must be contiguous 0..{num_classes - 1}."
        )
    return np.bincount(index.categories, minlength=num_classes).astype(int).tolist()
