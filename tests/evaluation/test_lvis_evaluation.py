import json
import math

import pytest
from pytest import param

from lazytrain.data.catalog import MetadataCatalog
from lazytrain.evaluation import LVISEvaluator
from lazytrain.evaluation.lvis_evaluation import get_frequency_bucket
from tests.evaluation.data import (
    CATEGORY_IDS,
    FREQUENCIES,
    IMAGE_COUNTS,
    ground_truth_as_outputs,
    make_ground_truth,
    write_json,
)

METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf")


@pytest.fixture
def lvis(tmp_path):
    data = make_ground_truth(num_images=8, seed=3, lvis=True)
    return data, write_json(data, tmp_path / "lvis.json")


def _run(evaluator, inputs, outputs):
    evaluator.reset()
    evaluator.process(inputs, outputs)
    return evaluator.evaluate()


def test_ground_truth_as_predictions_gives_perfect_ap(lvis, tmp_path):
    data, json_file = lvis
    results = _run(
        LVISEvaluator(json_file=json_file, output_dir=str(tmp_path)), *ground_truth_as_outputs(data)
    )
    for task in ("bbox", "segm"):
        assert set(results[task]) == set(METRICS)
        for name in ("AP", "AP50", "APr", "APc", "APf"):
            assert results[task][name] == pytest.approx(100.0), (task, name)
    rows = (tmp_path / "lvis_per_category_ap.csv").read_text().splitlines()
    assert rows[0] == "id,name,frequency,train_images,bbox_AP,segm_AP"
    for row in rows[1:]:
        category_id, _, frequency, count, *_ = row.split(",")
        assert frequency == FREQUENCIES[int(category_id)] and int(count) == IMAGE_COUNTS[int(category_id)]
    assert (tmp_path / "lvis_per_category_ap.md").read_text().startswith("| id | name | frequency")
    assert len(json.loads((tmp_path / "lvis_instances_results.json").read_text())) == len(data["annotations"])


def test_shuffled_labels_give_low_ap(lvis):
    data, json_file = lvis
    inputs, outputs = ground_truth_as_outputs(data, relabel=lambda c: (c + 1) % len(CATEGORY_IDS))
    results = _run(LVISEvaluator(json_file=json_file), inputs, outputs)
    assert results["bbox"]["AP"] < 5 and results["segm"]["AP"] < 5


def test_detections_of_unannotated_categories_are_ignored(lvis, tmp_path):
    # Federated protocol: a detection of a category neither annotated nor listed as negative in the image
    # is neither TP nor FP. Give every image a confident wrong-class duplicate of each detection.
    data, exhaustive_json = lvis
    inputs, outputs = ground_truth_as_outputs(data)
    for output in outputs:
        instances = output["instances"]
        for key in instances:
            instances[key] = instances[key].repeat_interleave(2, dim=0)
        instances["classes"][1::2] = (instances["classes"][1::2] + 1) % len(CATEGORY_IDS)
        instances["scores"][0::2] = 0.5  # the correct ones rank below the wrong ones
    for image in data["images"]:
        image["neg_category_ids"] = []
    federated_json = write_json(data, tmp_path / "no_negatives.json")
    exhaustive = _run(LVISEvaluator(json_file=exhaustive_json, tasks=("bbox",)), inputs, outputs)
    federated = _run(LVISEvaluator(json_file=federated_json, tasks=("bbox",)), inputs, outputs)
    assert exhaustive["bbox"]["AP"] < federated["bbox"]["AP"] - 10


def test_detections_are_capped_per_image_over_all_categories(lvis):
    data, json_file = lvis
    inputs, outputs = ground_truth_as_outputs(data)
    evaluator = LVISEvaluator(json_file=json_file, max_dets_per_image=1)
    evaluator.process(inputs, outputs)
    assert [prediction.num_detections for prediction in evaluator._predictions] == [1] * len(inputs)


def test_frequencies_come_from_image_counts_or_metadata(lvis, tmp_path):
    data, _ = lvis
    for category in data["categories"]:
        del category["frequency"]
    del data["categories"][0]["image_count"]  # category 1 only in the metadata
    json_file = write_json(data, tmp_path / "no_frequency.json")
    name = "test_lvis_evaluation_counts"
    MetadataCatalog.get(name).set(
        json_file=json_file, class_image_count=[{"id": 1, "image_count": 150, "frequency": "f"}]
    )
    try:
        results = _run(LVISEvaluator(name, tasks=("bbox",)), *ground_truth_as_outputs(data))
    finally:
        MetadataCatalog.remove(name)
    assert all(results["bbox"][name] == pytest.approx(100.0) for name in ("APr", "APc", "APf"))


def test_missing_frequency_is_an_error(lvis, tmp_path):
    data, _ = lvis
    for category in data["categories"]:
        del category["frequency"], category["image_count"]
    json_file = write_json(data, tmp_path / "bare.json")
    with pytest.raises(ValueError, match=r"has no 'frequency'"):
        _run(LVISEvaluator(json_file=json_file), *ground_truth_as_outputs(data))


def test_missing_bucket_reports_nan(lvis, tmp_path):
    data, _ = lvis
    for category in data["categories"]:
        category["frequency"] = "f"
    json_file = write_json(data, tmp_path / "all_frequent.json")
    results = _run(LVISEvaluator(json_file=json_file, tasks=("bbox",)), *ground_truth_as_outputs(data))
    assert math.isnan(results["bbox"]["APr"]) and results["bbox"]["APf"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("count", "bucket"),
    [
        param(1, "r", id="1"),
        param(10, "r", id="10"),
        param(11, "c", id="11"),
        param(100, "c", id="100"),
        param(101, "f", id="101"),
    ],
)
def test_frequency_buckets(count, bucket):
    assert get_frequency_bucket(count) == bucket
