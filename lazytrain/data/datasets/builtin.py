"""Registration of the built-in data sets under ``$LAZYTRAIN_DATASETS`` (default ``./datasets``).

Layout expected (read at lookup time, so the variable can change between runs/tests):

    $LAZYTRAIN_DATASETS/coco/{train2017,val2017}/  and  coco/annotations/instances_{train,val}2017.json
    $LAZYTRAIN_DATASETS/lvis/lvis_v1_{train,val}.json  (images from coco/train2017 and coco/val2017)
    $LAZYTRAIN_DATASETS/synthetic_lt/   (generated on first use)
"""

from __future__ import annotations

import os

from lazytrain.data.datasets.coco import load_coco_json
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import ensure_synthetic_lt

__all__ = ["get_datasets_root", "register_all"]

_REGISTERED = False


def get_datasets_root() -> str:
    """``$LAZYTRAIN_DATASETS`` or ``./datasets``, as an absolute path."""
    return os.path.abspath(os.path.expanduser(os.environ.get("LAZYTRAIN_DATASETS", "./datasets")))


def _coco(split: str):
    def load():
        root = get_datasets_root()
        json_file = os.path.join(root, "coco", "annotations", f"instances_{split}2017.json")
        return load_coco_json(json_file, os.path.join(root, "coco", f"{split}2017"), f"coco_2017_{split}")

    return load


def _lvis(split: str):
    def load():
        root = get_datasets_root()
        return load_lvis_json(os.path.join(root, "lvis", f"lvis_v1_{split}.json"), os.path.join(root, "coco"), f"lvis_v1_{split}")

    return load


def _synthetic(split: str):
    def load():
        root = ensure_synthetic_lt(os.path.join(get_datasets_root(), "synthetic_lt"))
        return load_lvis_json(os.path.join(root, f"lvis_v1_{split}.json"), root, f"synthetic_lt_{split}")

    return load


def synthetic_json_file(split: str) -> str:
    """The synthetic_lt annotation file of `split`, generating the data set first if needed."""
    root = ensure_synthetic_lt(os.path.join(get_datasets_root(), "synthetic_lt"))
    return os.path.join(root, f"lvis_v1_{split}.json")


def register_all() -> None:
    """Register every built-in name once (no I/O happens here)."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog

    for split in ("train", "val"):
        DatasetCatalog.register(f"coco_2017_{split}", _coco(split))
        DatasetCatalog.register(f"lvis_v1_{split}", _lvis(split))
        DatasetCatalog.register(f"synthetic_lt_{split}", _synthetic(split))
        MetadataCatalog.get(f"coco_2017_{split}").set(evaluator_type="coco")
        MetadataCatalog.get(f"lvis_v1_{split}").set(evaluator_type="lvis")
        MetadataCatalog.get(f"synthetic_lt_{split}").set(evaluator_type="lvis")


def _required_files(name: str) -> list[str]:
    root = get_datasets_root()
    split = name.rsplit("_", 1)[-1]
    if name.startswith("lvis_v1_"):
        return [os.path.join(root, "lvis", f"lvis_v1_{split}.json"), os.path.join(root, "coco", f"{split}2017")]
    if name.startswith("coco_2017_"):
        return [os.path.join(root, "coco", "annotations", f"instances_{split}2017.json"), os.path.join(root, "coco", f"{split}2017")]
    return []  # synthetic_lt is generated on first use; user data sets are checked when loaded


def _dataset_names(node) -> list[str]:
    from omegaconf import DictConfig, ListConfig

    names = []
    if isinstance(node, DictConfig):
        target = node.get("_target_", "") if "_target_" in node else ""
        if isinstance(target, str) and target.endswith("get_detection_dataset_dicts"):
            value = node.get("names")
            names += [value] if isinstance(value, str) else list(value or [])
        if isinstance(target, str) and target.endswith("Evaluator") and isinstance(node.get("dataset_name"), str):
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
