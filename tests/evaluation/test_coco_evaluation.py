import json
import logging
import math

import numpy as np
import pytest
import torch
from pytest import param

from lazytrain.data.catalog import MetadataCatalog
from lazytrain.evaluation import COCOEvaluator, instances_to_coco_json
from tests.evaluation.data import CATEGORY_IDS, ground_truth_as_outputs, make_ground_truth, write_json

METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


@pytest.fixture
def coco(tmp_path):
    data = make_ground_truth()
    return data, write_json(data, tmp_path / "gt.json")


def _run(evaluator, inputs, outputs, batch=2):
    evaluator.reset()
    for start in range(0, len(inputs), batch):
        evaluator.process(inputs[start : start + batch], outputs[start : start + batch])
    return evaluator.evaluate()


@pytest.mark.parametrize(
    "backend", [param("faster_coco_eval", id="faster"), param("pycocotools", id="pycocotools")]
)
def test_ground_truth_as_predictions_gives_perfect_ap(coco, tmp_path, backend):
    data, json_file = coco
    evaluator = COCOEvaluator(json_file=json_file, output_dir=str(tmp_path / "out"), backend=backend)
    results = _run(evaluator, *ground_truth_as_outputs(data))
    assert set(results) == {"bbox", "segm"}
    for task in ("bbox", "segm"):
        assert set(results[task]) == set(METRICS)
        assert results[task]["AP"] == pytest.approx(100.0)
        assert results[task]["AP50"] == pytest.approx(100.0)
        for name in METRICS:  # every area range is either perfect or has no ground truth
            assert math.isnan(results[task][name]) or results[task][name] == pytest.approx(100.0)
    written = json.loads((tmp_path / "out" / "coco_instances_results.json").read_text())
    assert len(written) == len(data["annotations"])
    assert {entry["category_id"] for entry in written} <= set(CATEGORY_IDS)
    table = (tmp_path / "out" / "coco_per_category_ap.csv").read_text().splitlines()
    assert table[0] == "id,name,frequency,train_images,bbox_AP,segm_AP"
    assert len(table) == 1 + len(CATEGORY_IDS)


def test_shuffled_labels_give_low_ap(coco):
    data, json_file = coco
    inputs, outputs = ground_truth_as_outputs(data, relabel=lambda c: (c + 1) % len(CATEGORY_IDS))
    results = _run(COCOEvaluator(json_file=json_file), inputs, outputs)
    assert results["bbox"]["AP"] < 5 and results["segm"]["AP"] < 5


def test_backends_agree_on_noisy_detections(coco):
    data, json_file = coco
    inputs, outputs = ground_truth_as_outputs(data, noise=3.0, seed=1)
    faster = _run(COCOEvaluator(json_file=json_file, backend="faster_coco_eval"), inputs, outputs)
    reference = _run(COCOEvaluator(json_file=json_file, backend="pycocotools"), inputs, outputs)
    assert 5 < faster["bbox"]["AP"] < 95, "the detections should be imperfect for the comparison to mean much"
    for task in ("bbox", "segm"):
        for name in METRICS:
            a, b = faster[task][name], reference[task][name]
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) < 1e-4 * 100, (task, name, a, b)


def test_category_outside_data_set_is_an_error(coco):
    data, json_file = coco
    inputs, outputs = ground_truth_as_outputs(data)
    outputs[0]["instances"]["classes"][0] = len(CATEGORY_IDS)
    evaluator = COCOEvaluator(json_file=json_file)
    with pytest.raises(ValueError, match=r"class 3, outside the data set's 3 categories"):
        evaluator.process(inputs[:1], outputs[:1])


@pytest.mark.parametrize("masks", [param(True, id="with-masks"), param(False, id="boxes-only")])
def test_no_detections_give_zero_metrics_with_warning(coco, caplog, masks):
    data, json_file = coco
    inputs, _ = ground_truth_as_outputs(data)
    empty = {
        "boxes": torch.zeros(0, 4),
        "scores": torch.zeros(0),
        "classes": torch.zeros(0, dtype=torch.int64),
    }
    if masks:
        empty["masks"] = torch.zeros(0, 1, 8, 8, dtype=torch.bool)
    evaluator = COCOEvaluator(json_file=json_file)
    evaluator.reset()
    evaluator.process(inputs[:2], [{"instances": dict(empty)} for _ in range(2)])
    with caplog.at_level(logging.WARNING, logger="lazytrain.evaluation"):
        results = evaluator.evaluate()
    assert set(results) == ({"bbox", "segm"} if masks else {"bbox"})
    assert results["bbox"] == {"AP": 0.0, "AP50": 0.0, "AP75": 0.0, "APs": 0.0, "APm": 0.0, "APl": 0.0}
    assert "received no predictions (2 images processed): every metric is 0" in caplog.text


def test_no_images_return_no_metrics_with_warning(coco, caplog):
    evaluator = COCOEvaluator(json_file=coco[1])
    evaluator.reset()
    with caplog.at_level(logging.WARNING, logger="lazytrain.evaluation"):
        assert evaluator.evaluate() == {}
    assert "received no images" in caplog.text


def test_outputs_without_masks_skip_segm(coco, caplog):
    data, json_file = coco
    with caplog.at_level(logging.WARNING, logger="lazytrain.evaluation"):
        results = _run(COCOEvaluator(json_file=json_file), *ground_truth_as_outputs(data, masks=False))
    assert set(results) == {"bbox"} and results["bbox"]["AP"] == pytest.approx(100.0)
    assert "skipping segm" in caplog.text


def test_only_processed_images_are_evaluated(coco):
    data, json_file = coco
    inputs, outputs = ground_truth_as_outputs(data)
    results = _run(COCOEvaluator(json_file=json_file, tasks=("bbox",)), inputs[:3], outputs[:3])
    assert results["bbox"]["AP"] == pytest.approx(100.0)


def test_category_ids_come_from_metadata_mapping(coco):
    data, json_file = coco
    name = "test_coco_evaluation_reversed"
    # A data set whose contiguous order is the reverse of the sorted json ids.
    mapping = {json_id: len(CATEGORY_IDS) - 1 - index for index, json_id in enumerate(CATEGORY_IDS)}
    MetadataCatalog.get(name).set(json_file=json_file, thing_dataset_id_to_contiguous_id=mapping)
    try:
        evaluator = COCOEvaluator(name, tasks=("bbox",))
        assert evaluator.get_category_ids() == list(reversed(CATEGORY_IDS))
        inputs, outputs = ground_truth_as_outputs(data, relabel=lambda c: len(CATEGORY_IDS) - 1 - c)
        assert _run(evaluator, inputs, outputs)["bbox"]["AP"] == pytest.approx(100.0)
    finally:
        MetadataCatalog.remove(name)


def test_instances_to_coco_json_converts_boxes_and_masks():
    masks = torch.zeros(1, 10, 12, dtype=torch.uint8)
    masks[0, 2:5, 3:9] = 1
    instances = {
        "boxes": torch.tensor([[3.0, 2.0, 9.0, 5.0]]),
        "scores": torch.tensor([0.5]),
        "classes": torch.tensor([1]),
        "masks": masks,
    }
    (entry,) = instances_to_coco_json(instances, 7, [4, 8])
    assert entry["image_id"] == 7 and entry["category_id"] == 8 and entry["score"] == 0.5
    assert entry["bbox"] == pytest.approx([3.0, 2.0, 6.0, 3.0])
    assert entry["segmentation"]["size"] == [10, 12] and isinstance(entry["segmentation"]["counts"], str)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        param({"tasks": ("keypoints",)}, r"tasks=\) must be a non-empty subset", id="task"),
        param({"backend": "lvis"}, r"backend=\) must be one of", id="backend"),
        param({"max_dets_per_image": 0}, r"max_dets_per_image=\) must be >= 1", id="max-dets"),
    ],
)
def test_constructor_validates_arguments(coco, kwargs, message):
    with pytest.raises(ValueError, match=message):
        COCOEvaluator(json_file=coco[1], **kwargs)


def test_missing_json_is_an_error():
    with pytest.raises(ValueError, match="no ground-truth json"):
        COCOEvaluator("test_coco_evaluation_unregistered")
    MetadataCatalog.remove("test_coco_evaluation_unregistered")


# ---------------------------------------------------------------------------------------------------------
# Predictions kept compactly and evaluated a category chunk at a time give the results of one run over
# everything on one result dict per detection (tests/evaluation/reference.py).


def _long_tail_case(tmp_path, seed=4):
    """LVIS-style json with an unused category and some images without negative lists; outputs with jitter,
    false positives of random classes and tied scores."""
    data = make_ground_truth(num_images=10, seed=seed, lvis=True)
    data["categories"].append({"id": 12, "name": "unused", "frequency": "r", "image_count": 2})
    for image in data["images"][::2]:
        image["neg_category_ids"] = []  # federated: detections of unannotated categories are ignored here
    inputs, outputs = ground_truth_as_outputs(data, noise=2.0, seed=seed)
    rng = np.random.default_rng(seed)
    for record, output in zip(inputs, outputs):
        instances, count = output["instances"], 5
        height, width = record["height"], record["width"]
        x0, y0 = rng.uniform(0, width / 2, count), rng.uniform(0, height / 2, count)
        x1, y1 = x0 + rng.uniform(4, width / 2, count), y0 + rng.uniform(4, height / 2, count)
        masks = torch.zeros(count, height, width, dtype=torch.uint8)
        for i in range(count):
            masks[i, int(y0[i]) : int(y1[i]), int(x0[i]) : int(x1[i])] = 1
        extra = {
            "boxes": torch.from_numpy(np.stack([x0, y0, x1, y1], axis=1)).float(),
            "scores": torch.from_numpy(np.round(rng.uniform(0.1, 1.0, count), 1)).float(),  # ties
            "classes": torch.from_numpy(rng.integers(0, len(CATEGORY_IDS), count)),
            "masks": masks,
        }
        instances["scores"] = instances["scores"].mul(10).round().div(10)
        for key in instances:
            instances[key] = torch.cat([instances[key], extra[key]])
    return data, write_json(data, tmp_path / "gt.json"), inputs, outputs


class _RecordingPerCategory:
    """Mixin: keep the unrounded per-category AP the evaluator writes to its table."""

    def _write_per_category_table(self, ground_truth, per_category):
        self.per_category = per_category
        super()._write_per_category_table(ground_truth, per_category)


@pytest.mark.parametrize("lvis", [param(True, id="federated"), param(False, id="exhaustive")])
@pytest.mark.parametrize(
    "pairs_per_chunk",
    [param(1, id="one-category-per-chunk"), param(25, id="two-categories"), param(None, id="one-chunk")],
)
def test_results_equal_one_run_on_one_dict_per_detection(tmp_path, monkeypatch, lvis, pairs_per_chunk):
    from lazytrain.evaluation import LVISEvaluator, coco_evaluation
    from tests.evaluation.reference import reference_entries, reference_evaluation

    data, json_file, inputs, outputs = _long_tail_case(tmp_path)
    if pairs_per_chunk is not None:
        monkeypatch.setattr(coco_evaluation, "_MAX_PAIRS_PER_CHUNK", pairs_per_chunk)
    base = LVISEvaluator if lvis else COCOEvaluator
    max_dets_per_image = 7 if lvis else 100  # LVIS: keeps the 7 best of 7 to 10 per image
    evaluator = type("Recording", (_RecordingPerCategory, base), {})(
        json_file=json_file, output_dir=str(tmp_path / "out"), max_dets_per_image=max_dets_per_image
    )
    results = _run(evaluator, inputs, outputs, batch=3)

    category_ids = sorted(c["id"] for c in data["categories"])
    entries = reference_entries(inputs, outputs, category_ids, max_dets_per_image if lvis else None)
    written = (tmp_path / "out" / f"{'lvis' if lvis else 'coco'}_instances_results.json").read_text()
    assert json.loads(written) == entries
    image_ids = sorted(image["id"] for image in data["images"])
    for task in ("bbox", "segm"):
        max_dets = [7] if lvis else [1, 10, 100]
        stats, per_category = reference_evaluation(json_file, entries, task, image_ids, max_dets, lvis)
        labels = coco_evaluation._LVIS_METRICS if lvis else coco_evaluation._COCO_METRICS
        expected = {name: coco_evaluation._nan_if_missing(stats[label]) for name, label in labels.items()}
        got = {name: results[task][name] for name in expected}
        assert _same(got, expected), (task, got, expected)
        assert _same(evaluator.per_category[task], per_category), task
        assert math.isnan(per_category[-1])  # the unused category: no ground truth, no detections
    assert 10 < results["bbox"]["AP"] < 90  # imperfect detections, or the comparison means little


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (dicts or lists of floats)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and _same(list(a.values()), list(b.values()))
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))
