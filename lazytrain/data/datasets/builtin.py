"""Registration of the built-in data sets, found under ``$LAZYTRAIN_DATASETS`` (default ``./datasets``).

The variable is read each time a data set is loaded, not at import, so it may change between runs and tests.
Layout:

    $LAZYTRAIN_DATASETS/coco/{train2017,val2017}/*.jpg
    $LAZYTRAIN_DATASETS/coco/annotations/instances_{train,val}2017.json     -> coco_2017_{train,val}
    $LAZYTRAIN_DATASETS/lvis/lvis_v1_{train,val}.json (images from coco/)   -> lvis_v1_{train,val}
    $LAZYTRAIN_DATASETS/synthetic_lt/ (generated on first use)              -> synthetic_lt_{train,val}

Their records come from each json's cache file (`lazytrain.data.datasets.cached_records.load_cached_json`),
written by the first process that loads it. This module lists them (`get_builtin_datasets`) and the files
each needs (`get_required_files`, which the checks before a run use) and does not use the catalog, which the
loaders use: ``import lazytrain.data`` hands the list to `lazytrain.data.catalog`, which registers it on
first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from lazytrain.data.datasets.cached_records import load_cached_json
from lazytrain.data.datasets.synthetic import generate_synthetic_lt

__all__ = [
    "SYNTHETIC_LT_OPTIONS",
    "AnnotationSource",
    "BuiltinDataset",
    "get_annotation_source",
    "get_builtin_datasets",
    "get_datasets_root",
    "get_required_files",
]

_SPLITS = ("train", "val")

SYNTHETIC_LT_OPTIONS: dict[str, Any] = {}
"""Keyword arguments for `generate_synthetic_lt` when ``synthetic_lt_*`` is generated on first use (tests
make it tiny); empty means the generator's defaults (1000 train / 250 val images)."""


def get_datasets_root() -> str:
    """``$LAZYTRAIN_DATASETS`` or ``./datasets``, as an absolute path."""
    return os.path.abspath(os.path.expanduser(os.environ.get("LAZYTRAIN_DATASETS", "./datasets")))


def _coco_files(split: str) -> tuple[str, str]:
    """(json file, image folder) of ``coco_2017_<split>``."""
    coco = os.path.join(get_datasets_root(), "coco")
    return os.path.join(coco, "annotations", f"instances_{split}2017.json"), os.path.join(
        coco, f"{split}2017"
    )


def _lvis_files(split: str) -> tuple[str, str]:
    """(json file, image root) of ``lvis_v1_<split>``: its file names are relative to coco/ (LVIS v1 val also
    uses COCO train2017 images)."""
    root = get_datasets_root()
    return os.path.join(root, "lvis", f"lvis_v1_{split}.json"), os.path.join(root, "coco")


def _coco_loader(split: str) -> Callable[[], Sequence[dict]]:
    def load() -> Sequence[dict]:
        return load_cached_json(*_coco_files(split), f"coco_2017_{split}", lvis=False)

    return load


def _lvis_loader(split: str) -> Callable[[], Sequence[dict]]:
    def load() -> Sequence[dict]:
        return load_cached_json(*_lvis_files(split), f"lvis_v1_{split}", lvis=True)

    return load


def _synthetic_loader(split: str) -> Callable[[], Sequence[dict]]:
    def load() -> Sequence[dict]:
        root = generate_synthetic_lt(
            os.path.join(get_datasets_root(), "synthetic_lt"), **SYNTHETIC_LT_OPTIONS
        )
        json_file = os.path.join(root, f"lvis_v1_{split}.json")
        return load_cached_json(json_file, root, f"synthetic_lt_{split}", lvis=True)

    return load


def get_required_files(name: str) -> list[str]:
    """The files and folders built-in data set `name` needs on disk, under ``$LAZYTRAIN_DATASETS`` (none for
    ``synthetic_lt_*``, generated on first use, and for names that are not built in)."""
    split = name.rsplit("_", 1)[-1]
    if name in (f"coco_2017_{s}" for s in _SPLITS):
        return list(_coco_files(split))
    if name in (f"lvis_v1_{s}" for s in _SPLITS):
        json_file, coco = _lvis_files(split)
        # LVIS v1 train's images are all COCO train2017 ones; val's come from train2017 and val2017.
        folders = ["train2017"] if split == "train" else ["train2017", "val2017"]
        return [json_file, *(os.path.join(coco, folder) for folder in folders)]
    return []


class AnnotationSource(NamedTuple):
    """What a json-backed data set reads: the json, the folder its images are under, and its format."""

    json_file: str
    image_root: str
    lvis: bool


def get_annotation_source(name: str) -> AnnotationSource | None:
    """The json, image root and format of built-in data set `name` (None for names that are not built in).

    The files need not exist (``synthetic_lt_*`` is generated on first use).
    """
    split = name.rsplit("_", 1)[-1]
    if split not in _SPLITS:
        return None
    if name == f"coco_2017_{split}":
        return AnnotationSource(*_coco_files(split), lvis=False)
    if name == f"lvis_v1_{split}":
        return AnnotationSource(*_lvis_files(split), lvis=True)
    if name == f"synthetic_lt_{split}":
        root = os.path.join(get_datasets_root(), "synthetic_lt")
        return AnnotationSource(os.path.join(root, f"lvis_v1_{split}.json"), root, lvis=True)
    return None


class BuiltinDataset(NamedTuple):
    """A built-in data set: its name, the function returning its records and its ``evaluator_type``."""

    name: str
    loader: Callable[[], Sequence[dict]]
    evaluator_type: str


def get_builtin_datasets() -> list[BuiltinDataset]:
    """Every built-in data set, with its loader (no I/O here: a loader finds its files when called)."""
    return [
        dataset
        for split in _SPLITS
        for dataset in (
            BuiltinDataset(f"coco_2017_{split}", _coco_loader(split), "coco"),
            BuiltinDataset(f"lvis_v1_{split}", _lvis_loader(split), "lvis"),
            BuiltinDataset(f"synthetic_lt_{split}", _synthetic_loader(split), "lvis"),
        )
    ]
