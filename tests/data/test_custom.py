"""A user's COCO/LVIS export through the custom recipe's blocks: summary, registration from config data,
loading, mapping and the long-tail evaluation, for each messy variant real exports have."""

import math
import os

import pytest
from omegaconf import OmegaConf

from lazytrain.config import LazyConfig, instantiate
from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.datasets.custom import bin_categories, get_image_count_limits, register_json_dataset
from lazytrain.data.datasets.json_summary import summarize_json
from lazytrain.data.mappers import DatasetMapper
from lazytrain.evaluation import LongTailEvaluator
from lazytrain.program.preflight.json_data import find_json_dataset_problems
from tests.data.custom_fixtures import CATEGORIES, VARIANTS, load, perfect_outputs, rewrite, write_export

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESSY = [v for v in VARIANTS if v != "box_only"]


def custom_config(paths: dict[str, str], conf: str = "rfs_maskrcnn_custom.py"):
    """The recipe with `paths` as data.* overrides; evaluator outputs go next to the jsons."""
    cfg = LazyConfig.load(os.path.join(REPO, "conf", conf))
    output_dir = os.path.join(os.path.dirname(paths.get("data.train.json", "/tmp/x")), "output")
    overrides = [f"{key}={value}" for key, value in paths.items()] + [f"train.output_dir={output_dir}"]
    return LazyConfig.apply_overrides(cfg, overrides)


@pytest.fixture
def fresh_catalog():
    """No custom data set registered, before the test (another test of this process, e.g. the custom recipe
    trained in-process by tests/conf/test_configs.py, may have registered them) and after it."""
    _unregister_custom()
    yield
    _unregister_custom()


def _unregister_custom() -> None:
    for name in ("custom_train", "custom_val"):
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_summary_of_an_export_with_non_contiguous_ids_and_an_unused_category(tmp_path):
    paths = write_export(str(tmp_path))
    summary = summarize_json(paths["data.train.json"])
    assert summary.categories == CATEGORIES  # sorted by id, id 0 included
    assert summary.class_image_count == {0: 4, 3: 2, 7: 4, 12: 2, 41: 0}
    assert (summary.num_images, summary.images_with_annotations, summary.num_annotations) == (8, 8, 12)
    assert summary.problems == [] and summary.without_segmentation == ([], 0)
    assert not summary.has_negative_category_ids and summary.json_frequency is None


def test_config_derives_num_classes_and_repeat_thresh_from_the_train_json(tmp_path):
    cfg = custom_config(write_export(str(tmp_path), num_train=40))
    assert cfg.model.num_classes == 5
    assert cfg.model.roi_heads.box_predictor.num_classes == 5
    assert cfg.dataloader.train.sampler.repeat_thresh == 1.0  # 100 / 40 images, at most 1
    rewrite(
        cfg.data.train.json,
        lambda data: (
            data["images"].extend(
                {"id": 10**6 + i, "file_name": "x.png", "width": 1, "height": 1} for i in range(1000)
            )
            or data["annotations"].extend(
                {"id": 10**6 + i, "image_id": 10**6 + i, "category_id": 3, "bbox": [0, 0, 1, 1]}
                for i in range(1000)
            )
        ),
    )
    assert cfg.dataloader.train.sampler.repeat_thresh == pytest.approx(100 / 1040, rel=0.01)


@pytest.mark.parametrize("variant", MESSY)
def test_messy_export_passes_preflight_loads_maps_and_evaluates_to_ap_100(variant, tmp_path, fresh_catalog):
    paths = write_export(str(tmp_path), variant)
    cfg = custom_config(paths)
    assert find_json_dataset_problems(cfg) == []
    cfg.dataloader.train.num_workers = 0
    train = instantiate(cfg.dataloader.train.dataset)
    assert len(train) == 8  # all train images are annotated
    mapper = DatasetMapper(is_train=True, use_instance_mask=True)
    for record in train:
        instances = mapper(record)["instances"]
        assert len(instances["classes"]) == len(record["annotations"]) > 0
        assert (instances["masks"].flatten(1).sum(1) > 0).all()
    val = instantiate(cfg.dataloader.test.dataset)
    assert len(val) == 5 and sum(not r["annotations"] for r in val) == 1  # the empty image is kept for eval
    evaluator = instantiate(cfg.dataloader.evaluator)
    assert isinstance(evaluator, LongTailEvaluator) and evaluator.protocol == "exhaustive"
    evaluator.reset()
    evaluator.process(*perfect_outputs(load(paths["data.val.json"])))
    results = evaluator.evaluate()
    for task in ("bbox", "segm"):
        assert results[task]["AP"] == pytest.approx(100.0)
        assert results[task]["APr"] == pytest.approx(100.0)  # every category is in <= 10 train images
        assert math.isnan(results[task]["APc"]) and math.isnan(results[task]["APf"])
    assert results["eval_protocol"] == {"exhaustive": 1.0}
    table = open(os.path.join(cfg.train.output_dir, "coco_per_category_ap.csv")).read().splitlines()
    assert table[1] == "0,zero,r,4,100.00,100.00" and table[5] == "41,unused,r,0,nan,nan"


def test_box_only_export_is_named_for_the_mask_recipe_and_trains_with_the_box_recipe(tmp_path, fresh_catalog):
    paths = write_export(str(tmp_path), "box_only")
    problems = find_json_dataset_problems(custom_config(paths))
    assert len(problems) == 2 and all("no annotation has a 'segmentation'" in p for p in problems)
    assert "lazytrain://rfs_fasterrcnn_custom" in problems[0] and paths["data.train.json"] in problems[0]
    cfg = custom_config(paths, "rfs_fasterrcnn_custom.py")
    assert find_json_dataset_problems(cfg) == []
    mapper = instantiate(cfg.dataloader.train.mapper)
    output = mapper(instantiate(cfg.dataloader.train.dataset)[0])
    assert "masks" not in output["instances"] and len(output["instances"]["boxes"]) > 0
    instantiate(cfg.dataloader.test.dataset)
    evaluator = instantiate(cfg.dataloader.evaluator)
    evaluator.reset()
    evaluator.process(*perfect_outputs(load(paths["data.val.json"])))
    results = evaluator.evaluate()
    assert set(results) == {"bbox", "eval_protocol"} and results["bbox"]["AP"] == pytest.approx(100.0)


def test_lvis_format_val_uses_the_federated_protocol_and_the_json_frequencies(tmp_path, fresh_catalog):
    paths = write_export(str(tmp_path))
    frequency = {0: "f", 3: "c", 7: "r", 12: "r", 41: "r"}

    def to_lvis(data):
        for category in data["categories"]:
            category["frequency"] = frequency[category["id"]]
        for image in data["images"]:
            present = {a["category_id"] for a in data["annotations"] if a["image_id"] == image["id"]}
            image["neg_category_ids"] = sorted({c for c, _ in CATEGORIES} - present)
            image["not_exhaustive_category_ids"] = []

    rewrite(paths["data.train.json"], to_lvis)
    rewrite(paths["data.val.json"], to_lvis)
    cfg = custom_config(paths)
    instantiate(cfg.dataloader.test.dataset)
    evaluator = instantiate(cfg.dataloader.evaluator)
    assert evaluator.protocol == "federated" and type(evaluator.evaluator).__name__ == "LVISEvaluator"
    assert MetadataCatalog.get("custom_val").class_frequency == ["f", "c", "r", "r", "r"]
    evaluator.reset()
    evaluator.process(*perfect_outputs(load(paths["data.val.json"])))
    results = evaluator.evaluate()
    assert results["segm"]["AP"] == pytest.approx(100.0) and results["segm"]["APf"] == pytest.approx(100.0)
    assert results["eval_protocol"] == {"federated": 1.0}


def test_frequency_thresholds_as_counts_or_fractions_of_the_train_images(tmp_path):
    summary = summarize_json(write_export(str(tmp_path))["data.train.json"])  # counts 4, 2, 4, 2, 0 of 8
    assert get_image_count_limits([10, 100], 8) == (10, 100)
    assert get_image_count_limits([0.25, 0.5], 8) == (2, 4)
    entries, rule = bin_categories(summary, [0.25, 0.5])
    assert [e["frequency"] for e in entries] == ["c", "r", "c", "r", "r"]
    assert "r <= 2, c <= 4" in rule
    entries, _ = bin_categories(summary, [1, 3])
    assert [e["frequency"] for e in entries] == ["f", "c", "f", "c", "r"]
    with pytest.raises(ValueError, match=r"frequency_thresholds must be \[rare, common\].*got \[100, 10\]"):
        get_image_count_limits([100, 10], 8)


def test_registration_travels_as_config_data_and_is_idempotent(tmp_path, fresh_catalog):
    paths = write_export(str(tmp_path))
    cfg = custom_config(paths)
    # What a spawned rank receives: resolved plain data, no registration made by the parent.
    container = OmegaConf.to_container(cfg.dataloader.test, resolve=True)
    assert container["dataset"]["names"]["_target_"].endswith("register_json_dataset")
    assert "custom_val" not in DatasetCatalog
    records = instantiate(OmegaConf.create(container).dataset)
    assert len(records) == 5 and MetadataCatalog.get("custom_val").thing_classes[0] == "zero"
    loader = DatasetCatalog._functions["custom_val"]
    again = instantiate(
        OmegaConf.create(container["dataset"]["names"])
    )  # a second build (sampler, evaluator)
    assert again == "custom_val" and DatasetCatalog._functions["custom_val"] is loader
    other = write_export(str(tmp_path / "other"), num_val=3)
    register_json_dataset(
        "custom_val", other["data.val.json"], other["data.val.images"]
    )  # the next sweep job
    assert len(DatasetCatalog.get("custom_val")) == 3
