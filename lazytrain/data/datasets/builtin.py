"""Registration of the built-in data sets, found under ``$LAZYTRAIN_DATASETS`` (default ``./datasets``).

The variable is read each time a data set is loaded, not at import, so it may change between runs and tests.
Layout:

    $LAZYTRAIN_DATASETS/coco/{train2017,val2017}/*.jpg
    $LAZYTRAIN_DATASETS/coco/annotations/instances_{train,val}2017.json     -> coco_2017_{train,val}
    $LAZYTRAIN_DATASETS/lvis/lvis_v1_{train,val}.json (images from coco/)   -> lvis_v1_{train,val}
    $LAZYTRAIN_DATASETS/synthetic_lt/ (generated on first use)              -> synthetic_lt_{train,val}

This module lists them (`get_builtin_datasets`) and does not use the catalog, which the loaders use:
``import lazytrain.data`` hands the list to `lazytrain.data.catalog`, which registers it on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

from lazytrain.data.datasets.coco import load_coco_json
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import generate_synthetic_lt

__all__ = ["SYNTHETIC_LT_OPTIONS", "BuiltinDataset", "get_builtin_datasets", "get_datasets_root"]

SYNTHETIC_LT_OPTIONS: dict[str, Any] = {}
"""Keyword arguments for `generate_synthetic_lt` when ``synthetic_lt_*`` is generated on first use (tests
make it tiny); empty means the generator's defaults (1000 train / 250 val images)."""


def get_datasets_root() -> str:
    """``$LAZYTRAIN_DATASETS`` or ``./datasets``, as an absolute path."""
    return os.path.abspath(os.path.expanduser(os.environ.get("LAZYTRAIN_DATASETS", "./datasets")))


def _coco_loader(split: str) -> Callable[[], list[dict]]:
    def load() -> list[dict]:
        root = get_datasets_root()
        json_file = os.path.join(root, "coco", "annotations", f"instances_{split}2017.json")
        return load_coco_json(json_file, os.path.join(root, "coco", f"{split}2017"), f"coco_2017_{split}")

    return load


def _lvis_loader(split: str) -> Callable[[], list[dict]]:
    def load() -> list[dict]:
        root = get_datasets_root()
        json_file = os.path.join(root, "lvis", f"lvis_v1_{split}.json")
        return load_lvis_json(json_file, os.path.join(root, "coco"), f"lvis_v1_{split}")

    return load


def _synthetic_loader(split: str) -> Callable[[], list[dict]]:
    def load() -> list[dict]:
        root = generate_synthetic_lt(
            os.path.join(get_datasets_root(), "synthetic_lt"), **SYNTHETIC_LT_OPTIONS
        )
        return load_lvis_json(os.path.join(root, f"lvis_v1_{split}.json"), root, f"synthetic_lt_{split}")

    return load


class BuiltinDataset(NamedTuple):
    """A built-in data set: its name, the function returning its records and its ``evaluator_type``."""

    name: str
    loader: Callable[[], list[dict]]
    evaluator_type: str


def get_builtin_datasets() -> list[BuiltinDataset]:
    """Every built-in data set, with its loader (no I/O here: a loader finds its files when called)."""
    return [
        dataset
        for split in ("train", "val")
        for dataset in (
            BuiltinDataset(f"coco_2017_{split}", _coco_loader(split), "coco"),
            BuiltinDataset(f"lvis_v1_{split}", _lvis_loader(split), "lvis"),
            BuiltinDataset(f"synthetic_lt_{split}", _synthetic_loader(split), "lvis"),
        )
    ]
