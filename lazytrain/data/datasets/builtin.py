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
