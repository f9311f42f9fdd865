import json
import logging
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_util

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.datasets import builtin
from lazytrain.data.datasets.coco import load_coco_json
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import (
    CATEGORY_NAMES,
    CLUTTERED_STYLE,
    generate_synthetic_lt,
    synthetic_category_plan,
)
from lazytrain.data.datasets.synthetic_images import COLORS

TINY = dict(num_train=24, num_val=12, size_range=(64, 96), val_images_per_category=2, max_instances=8)


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return generate_synthetic_lt(str(tmp_path_factory.mktemp("synthetic") / "a"), **TINY)


@pytest.fixture(scope="module")
def tiny_cluttered(tmp_path_factory):
    return generate_synthetic_lt(
        str(tmp_path_factory.mktemp("synthetic") / "cluttered"), **{**CLUTTERED_STYLE, **TINY}
    )


def test_same_seed_same_bytes_different_seed_different_data(tiny, tmp_path):
    again = generate_synthetic_lt(str(tmp_path / "b"), **TINY)
    for name in ("lvis_v1_train.json", "lvis_v1_val.json", "train/000007.jpg", "val/000003.jpg"):
        assert read(os.path.join(tiny, name)) == read(os.path.join(again, name)), name
    other = generate_synthetic_lt(str(tmp_path / "c"), **TINY, seed=1)
    assert read(os.path.join(tiny, "lvis_v1_train.json")) != read(os.path.join(other, "lvis_v1_train.json"))


def test_output_does_not_depend_on_worker_count(tmp_path):
    settings = dict(num_train=60, num_val=8, size_range=(40, 48), val_images_per_category=1)
    one = generate_synthetic_lt(str(tmp_path / "one"), **settings, workers=1)
    two = generate_synthetic_lt(str(tmp_path / "two"), **settings, workers=2)
    for name in ("lvis_v1_train.json", "lvis_v1_val.json", "train/000059.jpg"):
        assert read(os.path.join(one, name)) == read(os.path.join(two, name)), name


def test_default_plan_has_lvis_like_buckets():
    plan = synthetic_category_plan(1000)
    assert [c["id"] for c in plan] == list(range(1, 31)) and [c["name"] for c in plan] == CATEGORY_NAMES
    by_bucket = {f: sorted(c["train_images"] for c in plan if c["frequency"] == f) for f in "rcf"}
    assert [len(by_bucket[f]) for f in "rcf"] == [8, 12, 10]  # 27 / 40 / 33 % (LVIS v1: 28 / 38 / 34 %)
    assert by_bucket["r"][0] == 1 and by_bucket["r"][-1] == 10
    assert by_bucket["c"][0] == 11 and by_bucket["c"][-1] == 100
    assert by_bucket["f"][0] == 101 and by_bucket["f"][-1] == 550
    for counts in by_bucket.values():  # power law: roughly constant ratio between neighbours
        ratios = np.diff(np.log(counts))
        assert ratios.min() >= 0 and ratios.max() < 3 * max(ratios.mean(), 0.1)
    assert synthetic_category_plan(1000, seed=1) != plan


@pytest.mark.parametrize("seed", range(5))
def test_rare_categories_are_spread_over_colours_and_shapes(seed):
    rare = [c["name"].split("_") for c in synthetic_category_plan(1000, seed) if c["frequency"] == "r"]
    assert len(rare) == 8
    assert max(Counter(color for color, _ in rare).values()) <= 2, rare
    assert max(Counter(shape for _, shape in rare).values()) <= 2, rare


def test_json_is_lvis_v1_and_exhaustive(tiny):
    plan = {c["id"]: c for c in synthetic_category_plan(TINY["num_train"])}
    train = json.load(open(os.path.join(tiny, "lvis_v1_train.json")))
    val = json.load(open(os.path.join(tiny, "lvis_v1_val.json")))
    for data in (train, val):
        present = {}
        for ann in data["annotations"]:
            present.setdefault(ann["image_id"], set()).add(ann["category_id"])
            assert ann["iscrowd"] == 0 and ann["area"] > 0 and all(len(p) >= 6 for p in ann["segmentation"])
        for image in data["images"]:
            assert image["not_exhaustive_category_ids"] == []
            assert set(image["neg_category_ids"]) == set(plan) - present[image["id"]]  # no empty image
            assert 64 <= min(image["width"], image["height"]) <= max(image["width"], image["height"]) <= 96
        assert Counter(len(v) for v in present.values()).keys() <= set(range(1, 9))
    image_count = Counter(
        c for ann in {(a["image_id"], a["category_id"]) for a in train["annotations"]} for c in [ann[1]]
    )
    for category in train["categories"]:
        assert category["image_count"] == image_count[category["id"]]
        assert category["frequency"] == plan[category["id"]]["frequency"]
    val_images = Counter(c for _, c in {(a["image_id"], a["category_id"]) for a in val["annotations"]})
    assert min(val_images[c] for c in plan) >= TINY["val_images_per_category"]


@pytest.mark.parametrize("style", ["tiny", "tiny_cluttered"])
def test_masks_match_the_pixels(style, request):
    """The visible region (segmentation) of every instance shows that instance's colour."""
    tiny = request.getfixturevalue(style)
    data = json.load(open(os.path.join(tiny, "lvis_v1_train.json")))
    images = {image["id"]: image for image in data["images"]}
    # The cluttered look's colours drift by up to 25 per channel (the default's by 10).
    limit = 60 if style == "tiny" else 75
    checked = 0
    for ann in data["annotations"]:
        image = images[ann["image_id"]]
        h, w = image["height"], image["width"]
        mask = mask_util.decode(mask_util.merge(mask_util.frPyObjects(ann["segmentation"], h, w))).astype(
            bool
        )
        assert abs(mask.sum() - ann["area"]) <= 0.25 * ann["area"] + 8
        ys, xs = np.nonzero(mask)
        x, y, bw, bh = ann["bbox"]
        assert (
            max(abs(xs.min() - x), abs(ys.min() - y), abs(xs.max() + 1 - x - bw), abs(ys.max() + 1 - y - bh))
            <= 2.0  # rasterization of small shrunk shapes
        )
        if mask.sum() < 40:  # a few pixels: mostly the darker outline and JPEG ringing, no clear colour
            continue
        pixels = np.asarray(Image.open(os.path.join(tiny, image["file_name"])).convert("RGB"))[mask]
        median = np.median(pixels, axis=0)
        distances = {name: np.abs(median - color).max() for name, color in COLORS.items()}
        expected = list(COLORS)[(ann["category_id"] - 1) % len(COLORS)]
        assert min(distances, key=distances.get) == expected and distances[expected] < limit, (
            ann["id"],
            median,
        )
        checked += 1
    assert checked > 40


def test_occluded_instances_are_clipped_polygons(tiny_cluttered):
    data = json.load(open(os.path.join(tiny_cluttered, "lvis_v1_train.json")))
    occluded = [a for a in data["annotations"] if len(a["segmentation"]) > 1]
    assert occluded, "expected some occlusion in the tiny set"


def test_both_loaders_read_it(tiny):
    lvis = load_lvis_json(os.path.join(tiny, "lvis_v1_val.json"), tiny, "test_synthetic_val")
    coco = load_coco_json(os.path.join(tiny, "lvis_v1_val.json"), tiny)
    assert [r["annotations"] for r in lvis] == [r["annotations"] for r in coco]
    meta = MetadataCatalog.get("test_synthetic_val")
    assert meta.thing_classes == CATEGORY_NAMES and meta.evaluator_type == "lvis"
    assert sorted(Counter(meta.class_frequency).items()) == [("c", 12), ("f", 10), ("r", 8)]
    assert os.path.isfile(lvis[0]["file_name"])
    MetadataCatalog.remove("test_synthetic_val")


def test_existing_data_set_is_reused_with_a_warning_on_other_settings(tiny, caplog):
    before = os.stat(os.path.join(tiny, "lvis_v1_train.json")).st_mtime_ns
    assert generate_synthetic_lt(tiny, **TINY) == tiny
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.datasets.synthetic"):
        generate_synthetic_lt(tiny, **{**TINY, "num_train": 25})
    assert "delete the folder to regenerate it" in caplog.text
    assert os.stat(os.path.join(tiny, "lvis_v1_train.json")).st_mtime_ns == before


def test_concurrent_generation_ends_with_one_valid_data_set(tmp_path):
    code = (
        "import sys; from lazytrain.data.datasets.synthetic import generate_synthetic_lt; "
        "generate_synthetic_lt(sys.argv[1], num_train=16, num_val=8, size_range=(48, 64), val_images_per_category=1)"
    )
    root = tmp_path / "synthetic_lt"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(root)], stderr=subprocess.PIPE) for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert sorted(os.listdir(tmp_path)) == ["synthetic_lt"]  # the losers removed their copies
    assert sorted(os.listdir(root)) == [
        "lvis_v1_train.json",
        "lvis_v1_val.json",
        "synthetic_lt.json",
        "train",
        "val",
    ]
    data = json.load(open(root / "lvis_v1_train.json"))
    assert len(data["images"]) == 16 and all((root / i["file_name"]).is_file() for i in data["images"])


def test_builtin_name_generates_on_first_use_under_env_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    monkeypatch.setattr(builtin, "SYNTHETIC_LT_OPTIONS", dict(TINY))
    records = DatasetCatalog.get("synthetic_lt_train")
    assert len(records) == TINY["num_train"] and os.path.isfile(records[0]["file_name"])
    assert all(r["annotations"] and "neg_category_ids" in r for r in records)
    meta = MetadataCatalog.get("synthetic_lt_train")
    assert meta.json_file == str(tmp_path / "synthetic_lt" / "lvis_v1_train.json")
    assert meta.evaluator_type == "lvis" and len(meta.class_image_count) == 30
    assert len(DatasetCatalog.get("synthetic_lt_val")) == TINY["num_val"]


def test_dataset_stats_script_prints_buckets_and_repeat_factors(tiny, capsys):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "dataset_stats.py")
    spec = importlib.util.spec_from_file_location("dataset_stats", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    try:
        script.main(["--root", tiny, "--repeat-thresh", "0.5"])
    finally:
        for split in ("train", "val"):
            DatasetCatalog.remove(f"dataset_stats_{split}")
            MetadataCatalog.remove(f"dataset_stats_{split}")
    out = capsys.readouterr().out
    assert f"train: {TINY['num_train']} images" in out and f"val: {TINY['num_val']} images" in out
    assert "| r | 8 (27%) |" in out and "| c | 12 (40%) |" in out and "| f | 10 (33%) |" in out
    assert any(line.startswith("| 0.5 | ") for line in out.splitlines())  # the t=0.5 row of the RFS table


def test_incomplete_folder_in_the_way_is_reported(tmp_path):
    (tmp_path / "synthetic_lt" / "train").mkdir(parents=True)
    with pytest.raises(OSError, match=r"synthetic_lt exists but holds no complete data set.*delete it"):
        generate_synthetic_lt(str(tmp_path / "synthetic_lt"), **TINY)
    assert sorted(os.listdir(tmp_path)) == ["synthetic_lt"]


def _overlap(a, b):
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def test_default_style_has_no_occlusion_and_grey_backgrounds(tiny, tiny_cluttered):
    """The default look: instances never overlap and backgrounds are grey with a mild tint; the cluttered
    style keeps occlusion and multi-hue backgrounds (the assertions fail if the two are swapped)."""
    for root, cluttered in ((tiny, False), (tiny_cluttered, True)):
        data = json.load(open(os.path.join(root, "lvis_v1_train.json")))
        boxes = {}
        for ann in data["annotations"]:
            boxes.setdefault(ann["image_id"], []).append(ann["bbox"])
        overlapping = [
            any(_overlap(a, b) for i, a in enumerate(group) for b in group[i + 1 :])
            for group in boxes.values()
        ]
        assert any(overlapping) == cluttered
        # The spread between colour channels of each image's median pixel (mostly background).
        spreads = []
        for image in data["images"]:
            pixels = np.asarray(Image.open(os.path.join(root, image["file_name"])).convert("RGB"), np.float32)
            median = np.median(pixels.reshape(-1, 3), axis=0)
            spreads.append(float(median.max() - median.min()))
        if cluttered:
            assert np.median(spreads) > 30, spreads
        else:
            assert max(spreads) <= 2 * 10 + 8, spreads  # tint of +-10 per channel, plus JPEG and noise


@pytest.mark.parametrize("max_rotation, upright", [(0, True), (180, False)])
def test_max_rotation_turns_the_shapes(tmp_path, max_rotation, upright):
    """Squares (category ids 6-10) have axis-aligned outlines only when rotation is off."""
    root = generate_synthetic_lt(str(tmp_path / "r"), **{**TINY, "max_rotation": max_rotation})
    data = json.load(open(os.path.join(root, "lvis_v1_train.json")))
    squares = [a["segmentation"][0] for a in data["annotations"] if 6 <= a["category_id"] <= 10]
    assert squares
    aligned = [len({round(x, 1) for x in polygon[0::2]}) == 2 for polygon in squares]
    assert all(aligned) if upright else not any(aligned)
