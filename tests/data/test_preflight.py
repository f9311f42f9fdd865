"""Each problem of a user's json data set is found before any process starts, as one message naming the file
and the fix; a 100k-image json is checked well under a second."""

import json
import os
import re
import time

import pytest

from lazytrain.data.datasets import json_summary
from lazytrain.program.preflight.json_data import find_json_dataset_problems
from tests.data.custom_fixtures import rewrite, write_export
from tests.data.test_custom import REPO, custom_config
from tests.warm_command import run_warm


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return write_export(str(tmp_path_factory.mktemp("export")))


def problems_after(export, tmp_path, change_train=None, change_val=None, **overrides) -> list[str]:
    """Copy the export's jsons, apply the changes, and return the preflight problems of the custom recipe."""
    paths = dict(export)
    for split, change in (("train", change_train), ("val", change_val)):
        copy = str(tmp_path / f"{split}.json")
        with open(export[f"data.{split}.json"]) as f, open(copy, "w") as out:
            out.write(f.read())
        if change:
            rewrite(copy, change)
        paths[f"data.{split}.json"] = copy
    paths.update(overrides)
    return find_json_dataset_problems(custom_config(paths))


def drop_first_image_file(data):
    data["images"][0]["file_name"] = "train/missing_0.png"
    data["images"][1]["file_name"] = "nowhere/missing_1.png"


def _add_category(data):
    data["categories"].append({"id": 99, "name": "extra"})


def _rename_category(data):
    data["categories"][0]["name"] = "renamed"


def _orphan_annotations(data):
    data["annotations"][0]["image_id"] = 12345
    data["annotations"][1]["category_id"] = 555


def _strings_for_numbers(data):
    # What real exports hold: numbers written as strings.
    data["annotations"][0]["bbox"] = [str(v) for v in data["annotations"][0]["bbox"]]
    data["annotations"][1]["bbox"] = "1,2,3,4"
    data["annotations"][2]["category_id"] = str(data["annotations"][2]["category_id"])
    data["images"][0]["width"] = str(data["images"][0]["width"])


def _null_segmentation(data):
    data["annotations"][0]["segmentation"] = None
    data["annotations"][1]["segmentation"] = []


def _strip(key, where="annotations", count=1):
    def change(data):
        for entry in data[where][:count]:
            entry.pop(key)

    return change


CASES = [
    pytest.param(
        dict(change_train=drop_first_image_file),
        [
            r"train.json: 2 of 8 images are missing under data.train.images=\S+ \(first: "
            r"train/missing_0.png, nowhere/missing_1.png\); fix data.train.images or the images' 'file_name'"
        ],
        id="missing-images",
    ),
    pytest.param(
        {"data.val.images": "/no/such/folder"},
        [
            r"data.val.images=/no/such/folder: no such folder; pass the folder that the 'file_name' entries of "
        ],
        id="missing-image-folder",
    ),
    pytest.param(
        {"data.train.json": "/no/such/train.json"},
        [r"data.train.json=/no/such/train.json: no such file; pass the path of the COCO/LVIS json"],
        id="missing-json",
    ),
    pytest.param(
        dict(change_val=_add_category),
        [
            r"val.json: its categories differ from those of \S+train.json \(as \(id, name\); only in val: "
            r"\[\(99, 'extra'\)\], only in train: \[\]\); export both splits with the same category list"
        ],
        id="val-has-an-extra-category",
    ),
    pytest.param(
        dict(change_val=_rename_category),
        [r"only in val: \[\(0, 'renamed'\)\], only in train: \[\(0, 'zero'\)\]"],
        id="val-renames-a-category",
    ),
    pytest.param(
        dict(change_train=_orphan_annotations),
        [
            r"train.json: 1 annotations whose image_id is not in 'images' \(first ids: 1000 \(image_id 12345\)\); "
            r"remove those",
            r"train.json: 1 annotations whose category_id is not in 'categories' \(first ids: 1001 "
            r"\(category_id 555\)\)",
        ],
        id="annotations-pointing-nowhere",
    ),
    pytest.param(
        dict(change_train=_strip("bbox")),
        [r"train.json: 1 annotations without 'bbox' \(first ids: 1000\); give every annotation a 'bbox'"],
        id="annotation-without-bbox",
    ),
    pytest.param(
        dict(change_train=_strings_for_numbers),
        [
            r"train.json: 1 images whose 'height'/'width' is not a positive number \(first ids: \d+ \(\d+ x "
            r"\"\d+\"\)\); write each image's 'height' and 'width' as numbers",
            r"train.json: 1 annotations whose category_id is not in 'categories' \(first ids: 1002 "
            r"\(category_id \"\d+\"\)\); remove those annotations or add their categories \(an id in quotes is a "
            r"string, not the number\)\.",
            r"train.json: 2 annotations whose 'bbox' is not 4 numbers \(first ids: 1000 \(\[\"[\d.]+\",.*\]\), "
            r"1001 \(\"1,2,3,4\"\)\); write every 'bbox' as \[x, y, width, height\]",
        ],
        id="numbers-written-as-strings",
    ),
    pytest.param(
        dict(change_train=_strip("segmentation", count=2)),
        [
            r"train.json: 2 of 12 annotations have no 'segmentation' \(first ids: 1000, 1001\), and this recipe "
            r"trains masks; give them polygons or RLE, or drop them. For a box-only data set train Faster R-CNN"
        ],
        id="some-annotations-without-masks",
    ),
    pytest.param(
        dict(change_train=_null_segmentation),
        [r"train.json: 2 of 12 annotations have no 'segmentation' \(first ids: 1000, 1001\)"],
        id="null-or-empty-masks",
    ),
    pytest.param(
        dict(change_val=_strip("height", where="images")),
        [r"val.json: 1 images without 'height'/'width' \(first ids: 100\); give every image its 'height'"],
        id="image-without-size",
    ),
    pytest.param(
        dict(change_val=_strip("file_name", where="images")),
        [r"val.json: 1 images without 'file_name' \(first ids: 100\)"],
        id="image-without-file-name",
    ),
    pytest.param(
        dict(change_train=lambda data: data.update(annotations=[])),
        [r"train.json: has no annotations; a train set needs annotated images"],
        id="train-without-annotations",
    ),
]


@pytest.mark.parametrize("changes, expected", CASES)
def test_each_problem_is_one_message_naming_the_file_and_the_fix(export, tmp_path, changes, expected):
    json_summary._cache.clear()
    overrides = {k: v for k, v in changes.items() if k.startswith("data.")}
    edits = {k: v for k, v in changes.items() if not k.startswith("data.")}
    problems = problems_after(export, tmp_path, **edits, **overrides)
    assert len(problems) == len(expected), problems
    for pattern, problem in zip(expected, problems):
        assert re.search(pattern, problem), problem


def test_malformed_json_names_line_and_column(export, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [\n  {"id": 1,, "file_name": "a.png"}\n]}')
    problems = problems_after(export, tmp_path, **{"data.train.json": str(bad)})
    assert any(
        f"data.train.json: {bad}: malformed JSON, line 2 column 12: object keys must be strings. " in p
        and "re-export or re-download it" in p
        for p in problems
    ), problems


def test_a_json_that_is_not_coco_format_says_what_is_expected(export, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"images": {"1": "a.png"}, "categories": []}))
    (problem,) = [
        p for p in problems_after(export, tmp_path, **{"data.train.json": str(bad)}) if str(bad) in p
    ]
    assert (
        "not a COCO-format annotation file (Expected `array | null`, got `object` - at `$.images`)" in problem
    )


def test_unset_paths_are_named_with_the_key_to_pass():
    problems = find_json_dataset_problems(custom_config({}))
    assert problems == [
        f"data.{split}.{key} is not set; pass data.{split}.{key}=PATH on the command line."
        for split in ("train", "val")
        for key in ("json", "images")
    ]
    assert find_json_dataset_problems(custom_config({}), skip_unset=True) == []


def test_command_stops_before_hydra_writes_anything(export, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [f"{k}={v}" for k, v in export.items() if k != "data.val.images"]
    result = run_warm(
        [os.path.join(REPO, "conf", "rfs_maskrcnn_custom.py"), *overrides,
         "data.val.images=/no/such/folder", f"hydra.run.dir={run_dir}", "train.device=cpu"],
        os.getcwd(), dict(os.environ, PYTHONPATH=REPO), timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        "lazytrain: the data set files have problems:\n  data.val.images=/no/such/folder: no such folder"
        in (result.stderr)
    )
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_100k_image_json_is_checked_for_a_fraction_of_what_loading_it_costs(tmp_path):
    # Written as text: building 400k dicts for json.dumps would take longer than the check under test.
    image = '{{"id": {0}, "file_name": "{1:03d}/{0:06d}.jpg", "height": 480, "width": 640}}'
    annotation = (
        '{{"id": {0}, "image_id": {1}, "category_id": {2}, "bbox": [{3}.5, 1.5, 40.0, 30.0], "area": 1200.0, '
        '"iscrowd": 0, "segmentation": [[{3}.5, 1.5, {4}.5, 1.5, {4}.5, 31.5, {3}.5, 31.5]]}}'
    )
    images = ",".join(image.format(i, i // 1000) for i in range(100_000))
    annotations = ",".join(
        annotation.format(3 * i + k, i, (7 * i + k) % 300, i % 500, i % 500 + 40)
        for i in range(100_000)
        for k in range(3)
    )
    categories = ",".join(f'{{"id": {c}, "name": "c{c}"}}' for c in range(300))
    path = tmp_path / "big.json"
    path.write_text(f'{{"images": [{images}], "annotations": [{annotations}], "categories": [{categories}]}}')
    for folder in range(100):
        os.makedirs(tmp_path / "images" / f"{folder:03d}")
        for i in range(folder * 1000, folder * 1000 + 1000):
            (tmp_path / "images" / f"{folder:03d}" / f"{i:06d}.jpg").touch()
    paths = {f"data.{s}.json": str(path) for s in ("train", "val")}
    paths.update({f"data.{s}.images": str(tmp_path / "images") for s in ("train", "val")})
    cfg = custom_config(paths)
    # Against what reading the file into Python objects costs, measured here and now: CPU times of this
    # process both, so the load of the machine moves the two together.
    loading = time.process_time()
    json.loads(path.read_bytes())
    loading = time.process_time() - loading
    json_summary._cache.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    assert find_json_dataset_problems(cfg) == []
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"preflight of {path.stat().st_size / 1e6:.0f} MB, 100k images: {wall:.2f} s wall, {cpu:.2f} s CPU; "
        f"json.loads of the file: {loading:.2f} s CPU"
    )
    assert cpu < 0.5 * loading  # it never builds the records (docs/benchmarks.md has the times)
