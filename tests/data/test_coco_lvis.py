import copy
import json
import logging
import os

import pytest

from lazytrain.data.catalog import MetadataCatalog
from lazytrain.data.datasets.coco import load_coco_json
from lazytrain.data.datasets.lvis import load_lvis_json

COCO = {
    "images": [
        {"id": 1, "file_name": "a.jpg", "width": 50, "height": 40},
        {"id": 2, "file_name": "b.jpg", "width": 30, "height": 30},
        {"id": 3, "file_name": "c.jpg", "width": 30, "height": 20},
    ],
    "categories": [{"id": 7, "name": "cat"}, {"id": 3, "name": "dog"}],
    "annotations": [
        {
            "id": 10,
            "image_id": 1,
            "category_id": 7,
            "bbox": [1, 2, 10, 12],
            "iscrowd": 0,
            "area": 60,
            "segmentation": [[1, 2, 11, 2, 11, 14]],
        },
        {
            "id": 11,
            "image_id": 2,
            "category_id": 3,
            "bbox": [0, 0, 5, 5],
            "iscrowd": 1,
            "segmentation": {"size": [30, 30], "counts": "0c0"},
        },
        {
            "id": 12,
            "image_id": 2,
            "category_id": 7,
            "bbox": [2, 2, 4, 4],
            "iscrowd": 0,
            "segmentation": [[2, 2, 6, 2, 6, 6], [1, 1, 2]],
        },
    ],
}


def lvis_data():
    data = copy.deepcopy(COCO)
    for image in data["images"]:
        image["coco_url"] = f"http://images.cocodataset.org/val2017/{image.pop('file_name')}"
        image["not_exhaustive_category_ids"] = [3]
        image["neg_category_ids"] = [7, 99]  # ids unknown to 'categories' are ignored
    data["categories"][0].update(frequency="r", image_count=2)
    data["categories"][1].update(frequency="f", image_count=150)
    for ann in data["annotations"]:
        ann.pop("iscrowd")
    return data


def write(tmp_path, data, name="ann.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def metadata_name():
    yield "test_coco_lvis_tiny"
    MetadataCatalog.remove("test_coco_lvis_tiny")


def test_coco_records_and_metadata(tmp_path, metadata_name):
    records = load_coco_json(write(tmp_path, COCO), "/images", metadata_name)
    assert [(r["image_id"], r["file_name"], r["height"], r["width"]) for r in records] == [
        (1, os.path.join("/images", "a.jpg"), 40, 50),
        (2, os.path.join("/images", "b.jpg"), 30, 30),
        (3, os.path.join("/images", "c.jpg"), 20, 30),
    ]
    assert records[0]["annotations"] == [
        {
            "bbox": [1, 2, 10, 12],
            "bbox_mode": "XYWH_ABS",
            "category_id": 1,
            "iscrowd": 0,
            "segmentation": [[1, 2, 11, 2, 11, 14]],
        }
    ]
    crowd, polygon = records[1]["annotations"]
    assert crowd["segmentation"] == {"size": [30, 30], "counts": "0c0"} and crowd["iscrowd"] == 1
    assert crowd["category_id"] == 0 and polygon["segmentation"] == [[2, 2, 6, 2, 6, 6]]
    assert records[2]["annotations"] == []
    meta = MetadataCatalog.get(metadata_name)
    assert meta.thing_classes == ["dog", "cat"]
    assert meta.thing_dataset_id_to_contiguous_id == {3: 0, 7: 1}
    assert (meta.json_file, meta.image_root, meta.evaluator_type) == (
        str(tmp_path / "ann.json"),
        "/images",
        "coco",
    )


def test_degenerate_boxes_and_short_polygons_dropped_with_one_warning(tmp_path, caplog):
    data = copy.deepcopy(COCO)
    data["annotations"] += [
        {
            "id": 20,
            "image_id": 1,
            "category_id": 3,
            "bbox": [5, 5, 0, 3],
            "segmentation": [[5, 5, 6, 6, 5, 8]],
        },
        {
            "id": 21,
            "image_id": 1,
            "category_id": 3,
            "bbox": [5, 5, 3, -1],
            "segmentation": [[5, 5, 6, 6, 5, 8]],
        },
        {"id": 22, "image_id": 3, "category_id": 3, "bbox": [0, 0, 5, 5], "segmentation": [[0, 0, 5, 0]]},
    ]
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.datasets.coco"):
        records = load_coco_json(write(tmp_path, data), str(tmp_path))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (
        warnings[0]
        .getMessage()
        .endswith(
            "dropped 1 annotations left without a polygon, 2 degenerate boxes (w or h <= 0), 2 polygons with < 3 points."
        )
    )
    assert [len(r["annotations"]) for r in records] == [1, 2, 0]


@pytest.mark.parametrize(
    "mutate, message",
    [
        pytest.param(
            lambda d: d["annotations"][1].update(category_id=99),
            r"annotation id 11 has category_id 99, which is not in 'categories'",
            id="unknown-category",
        ),
        pytest.param(
            lambda d: d["annotations"][2].update(image_id=42),
            r"annotation id 12 refers to image_id 42, which is not in 'images'",
            id="unknown-image",
        ),
        pytest.param(
            lambda d: d["annotations"][2].update(id=10), r"duplicate annotation id 10", id="duplicate-id"
        ),
        pytest.param(lambda d: d.pop("categories"), r"has no 'categories' list", id="no-categories"),
    ],
)
@pytest.mark.parametrize("loader", [load_coco_json, load_lvis_json], ids=["coco", "lvis"])
def test_bad_annotations_name_the_annotation(tmp_path, mutate, message, loader):
    data = copy.deepcopy(COCO)
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(
        ValueError, match=rf"{path}: .*{message}" if "categories' list" not in message else message
    ):
        loader(path, str(tmp_path))


@pytest.mark.parametrize("loader", [load_coco_json, load_lvis_json], ids=["coco", "lvis"])
def test_missing_file_names_path_env_and_layout(tmp_path, monkeypatch, loader):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    missing = str(tmp_path / "lvis" / "lvis_v1_val.json")
    with pytest.raises(FileNotFoundError) as info:
        loader(missing, str(tmp_path))
    message = str(info.value)
    assert missing in message and f"LAZYTRAIN_DATASETS={str(tmp_path)!r}" in message
    assert "coco/annotations/instances_{train,val}2017.json" in message


@pytest.mark.parametrize("loader", [load_coco_json, load_lvis_json], ids=["coco", "lvis"])
def test_malformed_json_gives_line_and_column(tmp_path, loader):
    path = tmp_path / "bad.json"
    path.write_text('{"images": [\n  {"id": 1,, "file_name": "a.jpg"}]}')
    with pytest.raises(ValueError, match=r"malformed JSON in .*bad\.json, line 2 column 12"):
        loader(str(path), str(tmp_path))


def test_lvis_records_federated_fields_and_metadata(tmp_path, metadata_name):
    records = load_lvis_json(write(tmp_path, lvis_data()), "/coco", metadata_name)
    assert records[0]["file_name"] == os.path.join("/coco", "val2017/a.jpg")
    assert records[0]["neg_category_ids"] == [1] and records[0]["not_exhaustive_category_ids"] == [0]
    assert records[0]["annotations"][0]["iscrowd"] == 0 and records[0]["annotations"][0]["category_id"] == 1
    meta = MetadataCatalog.get(metadata_name)
    assert meta.evaluator_type == "lvis" and meta.thing_classes == ["dog", "cat"]
    assert meta.class_image_count == [
        {"id": 3, "image_count": 150, "frequency": "f"},
        {"id": 7, "image_count": 2, "frequency": "r"},
    ]
    assert meta.class_frequency == ["f", "r"]


def test_lvis_loader_computes_missing_image_counts(tmp_path, metadata_name):
    load_lvis_json(write(tmp_path, COCO), "/coco", metadata_name)  # plain COCO json: no frequency/image_count
    assert MetadataCatalog.get(metadata_name).class_image_count == [
        {"id": 3, "image_count": 1, "frequency": "r"},
        {"id": 7, "image_count": 2, "frequency": "r"},
    ]


def test_coco_loader_reads_lvis_files(tmp_path):
    data = lvis_data()
    for image in data["images"]:
        image["file_name"] = image["coco_url"].split("/")[-1]
    records = load_coco_json(write(tmp_path, data), str(tmp_path))
    assert [len(r["annotations"]) for r in records] == [1, 2, 0] and "neg_category_ids" not in records[0]
