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

__all__ = [
    "SYNTHETIC_LT_OPTIONS",
    "BuiltinDataset",
    "find_missing_data",
    "get_builtin_datasets",
    "get_datasets_root",
]

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


def _required_files(name: str) -> list[str]:
    root = get_datasets_root()
    split = name.rsplit("_", 1)[-1]
    if name.startswith("lvis_v1_"):
        return [
            os.path.join(root, "lvis", f"lvis_v1_{split}.json"),
            os.path.join(root, "coco", "train2017"),  # LVIS v1 val also uses COCO train2017 images
            os.path.join(root, "coco", "val2017"),
        ]
    if name.startswith("coco_2017_"):
        return [
            os.path.join(root, "coco", "annotations", f"instances_{split}2017.json"),
            os.path.join(root, "coco", f"{split}2017"),
        ]
    return []  # synthetic_lt is generated on first use; user data sets are checked when loaded


def _dataset_names(node) -> list[str]:
    from omegaconf import DictConfig, ListConfig

    names = []
    if isinstance(node, DictConfig):
        target = node.get("_target_", "") if "_target_" in node else ""
        if isinstance(target, str) and target.endswith("get_detection_dataset_dicts"):
            value = node.get("names")
            if isinstance(value, (str, ListConfig)):  # not a registering call (json data sets)
                names += [value] if isinstance(value, str) else list(value)
        if (
            isinstance(target, str)
            and target.endswith("Evaluator")
            and isinstance(node.get("dataset_name"), str)
        ):
            names.append(node.get("dataset_name"))
        for key in node:
            names += _dataset_names(node._get_node(key))
    elif isinstance(node, ListConfig):
        for item in node:
            names += _dataset_names(item)
    return names


def find_missing_data(cfg) -> list[str]:
    """One message per built-in data set the config uses whose files are missing (checked before any
    process is spawned)."""
    missing = []
    for name in dict.fromkeys(_dataset_names(cfg)):
        absent = [p for p in _required_files(name) if not os.path.exists(p)]
        if absent:
            missing.append(
                f"data set '{name}' is not on disk; looked for: {', '.join(absent)}. Set LAZYTRAIN_DATASETS to the "
                "folder holding coco/ (train2017/, val2017/, annotations/) and lvis/ (lvis_v1_train.json, "
                "lvis_v1_val.json), see README 'Real data'. To try lazytrain without downloads, run the demo on "
                "the embedded data set: python -m lazytrain conf/rfs_maskrcnn_demo.py"
            )
    return missing
