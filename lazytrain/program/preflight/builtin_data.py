"""Built-in data sets the config uses (``coco_2017_*``, ``lvis_v1_*``) must be on disk under
``$LAZYTRAIN_DATASETS`` before any process starts; ``synthetic_lt_*`` is generated on first use and a user's
json data set is checked by `lazytrain.program.preflight.json_data`."""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig

from lazytrain.config import tree
from lazytrain.data.datasets.builtin import get_required_files

__all__ = ["find_missing_data"]


def _dataset_names(cfg: DictConfig) -> list[str]:
    """The names of the registered data sets `cfg` loads or evaluates on (json data sets registered by the
    config itself are left out: they are checked by `json_data`)."""
    names = []
    for _, node in tree.nodes(cfg):
        if isinstance(node, DictConfig) and tree.has_children(node):
            names += _names_used_by(node)
    return names


def _names_used_by(node: DictConfig) -> list[str]:
    target = node.get("_target_", "") if "_target_" in node else ""
    if not isinstance(target, str):
        return []
    names = []
    if target.endswith("get_detection_dataset_dicts"):
        value = node.get("names")
        # Registering calls (json data sets, alone or in a list) are json_data's to check.
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, ListConfig):
            names += [name for name in value if isinstance(name, str)]
    if target.endswith("Evaluator") and isinstance(node.get("dataset_name"), str):
        names.append(node.get("dataset_name"))
    return names


def find_missing_data(cfg) -> list[str]:
    """One message per built-in data set the config uses whose files are missing (checked before any
    process is spawned)."""
    missing = []
    for name in dict.fromkeys(_dataset_names(cfg)):
        absent = [p for p in get_required_files(name) if not os.path.exists(p)]
        if absent:
            missing.append(
                f"data set '{name}' is not on disk; looked for: {', '.join(absent)}. Set LAZYTRAIN_DATASETS to the "
                "folder holding coco/ (train2017/, val2017/, annotations/) and lvis/ (lvis_v1_train.json, "
                "lvis_v1_val.json), see README 'Real data'. To try lazytrain without downloads, run the demo on "
                "the embedded data set: python -m lazytrain lazytrain://rfs_maskrcnn_demo"
            )
    return missing
