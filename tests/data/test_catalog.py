import subprocess
import sys

import pytest

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog, UnknownDatasetError

BUILTIN = [
    f"{prefix}_{split}" for prefix in ("coco_2017", "lvis_v1", "synthetic_lt") for split in ("train", "val")
]


@pytest.fixture
def registered():
    names = []

    def register(name, func):
        DatasetCatalog.register(name, func)
        names.append(name)

    yield register
    for name in names:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_builtin_names_are_registered_by_importing_the_catalog_only():
    code = (
        "from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog; "
        "print(sorted(DatasetCatalog.list())); print(MetadataCatalog.get('lvis_v1_val').evaluator_type)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [str(sorted(BUILTIN)), "lvis"]


def test_register_get_remove(registered):
    registered("test_catalog_tiny", lambda: [{"image_id": 1}])
    assert "test_catalog_tiny" in DatasetCatalog
    assert DatasetCatalog.get("test_catalog_tiny") == [{"image_id": 1}]
    with pytest.raises(ValueError, match="'test_catalog_tiny' is already registered"):
        DatasetCatalog.register("test_catalog_tiny", list)
    DatasetCatalog.remove("test_catalog_tiny")
    assert "test_catalog_tiny" not in DatasetCatalog


def test_register_needs_a_callable():
    with pytest.raises(TypeError, match=r"DatasetCatalog.register\(func=\) must be callable"):
        DatasetCatalog.register("test_catalog_not_callable", [])


def test_unknown_name_lists_registered_names_closest_first():
    with pytest.raises(UnknownDatasetError) as info:
        DatasetCatalog.get("synthetic_lt_trian")
    message = str(info.value)
    assert "'synthetic_lt_trian' is not registered. Did you mean: synthetic_lt_train" in message
    listed = message.split("(closest first): ")[1].split(". Register")[0].split(", ")
    assert listed[0] == "synthetic_lt_train" and set(BUILTIN) <= set(listed)
    assert isinstance(info.value, KeyError)


def test_metadata_set_get_and_defaults():
    meta = MetadataCatalog.get("test_catalog_meta").set(thing_classes=["a"], evaluator_type="coco")
    assert MetadataCatalog.get("test_catalog_meta") is meta
    assert meta.thing_classes == ["a"] and meta.get("json_file") is None and meta.get("x", 3) == 3
    assert meta.as_dict() == {"name": "test_catalog_meta", "thing_classes": ["a"], "evaluator_type": "coco"}
    MetadataCatalog.remove("test_catalog_meta")
    assert MetadataCatalog.get("test_catalog_meta").get("thing_classes") is None
    MetadataCatalog.remove("test_catalog_meta")


def test_builtin_metadata_evaluator_types():
    assert MetadataCatalog.get("coco_2017_val").evaluator_type == "coco"
    assert MetadataCatalog.get("lvis_v1_train").evaluator_type == "lvis"
    assert MetadataCatalog.get("synthetic_lt_val").evaluator_type == "lvis"


def test_missing_builtin_data_names_path_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"lvis_v1_val\.json.*LAZYTRAIN_DATASETS=.*coco/annotations"):
        DatasetCatalog.get("lvis_v1_val")
    with pytest.raises(FileNotFoundError, match=r"instances_train2017\.json"):
        DatasetCatalog.get("coco_2017_train")


def test_preflight_names_missing_builtin_data(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from lazytrain.program.preflight.builtin_data import find_missing_data

    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    target = "lazytrain.data.build.get_detection_dataset_dicts"
    cfg = OmegaConf.create(
        {
            "dataloader": {
                "train": {"dataset": {"_target_": target, "names": ["lvis_v1_train", "synthetic_lt_train"]}},
                "evaluator": {
                    "_target_": "lazytrain.evaluation.LVISEvaluator",
                    "dataset_name": "lvis_v1_val",
                },
            }
        }
    )
    problems = find_missing_data(cfg)
    assert len(problems) == 2 and all("LAZYTRAIN_DATASETS" in p for p in problems)
    assert (
        "'lvis_v1_train' is not on disk" in problems[0] and str(tmp_path / "coco" / "val2017") in problems[1]
    )
    # LVIS v1 train needs COCO's train2017 images only; the demo is named as a wheel user can run it.
    assert str(tmp_path / "coco" / "val2017") not in problems[0]
    assert problems[0].endswith("python -m lazytrain lazytrain://rfs_maskrcnn_demo")
