"""AP-fixed and AP-pool (`lazytrain.evaluation.fixed_ap`, `LVISEvaluator(ap_fixed=, ap_pool=)`).

The hand-built fixtures use square boxes that either coincide with an instance (IoU 1) or touch nothing
(IoU 0), so every IoU threshold gives the same ranking of hits and misses, and the expected AP is the
101-point interpolated AP of that ranking, computed here from its definition (`reference_ap`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lazytrain.data.catalog import MetadataCatalog
from lazytrain.evaluation import LongTailEvaluator, LVISEvaluator
from lazytrain.evaluation.fixed_ap import CategoryTopK
from lazytrain.evaluation.predictions import pack_instances
from lazytrain.utils import comm
from tests.evaluation.data import ground_truth_as_outputs, make_ground_truth, write_json

STANDARD_TO_FIXED = {
    "AP": "APfixed",
    "AP50": "APfixed50",
    "AP75": "APfixed75",
    "APs": "APfixed_s",
    "APm": "APfixed_m",
    "APl": "APfixed_l",
    "APr": "APfixed_r",
    "APc": "APfixed_c",
    "APf": "APfixed_f",
}
POOL_METRICS = ("APpool", "APpool_r", "APpool_c", "APpool_f")
T, F = True, False


def reference_ap(ranking: list[bool], num_gt: int) -> float:
    """AP x 100 of detections ranked best first (True: hits an instance, False: a false positive): the mean
    over recall levels 0, 0.01, ..., 1 of the best precision reached at that recall or beyond (0 if never)."""
    points, hits = [], 0
    for rank, hit in enumerate(ranking, start=1):
        hits += hit
        points.append((hits / num_gt, hits / rank))
    levels = [i / 100 for i in range(101)]
    return 100 * sum(max([p for r, p in points if r >= level], default=0.0) for level in levels) / 101


def test_reference_ap_by_hand():
    # Hits at ranks 1 and 3 of 2 instances: precision 1 up to recall 0.5 (51 levels), 2/3 beyond (50 levels).
    assert reference_ap([T, F, T], 2) == pytest.approx(100 * (51 + 50 * 2 / 3) / 101)


def _box(x: float, y: float) -> list[float]:
    return [x, y, 10.0, 10.0]


def _square(box: list[float]) -> list[float]:
    x, y, w, h = box
    return [x, y, x + w, y, x + w, y + h, x, y + h]


def _write_lvis(tmp_path, images: list[dict], instances: list[tuple], frequencies: dict[int, str]) -> str:
    """An LVIS json of 100 x 100 images; `instances` are (image id, category id, XYWH box)."""
    annotations = [
        {
            "id": i,
            "image_id": image,
            "category_id": category,
            "bbox": box,
            "area": box[2] * box[3],
            "segmentation": [_square(box)],
            "iscrowd": 0,
        }
        for i, (image, category, box) in enumerate(instances, start=1)
    ]
    for image in images:
        image.update(width=100, height=100)
        image.setdefault("neg_category_ids", [])
        image.setdefault("not_exhaustive_category_ids", [])
    categories = [{"id": c, "name": f"c{c}", "frequency": f} for c, f in frequencies.items()]
    data = {"images": images, "annotations": annotations, "categories": categories}
    return write_json(data, tmp_path / "lvis.json")


def _outputs(detections: dict[int, list[tuple]], category_ids: list[int]) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of the model: per image id, (category id, score, XYWH box) detections."""
    contiguous = {c: i for i, c in enumerate(category_ids)}
    inputs, outputs = [], []
    for image_id, found in detections.items():
        boxes = torch.tensor([[x, y, x + w, y + h] for _, _, (x, y, w, h) in found], dtype=torch.float32)
        instances = {
            "boxes": boxes.reshape(-1, 4),
            "scores": torch.tensor([score for _, score, _ in found], dtype=torch.float32),
            "classes": torch.tensor([contiguous[c] for c, _, _ in found], dtype=torch.int64),
        }
        inputs.append({"image_id": image_id, "height": 100, "width": 100})
        outputs.append({"instances": instances})
    return inputs, outputs


def _evaluate(json_file: str, inputs, outputs, **options) -> dict[str, float]:
    evaluator = LVISEvaluator(json_file=json_file, tasks=("bbox",), **options)
    evaluator.reset()
    evaluator.process(inputs, outputs)
    return evaluator.evaluate()["bbox"]


@pytest.fixture
def capped(tmp_path):
    """Category 1 (frequent): 2 instances; category 2 (rare): 1 instance, in image 1, whose one detection
    scores below two of category 1 there; image 2 lists category 2 as absent, and a category-2 detection
    there is a false positive."""
    json_file = _write_lvis(
        tmp_path,
        [{"id": 1}, {"id": 2, "neg_category_ids": [2]}],
        [(1, 1, _box(0, 0)), (1, 2, _box(20, 20)), (2, 1, _box(40, 40))],
        {1: "f", 2: "r"},
    )
    detections = {
        1: [(1, 0.9, _box(0, 0)), (1, 0.8, _box(60, 60)), (2, 0.3, _box(20, 20))],
        2: [(1, 0.6, _box(40, 40)), (2, 0.7, _box(80, 80))],
    }
    return json_file, *_outputs(detections, [1, 2])


def test_per_image_cap_and_per_category_cap_give_different_ap(capped):
    json_file, inputs, outputs = capped
    category_1 = reference_ap([T, F, T], 2)  # 0.9 hit, 0.8 miss, 0.6 hit
    # The standard cap of 2 per image drops category 2's hit (0.3) in image 1: it keeps only its miss (0.7).
    standard = _evaluate(json_file, inputs, outputs, max_dets_per_image=2, ap_fixed=True)
    assert standard["AP"] == pytest.approx((category_1 + 0.0) / 2)
    assert standard["APr"] == pytest.approx(0.0) and standard["APf"] == pytest.approx(category_1)
    # AP-fixed has no per-image cap: category 2 ranks its miss (0.7) above its hit (0.3).
    category_2 = reference_ap([F, T], 1)
    assert standard["APfixed"] == pytest.approx((category_1 + category_2) / 2)
    assert standard["APfixed_r"] == pytest.approx(category_2) == pytest.approx(50.0)
    assert standard["APfixed_f"] == pytest.approx(category_1)
    # K = 2 per category over the data set: category 1 keeps its 0.9 hit and 0.8 miss, not its 0.6 hit.
    cut = _evaluate(json_file, inputs, outputs, max_dets_per_image=2, ap_fixed=True, max_dets_per_category=2)
    assert cut["APfixed"] == pytest.approx((reference_ap([T, F], 2) + category_2) / 2)
    assert cut["AP"] == pytest.approx(standard["AP"])  # the standard metrics do not depend on K


def test_pooled_ranking_differs_from_the_mean_of_categories(capped):
    json_file, inputs, outputs = capped
    results = _evaluate(json_file, inputs, outputs, ap_fixed=True, ap_pool=True)
    mean_of_categories = (reference_ap([T, F, T], 2) + reference_ap([F, T], 1)) / 2
    assert results["APfixed"] == pytest.approx(mean_of_categories)
    # One ranking of both categories: 0.9 hit, 0.8 miss, 0.7 miss (category 2), 0.6 hit, 0.3 hit (category 2).
    pooled = reference_ap([T, F, F, T, T], 3)
    assert results["APpool"] == pytest.approx(pooled) == pytest.approx(100 * (34 + 67 * 0.6) / 101)
    assert abs(pooled - mean_of_categories) > 5
    assert results["APpool_f"] == pytest.approx(reference_ap([T, F, T], 2))
    assert results["APpool_r"] == pytest.approx(reference_ap([F, T], 1))
    assert math.isnan(results["APpool_c"])  # no common category


def test_pooling_follows_the_federated_rules(tmp_path):
    # Category 3 has no instance anywhere but is listed as absent in image 1: its detection is a false
    # positive in the pool (and has no AP of its own). Category 4 is neither annotated nor listed: not scored.
    # Category 2 is not exhaustively annotated in image 1: its unmatched detection is ignored.
    json_file = _write_lvis(
        tmp_path,
        [{"id": 1, "neg_category_ids": [3], "not_exhaustive_category_ids": [2]}],
        [(1, 1, _box(0, 0)), (1, 2, _box(20, 20))],
        {1: "f", 2: "r", 3: "c", 4: "c"},
    )
    detections = {
        1: [
            (3, 0.99, _box(50, 50)),
            (4, 0.98, _box(60, 60)),
            (2, 0.97, _box(70, 70)),
            (1, 0.9, _box(0, 0)),
            (2, 0.5, _box(20, 20)),
        ]
    }
    results = _evaluate(json_file, *_outputs(detections, [1, 2, 3, 4]), ap_fixed=True, ap_pool=True)
    assert results["APfixed"] == pytest.approx(100.0)  # each category's own ranking is perfect
    assert results["APpool"] == pytest.approx(reference_ap([F, T, T], 2))  # 0.99 miss, 0.9 hit, 0.5 hit
    assert results["APpool_r"] == pytest.approx(100.0) and results["APpool_f"] == pytest.approx(100.0)
    assert math.isnan(results["APpool_c"]) and math.isnan(results["APfixed_c"])


@pytest.mark.parametrize("seed", [3, 5])
def test_fixed_ap_equals_lvis_ap_when_no_cap_binds(tmp_path, seed):
    # Fewer detections than either cap: AP-fixed is the standard LVIS AP (faster-coco-eval's), metric by
    # metric, for boxes and masks; crowd regions and not-exhaustive categories included.
    data = make_ground_truth(num_images=10, seed=seed, lvis=True)
    inputs, outputs = ground_truth_as_outputs(data, noise=4.0, seed=seed)
    for annotation in data["annotations"][::4]:
        annotation["iscrowd"] = 1
    for image in data["images"][::3]:
        image["not_exhaustive_category_ids"] = [5]
    evaluator = LVISEvaluator(json_file=write_json(data, tmp_path / "lvis.json"), ap_fixed=True)
    evaluator.reset()
    evaluator.process(inputs, outputs)
    results = evaluator.evaluate()
    for task in ("bbox", "segm"):
        for standard, fixed in STANDARD_TO_FIXED.items():
            expected = results[task][standard]
            assert results[task][fixed] == (pytest.approx(expected) if not math.isnan(expected) else _nan)
        assert not set(POOL_METRICS) & set(results[task])


class _NaN:
    def __eq__(self, other) -> bool:
        return isinstance(other, float) and math.isnan(other)


_nan = _NaN()


def _random_predictions(num_images: int, seed: int) -> list:
    """Images of 0-9 detections of 3 categories, scores with ties (one decimal)."""
    rng = np.random.default_rng(seed)
    predictions = []
    for image_id in range(1, num_images + 1):
        count = int(rng.integers(0, 10))
        corners = rng.uniform(0, 50, (count, 2))
        instances = {
            "boxes": torch.from_numpy(np.hstack([corners, corners + 10])).float(),
            "scores": torch.from_numpy(np.round(rng.uniform(0, 1, count), 1)).float(),
            "classes": torch.from_numpy(rng.integers(0, 3, count)),
        }
        predictions.append(pack_instances(instances, image_id, [1, 5, 9]))
    return predictions


def _flatten(detections: list) -> list[tuple]:
    return [
        (p.image_id, int(c), float(s), tuple(b))
        for p in detections
        for c, s, b in zip(p.category_ids, p.scores, p.boxes.tolist())
    ]


def test_top_k_per_category_is_exact_and_bounded():
    predictions, k = _random_predictions(60, seed=0), 7
    top_k, held = CategoryTopK(k), []
    for prediction in predictions:
        top_k.add(prediction)
        held.append(len(top_k))
    every = [(d, index) for p in predictions for index, d in enumerate(_flatten([p]))]
    expected = []
    for category in (1, 5, 9):
        ranked = sorted((d for d in every if d[0][1] == category), key=lambda e: (-e[0][2], e[0][0], e[1]))
        expected += [d for d, _ in ranked[:k]]
    assert sorted(_flatten(top_k.get_detections())) == sorted(expected)
    assert max(held) <= 2 * 3 * k + 9  # twice the final K per category, plus one image


def test_merging_processes_equals_one_process():
    predictions, k = _random_predictions(50, seed=1), 5
    single = CategoryTopK(k)
    for prediction in predictions:
        single.add(prediction)
    parts = [CategoryTopK(k), CategoryTopK(k)]
    for index, prediction in enumerate(reversed(predictions)):  # another order, shared alternately
        parts[index % 2].add(prediction)
    parts[1].add(predictions[0])  # a padded duplicate of an image the other process also saw
    merged = CategoryTopK.merge(k, [part.get_state() for part in parts])
    assert merged.image_ids == single.image_ids
    assert _flatten(merged.get_detections()) == _flatten(single.get_detections())


def _image(image_id: int, classes: list[int], scores: list[float]):
    """One image's detections (json categories [1, 5, 9]) with a 4 x 4 mask each."""
    count = len(classes)
    masks = torch.zeros(count, 4, 4, dtype=torch.uint8)
    for index in range(count):
        masks[index, index % 4, : 1 + index // 4] = 1
    instances = {
        "boxes": torch.tensor([[0.0, 0.0, 2.0, 2.0]] * count).reshape(-1, 4),
        "scores": torch.tensor(scores, dtype=torch.float32),
        "classes": torch.tensor(classes, dtype=torch.int64),
        "masks": masks,
    }
    return pack_instances(instances, image_id, [1, 5, 9])


def test_a_process_sends_at_most_k_per_category_with_the_masks_of_those_only():
    top_k = CategoryTopK(2)
    top_k.add(_image(3, [0, 0], [0.5, 0.75]))
    top_k.add(_image(2, [0, 1], [0.5, 0.5]))
    top_k.add(_image(1, [0], [0.5]))  # three ties at category 1's 2nd score: the lowest image id wins
    image_ids, kept = top_k.get_state()
    assert image_ids == [1, 2, 3]
    assert _flatten(kept) == [
        (1, 1, 0.5, (0.0, 0.0, 2.0, 2.0)),
        (2, 5, 0.5, (0.0, 0.0, 2.0, 2.0)),
        (3, 1, 0.75, (0.0, 0.0, 2.0, 2.0)),
    ]
    # The masks travel with the kept detections only: the RLE of each is its own, in the model's order.
    originals = {
        3: _image(3, [0, 0], [0.5, 0.75]),
        2: _image(2, [0, 1], [0.5, 0.5]),
        1: _image(1, [0], [0.5]),
    }
    assert [p.mask_counts for p in kept] == [
        originals[1].mask_counts,
        [originals[2].mask_counts[1]],
        [originals[3].mask_counts[1]],
    ]


class _WatchedTopK(CategoryTopK):
    """Records how many detections the merge holds before each process's share arrives."""

    held_before_each_share: list[int] = []

    def add(self, prediction) -> None:
        if prediction.image_id % 100 == 0:  # each share's first image (see below)
            self.held_before_each_share.append(len(self))
        super().add(prediction)


def test_the_merge_holds_at_most_k_per_category_between_processes():
    k, shares = 4, []
    rng = np.random.default_rng(5)
    for process in range(4):  # each sends exactly k of each of the 3 categories, scores rising by process
        predictions = []
        for image in range(3 * k):
            image_id = 100 * (process + 1) + image
            scores = (process + rng.uniform(0, 1, 1)).tolist()
            predictions.append(_image(image_id, [image % 3], [s / 4 for s in scores]))
        shares.append(([p.image_id for p in predictions], predictions))
    _WatchedTopK.held_before_each_share = []
    merged = _WatchedTopK.merge(k, iter(shares))
    assert _WatchedTopK.held_before_each_share == [0, 3 * k, 3 * k, 3 * k]
    # Equal to cutting everything at once.
    single = CategoryTopK(k)
    for _, predictions in shares:
        for prediction in predictions:
            single.add(prediction)
    assert _flatten(merged.get_detections()) == _flatten(single.get_detections())
    assert len(merged.get_detections()) == 3 * k and {p.image_id // 100 for p in merged.get_detections()} == {
        4
    }


def test_evaluator_merges_every_process_share(tmp_path, monkeypatch):
    data = make_ground_truth(num_images=8, seed=3, lvis=True)
    json_file = write_json(data, tmp_path / "lvis.json")
    inputs, outputs = ground_truth_as_outputs(data, noise=4.0, seed=3)
    options = dict(json_file=json_file, ap_fixed=True, ap_pool=True, max_dets_per_category=3)
    single = LVISEvaluator(**options)
    single.process(inputs, outputs)
    expected = single.evaluate()
    # Two "processes": the second's share reaches the main process through the (patched) gather.
    main, other = LVISEvaluator(**options), LVISEvaluator(**options)
    main.process(inputs[1::2], outputs[1::2])
    other.process(inputs[::2], outputs[::2])
    other_state = other._top_k.get_state()
    monkeypatch.setattr(comm, "gather", lambda value, dst=0: [value, other._predictions])
    monkeypatch.setattr(comm, "gather_in_turn", lambda value, dst=0: iter([value, other_state]))
    results = main.evaluate()
    for task in ("bbox", "segm"):
        for name in ("AP", "APr", "APfixed", "APfixed_r", *POOL_METRICS):
            value = expected[task][name]
            assert results[task][name] == (pytest.approx(value) if not math.isnan(value) else _nan), name


def test_pool_alone_adds_only_pool_metrics(capped):
    json_file, inputs, outputs = capped
    results = _evaluate(json_file, inputs, outputs, ap_pool=True)
    assert set(POOL_METRICS) <= set(results) and not any(name.startswith("APfixed") for name in results)


@pytest.mark.parametrize("value", [0, -3, True])
def test_max_dets_per_category_must_be_positive(capped, value):
    with pytest.raises(ValueError, match=r"LVISEvaluator\(max_dets_per_category=\) must be an int >= 1"):
        LVISEvaluator(json_file=capped[0], ap_fixed=True, max_dets_per_category=value)


@pytest.mark.parametrize("protocol", ["federated", "exhaustive"])
def test_long_tail_evaluator_passes_the_options_on_under_the_federated_protocol(capped, protocol):
    json_file, inputs, outputs = capped
    name = f"test_fixed_ap_{protocol}"
    MetadataCatalog.get(name).set(json_file=json_file, evaluation_protocol=protocol)
    try:
        if protocol == "exhaustive":
            with pytest.raises(ValueError, match=r"AP-fixed and AP-pool follow LVIS's federated protocol"):
                LongTailEvaluator(name, tasks=("bbox",), ap_pool=True)
            return
        evaluator = LongTailEvaluator(name, tasks=("bbox",), ap_fixed=True, max_dets_per_category=2)
        evaluator.reset()
        evaluator.process(inputs, outputs)
        results = evaluator.evaluate()["bbox"]
    finally:
        MetadataCatalog.remove(name)
    assert results["APfixed"] == pytest.approx((reference_ap([T, F], 2) + reference_ap([F, T], 1)) / 2)


def test_a_model_that_detects_nothing_scores_zero(capped):
    json_file, inputs, _ = capped
    nothing = {
        "boxes": torch.zeros(0, 4),
        "scores": torch.zeros(0),
        "classes": torch.zeros(0, dtype=torch.int64),
    }
    results = _evaluate(
        json_file, inputs, [{"instances": dict(nothing)} for _ in inputs], ap_fixed=True, ap_pool=True
    )
    assert results["APfixed"] == results["APpool"] == results["APfixed_r"] == 0.0


def test_hundreds_of_masks_in_an_image_equal_lvis_ap(tmp_path):
    # More detections than pycocotools' mask area takes in one call (255), boxes and masks.
    json_file = _write_lvis(tmp_path, [{"id": 1}], [(1, 1, _box(0, 0)), (1, 1, _box(30, 30))], {1: "f"})
    rng = np.random.default_rng(0)
    corners = rng.integers(0, 90, (300, 2))
    corners[5], corners[17] = (0, 0), (30, 30)
    masks = torch.zeros(300, 100, 100, dtype=torch.uint8)
    for index, (x, y) in enumerate(corners.tolist()):
        masks[index, y : y + 10, x : x + 10] = 1
    instances = {
        "boxes": torch.from_numpy(np.hstack([corners, corners + 10])).float(),
        "scores": torch.from_numpy(rng.uniform(0, 1, 300)).float(),
        "classes": torch.zeros(300, dtype=torch.int64),
        "masks": masks,
    }
    evaluator = LVISEvaluator(json_file=json_file, ap_fixed=True)
    evaluator.process([{"image_id": 1, "height": 100, "width": 100}], [{"instances": instances}])
    results = evaluator.evaluate()
    for task in ("bbox", "segm"):
        assert results[task]["APfixed"] == pytest.approx(results[task]["AP"]) and results[task]["AP"] > 0
