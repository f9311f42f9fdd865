import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.datasets.coco import load_coco_json
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import ensure_synthetic_lt, generate_synthetic_lt


def write_json(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def coco_data():
    return {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 50, "height": 40},
            {"id": 2, "file_name": "b.jpg", "width": 30, "height": 30},
        ],
        "categories": [{"id": 7, "name": "cat"}, {"id": 3, "name": "dog"}],
        "annotations": [
            {
                "id": 10,
                "image_id": 1,
                "category_id": 7,
                "bbox": [1, 2, 10, 12],
                "segmentation": [[1, 2, 11, 2, 11, 14]],
                "iscrowd": 0,
            },
            {
                "id": 11,
                "image_id": 1,
                "category_id": 3,
                "bbox": [5, 5, 0, 3],
                "segmentation": [[5, 5, 6, 6, 5, 8]],
                "iscrowd": 0,
            },
            {
                "id": 12,
                "image_id": 2,
                "category_id": 3,
                "bbox": [0, 0, 5, 5],
                "segmentation": [[0, 0, 5, 0]],
                "iscrowd": 0,
            },
        ],
    }


def test_load_coco_json_records_and_metadata(tmp_path, caplog):
    path = write_json(tmp_path / "c.json", coco_data())
    with caplog.at_level("WARNING"):
        records = load_coco_json(path, str(tmp_path), "test_coco_tiny")
    assert [r["image_id"] for r in records] == [1, 2]
    assert records[0]["file_name"] == os.path.join(str(tmp_path), "a.jpg")
    assert records[0]["annotations"] == [
        {
            "bbox": [1, 2, 10, 12],
            "bbox_mode": "XYWH_ABS",
            "category_id": 1,
            "iscrowd": 0,
            "id": 10,
            "segmentation": [[1, 2, 11, 2, 11, 14]],
        }
    ]
    assert records[1]["annotations"] == []
    assert (
        "dropped 1 annotations left without a polygon, 1 degenerate boxes (w or h <= 0), 1 polygons with < 3 points"
        in caplog.text
    )
    meta = MetadataCatalog.get("test_coco_tiny")
    assert meta.thing_classes == ["dog", "cat"] and meta.thing_dataset_id_to_contiguous_id == {3: 0, 7: 1}


@pytest.mark.parametrize(
    "mutate, message",
    [
        pytest.param(
            lambda d: d["annotations"][0].update(category_id=99),
            "annotation id 10 has category_id 99",
            id="unknown-category",
        ),
        pytest.param(
            lambda d: d["annotations"][0].update(image_id=99),
            "annotation id 10 refers to image_id 99",
            id="unknown-image",
        ),
        pytest.param(
            lambda d: d["annotations"][1].update(id=10), "duplicate annotation id 10", id="duplicate-id"
        ),
    ],
)
def test_bad_annotations(tmp_path, mutate, message):
    data = coco_data()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        load_coco_json(write_json(tmp_path / "c.json", data), str(tmp_path))


def test_missing_and_malformed_json(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothere\.json.*LAZYTRAIN_DATASETS"):
        load_coco_json(str(tmp_path / "nothere.json"), str(tmp_path))
    (tmp_path / "bad.json").write_text('{"images": [\n  {"id": 1,,}]}')
    with pytest.raises(ValueError, match=r"bad\.json, line 2 column"):
        load_coco_json(str(tmp_path / "bad.json"), str(tmp_path))


def test_unknown_dataset_lists_registered_names():
    with pytest.raises(
        KeyError, match=r"'synthetic_lt_trian' is not registered\. Did you mean: synthetic_lt_train"
    ):
        DatasetCatalog.get("synthetic_lt_trian")


def test_synthetic_is_deterministic_and_long_tailed(tmp_path):
    a = generate_synthetic_lt(
        str(tmp_path / "a"), num_train=60, num_val=30, size_range=(64, 96), val_images_per_category=3
    )
    b = generate_synthetic_lt(
        str(tmp_path / "b"), num_train=60, num_val=30, size_range=(64, 96), val_images_per_category=3
    )
    assert (
        open(os.path.join(a, "lvis_v1_train.json")).read()
        == open(os.path.join(b, "lvis_v1_train.json")).read()
    )
    assert (
        open(os.path.join(a, "train", "000007.jpg"), "rb").read()
        == open(os.path.join(b, "train", "000007.jpg"), "rb").read()
    )
    records = load_lvis_json(os.path.join(a, "lvis_v1_train.json"), a, "synthetic_test_tiny")
    meta = MetadataCatalog.get("synthetic_test_tiny")
    assert len(meta.thing_classes) == 30 and meta.evaluator_type == "lvis"
    counts = sorted(c["image_count"] for c in meta.class_image_count)
    assert counts[0] <= 2 and counts[-1] >= 20
    # exhaustive annotation: every absent category is a verified negative
    for record in records:
        present = {a["category_id"] for a in record["annotations"]}
        assert set(record["neg_category_ids"]) == set(range(30)) - present


def test_default_synthetic_buckets_like_lvis(tmp_path):
    from lazytrain.data.datasets.synthetic import synthetic_category_plan

    plan = synthetic_category_plan(1000)
    buckets = [c["frequency"] for c in plan]
    assert (buckets.count("r"), buckets.count("c"), buckets.count("f")) == (8, 12, 10)


def test_concurrent_generation_ends_with_one_valid_data_set(tmp_path):
    code = (
        "import sys; from lazytrain.data.datasets.synthetic import ensure_synthetic_lt; "
        "ensure_synthetic_lt(sys.argv[1], num_train=30, num_val=30, size_range=(64, 80), val_images_per_category=2)"
    )
    root = str(tmp_path / "synthetic_lt")
    procs = [
        subprocess.Popen([sys.executable, "-c", code, root], stderr=subprocess.DEVNULL) for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(json.load(open(os.path.join(root, "lvis_v1_val.json")))["images"]) == 30
    assert [f for f in os.listdir(tmp_path) if f.startswith(".synthetic_lt.tmp")] == []


def test_builtin_synthetic_generated_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    import lazytrain.data.datasets.builtin as builtin

    monkeypatch.setattr(
        builtin,
        "ensure_synthetic_lt",
        lambda root: ensure_synthetic_lt(
            root, num_train=20, num_val=30, size_range=(64, 80), val_images_per_category=2
        ),
    )
    records = DatasetCatalog.get("synthetic_lt_val")
    assert len(records) == 30 and os.path.isfile(records[0]["file_name"])
    assert MetadataCatalog.get("synthetic_lt_val").json_file == str(
        tmp_path / "synthetic_lt" / "lvis_v1_val.json"
    )
    assert np.isclose(len(records), 30)
