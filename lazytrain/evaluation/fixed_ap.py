"""AP-fixed and AP-pool (Dave et al., "Evaluating Large-Vocabulary Detectors: The Devil is in the Details").

LVIS's standard AP keeps 300 detections per image over all categories, so a detector can trade one category's
detections for another's within an image, and its AP then depends on how scores compare across categories.
AP-fixed removes that coupling: it keeps the K best-scoring detections of each category over the whole data
set (K = 10,000 for LVIS), with no per-image cap, and computes LVIS AP on them (the same matching, IoU
thresholds 0.50:0.95, area ranges, federated rules and r/c/f buckets). AP-pool ranks the detections of all
categories together: each detection is matched to its own category's ground truth and judged by the same
federated rules as in AP-fixed (ignored in an image that neither annotates its category nor lists it as
negative; unmatched and ignored when the category is not exhaustively annotated there), then one
precision/recall curve is computed over the pooled ranking, so a detection of any category that outranks a
correct one costs precision. Pools are all categories and each of r/c/f, on the "all" area range, as the
authors' evaluation reports them. Categories with no ground truth in the evaluated images add no recall to a
pool, but their scored detections still count as false positives there.

`CategoryTopK` keeps the running top K of each category while images arrive (memory bounded by K per
category, not by the data set's size); `evaluate_fixed_ap` computes the metrics from its detections.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from faster_coco_eval.core import mask as mask_util

from lazytrain.evaluation.coco_evaluation import _find, _is_scored_by_federated_protocol
from lazytrain.evaluation.predictions import DetectionTable, ImagePredictions

__all__ = ["CategoryTopK", "evaluate_fixed_ap", "take_detections"]

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_THRESHOLDS = np.linspace(0.0, 1.0, 101)
# COCO's and LVIS's area ranges (pixels), in the order their metrics list them: all, small, medium, large.
AREA_RANGES = np.array([[0, 1e5**2], [0, 32**2], [32**2, 96**2], [96**2, 1e5**2]], dtype=np.float64)
_AREA_SUFFIXES = ("", "_s", "_m", "_l")
_BUCKETS = ("r", "c", "f")


def take_detections(prediction: ImagePredictions, indices: np.ndarray) -> ImagePredictions:
    """The detections of `prediction` at `indices`, in that order (masks' RLE strings shared, not copied)."""
    indices = np.asarray(indices, dtype=np.int64)
    counts = prediction.mask_counts
    return prediction._replace(
        category_ids=prediction.category_ids[indices],
        boxes=prediction.boxes[indices],
        scores=prediction.scores[indices],
        mask_counts=None if counts is None else [counts[i] for i in indices.tolist()],
    )


def _order_by_category_and_score(
    categories: np.ndarray, scores: np.ndarray, *tie_breaks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(order sorting by category, then score from high to low, then `tie_breaks` in turn; each detection's
    rank within its category in that order)."""
    order = np.lexsort((*reversed(tie_breaks), -scores.astype(np.float64), categories))
    sorted_categories = categories[order]
    starts = np.flatnonzero(np.r_[True, sorted_categories[1:] != sorted_categories[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return order, np.arange(len(order)) - first


class CategoryTopK:
    """The `k` best-scoring detections of each category among the images added so far.

    Detections that can no longer be among their category's `k` best (k better ones of that category are
    already kept) are dropped as images arrive, in batches: what is held stays within about twice the final
    `k` per category. `get_detections` makes the exact cut; equal scores are ordered by image id, then by the
    model's order within the image, so the result does not depend on the order images arrived in or on how
    they were split over processes (`merge`). An image id seen twice (a sampler that pads) counts once.

    Args:
        k: detections kept per category.
    """

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"CategoryTopK(k=) must be >= 1; got {k!r}")
        self.k = int(k)
        self.image_ids: set[int] = set()
        self._kept: list[ImagePredictions] = []
        self._num_kept = 0
        self._num_after_compaction = 0
        self._threshold_categories = np.zeros(0, dtype=np.int64)
        self._thresholds = np.zeros(0, dtype=np.float64)

    def __len__(self) -> int:
        return self._num_kept

    def may_enter(self, category_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Whether each detection (json category id, score) can still be among its category's `k` best."""
        position, found = _find(self._threshold_categories, np.asarray(category_ids, dtype=np.int64))
        threshold = np.full(len(found), -np.inf)
        threshold[found] = self._thresholds[position[found]]
        return np.asarray(scores, dtype=np.float64) >= threshold

    def add(self, prediction: ImagePredictions) -> None:
        """Take in one image's detections (those that cannot enter are dropped at once)."""
        if prediction.image_id in self.image_ids:
            return
        self.image_ids.add(prediction.image_id)
        keep = np.flatnonzero(self.may_enter(prediction.category_ids, prediction.scores))
        if not len(keep):
            return
        self._kept.append(
            prediction if len(keep) == prediction.num_detections else take_detections(prediction, keep)
        )
        self._num_kept += len(keep)
        if self._num_kept > 2 * max(self._num_after_compaction, self.k):
            self.compact()

    def compact(self) -> None:
        """Drop every held detection that has `k` better-or-equal ones of its category (ties are kept)."""
        categories, scores = self._flat("category_ids"), self._flat("scores")
        order, rank = _order_by_category_and_score(categories, scores)
        at_k = order[rank == self.k - 1]  # each full category's k-th best
        self._threshold_categories = categories[at_k]
        self._thresholds = scores[at_k].astype(np.float64)
        kept = []
        for prediction in self._kept:
            keep = np.flatnonzero(self.may_enter(prediction.category_ids, prediction.scores))
            if len(keep) == prediction.num_detections:
                kept.append(prediction)
            elif len(keep):
                kept.append(take_detections(prediction, keep))
        self._kept = kept
        self._num_kept = self._num_after_compaction = sum(p.num_detections for p in kept)

    def cut(self) -> None:
        """Keep exactly the `k` best of each category (`get_detections`'s rule); the others and their masks'
        RLE strings are dropped."""
        self._kept = self.get_detections()
        self.compact()  # the thresholds of `may_enter` from what is kept (drops nothing more)

    def get_state(self) -> tuple[list[int], list[ImagePredictions]]:
        """(image ids seen, detections held, at most `k` of each category): what one process sends to be
        merged (`merge`). A process never needs more: a detection it cuts has `k` better ones in its own share,
        by the same order as the final cut."""
        self.cut()
        return sorted(self.image_ids), list(self._kept)

    @classmethod
    def merge(cls, k: int, states: Iterable[tuple[list[int], list[ImagePredictions]]]) -> CategoryTopK:
        """One `CategoryTopK` from the `get_state` of several (each process's share of the images).

        `states` is read one at a time and the result is cut to `k` per category after each, so a lazy
        iterable (`lazytrain.utils.comm.gather_in_turn`) keeps at most `k` per category merged plus one
        state's in memory, whatever the number of processes. The result does not depend on how the images
        were shared; an image in several states (a sampler that pads) is taken from the first.
        """
        merged = cls(k)
        for image_ids, kept in states:
            for prediction in kept:
                merged.add(prediction)  # an image already taken from an earlier state is skipped
            merged.image_ids.update(image_ids)
            merged.cut()
            del kept  # its cut detections' masks go now, before the next state arrives
        return merged

    def get_detections(self) -> list[ImagePredictions]:
        """Exactly the `k` best detections of each category (fewer where fewer were seen), per image in image
        id order, each image's in the model's order."""
        if not self._kept:
            return []
        categories, scores = self._flat("category_ids"), self._flat("scores")
        counts = np.array([p.num_detections for p in self._kept], dtype=np.int64)
        starts = np.cumsum(counts) - counts
        owner_ids = np.array([p.image_id for p in self._kept], dtype=np.int64)
        image_ids = np.repeat(owner_ids, counts)
        within = np.arange(len(image_ids)) - np.repeat(starts, counts)
        order, rank = _order_by_category_and_score(categories, scores, image_ids, within)
        chosen = np.zeros(len(image_ids), dtype=bool)
        chosen[order[rank < self.k]] = True
        selected = []
        for index in np.argsort(owner_ids, kind="stable").tolist():
            keep = np.flatnonzero(chosen[starts[index] : starts[index] + counts[index]])
            if len(keep):
                selected.append(take_detections(self._kept[index], keep))
        return selected

    def _flat(self, field: str) -> np.ndarray:
        arrays = [getattr(p, field) for p in self._kept]
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


class _Matches(NamedTuple):
    """Every scored detection (in image, category, score order) judged by the LVIS rules.

    Attributes:
        category_position: [N] position of each one's category in the evaluated categories.
        scores: [N] their scores.
        matched: [A, T, N] matched to a ground-truth instance (per area range and IoU threshold).
        ignored: [A, T, N] neither true nor false positive there.
        num_gt: [C, A] ground-truth instances of each category that count in each area range.
    """

    category_position: np.ndarray
    scores: np.ndarray
    matched: np.ndarray
    ignored: np.ndarray
    num_gt: np.ndarray


def evaluate_fixed_ap(
    ground_truth: Any,
    detections: Sequence[ImagePredictions],
    task: str,
    image_ids: Sequence[int],
    *,
    fixed: bool = True,
    pooled: bool = True,
) -> dict[str, float]:
    """AP-fixed and AP-pool x 100 of `detections`, all of them (no per-image cap), on `image_ids`.

    AP-fixed: ``APfixed``, ``APfixed50``, ``APfixed75``, ``APfixed_s``/``_m``/``_l``, ``APfixed_r``/``_c``/``_f``
    (LVIS's AP, AP50, ... APf). AP-pool: ``APpool`` and ``APpool_r``/``_c``/``_f`` (the pools of all categories
    and of each frequency bucket). A metric with no ground truth to score is NaN.

    Args:
        ground_truth: the LVIS ground truth as a COCO API object (faster-coco-eval's or pycocotools'), with
            ``neg_category_ids`` and ``not_exhaustive_category_ids`` per image and ``frequency`` per category.
        detections: each image's detections, typically `CategoryTopK.get_detections`.
        task: ``"bbox"`` or ``"segm"`` (``segm`` needs masks in `detections`).
        image_ids: the evaluated images, with or without detections; `detections` must be of these images.
        fixed: compute AP-fixed.
        pooled: compute AP-pool.
    """
    categories = np.asarray(sorted(int(c) for c in ground_truth.getCatIds()), dtype=np.int64)
    buckets = np.array([ground_truth.cats[int(c)].get("frequency", "") for c in categories])
    matches = _match_all(ground_truth, DetectionTable(list(detections)), task, categories, sorted(image_ids))
    metrics = _fixed_metrics(matches, buckets) if fixed else {}
    if pooled:
        metrics.update(_pooled_metrics(matches, buckets))
    return metrics


def _match_all(
    ground_truth: Any, table: DetectionTable, task: str, categories: np.ndarray, image_ids: list[int]
) -> _Matches:
    """Match each scored detection to its category's ground truth in its image, for every area range and IoU
    threshold, as LVIS's ``evaluate_img`` does (a detection of a category neither annotated nor listed as
    negative in its image is not scored at all)."""
    position, known = _find(categories, table.category_ids)
    scored = np.flatnonzero(
        known & _is_scored_by_federated_protocol(ground_truth, table, categories, image_ids)
    )
    scores = table.scores[scored].astype(np.float64)
    scored = scored[np.lexsort((-scores, table.category_ids[scored], table.image_ids[scored]))]
    by_pair = _ground_truth_by_pair(ground_truth, image_ids)
    num_gt = np.zeros((len(categories), len(AREA_RANGES)), dtype=np.int64)
    for (_, category_id), instances in by_pair.items():
        num_gt[np.searchsorted(categories, category_id)] += (~_ground_truth_ignored(instances)).sum(axis=1)
    shape = (len(AREA_RANGES), len(IOU_THRESHOLDS), len(scored))
    matched, ignored = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    outside = _outside_area_ranges(_detection_areas(table, scored, task))
    image_of, category_of = table.image_ids[scored], table.category_ids[scored]
    changes = (np.diff(image_of) != 0) | (np.diff(category_of) != 0)
    pair_starts = np.flatnonzero(np.r_[len(scored) > 0, changes])
    for start, end in zip(pair_starts.tolist(), [*pair_starts[1:].tolist(), len(scored)]):
        image_id, category_id = int(image_of[start]), int(category_of[start])
        # Unmatched detections are ignored outside the area range, and where the category's annotation is
        # not exhaustive (LVIS: ``not_exhaustive_category_ids``).
        not_exhaustive = category_id in (ground_truth.imgs[image_id].get("not_exhaustive_category_ids") or ())
        unmatched_ignored = (outside[:, start:end] | not_exhaustive)[:, None, :]
        instances = by_pair.get((image_id, category_id))
        if not instances:
            ignored[:, :, start:end] = unmatched_ignored
            continue
        ious = _get_ious(ground_truth, table, scored[start:end], instances, task)
        hit, on_ignored = _match(ious, _ground_truth_ignored(instances), _is_crowd(instances))
        matched[:, :, start:end] = hit
        ignored[:, :, start:end] = np.where(hit, on_ignored, unmatched_ignored)
    return _Matches(position[scored], table.scores[scored].astype(np.float64), matched, ignored, num_gt)


def _ground_truth_by_pair(ground_truth: Any, image_ids: list[int]) -> dict[tuple[int, int], list[dict]]:
    by_pair: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for image_id in image_ids:
        for annotation in ground_truth.imgToAnns.get(image_id, ()):
            by_pair[image_id, int(annotation["category_id"])].append(annotation)
    return by_pair


def _is_crowd(instances: list[dict]) -> np.ndarray:
    return np.array([bool(a.get("iscrowd", 0)) for a in instances])


def _outside_area_ranges(areas: np.ndarray) -> np.ndarray:
    """[A, N]: is each area outside each of `AREA_RANGES`?"""
    areas = np.asarray(areas, dtype=np.float64)[None, :]
    return (areas < AREA_RANGES[:, :1]) | (areas > AREA_RANGES[:, 1:])


def _ground_truth_ignored(instances: list[dict]) -> np.ndarray:
    """[A, G]: crowd regions, and instances outside the area range, match detections but do not count."""
    areas = np.array([float(a["area"]) for a in instances])
    return _outside_area_ranges(areas) | _is_crowd(instances)[None, :]


def _detection_rles(table: DetectionTable, indices: np.ndarray) -> list[dict[str, Any]]:
    return [{"size": list(table.mask_sizes[i]), "counts": table.mask_counts[i]} for i in indices.tolist()]


def _xywh(table: DetectionTable, indices: np.ndarray) -> np.ndarray:
    """Boxes as the COCO API gets them from `DetectionTable.get_entries`: XYWH in float64."""
    boxes = table.boxes[indices].astype(np.float64)
    boxes[:, 2:] -= boxes[:, :2]
    return boxes


def _detection_areas(table: DetectionTable, indices: np.ndarray, task: str) -> np.ndarray:
    """Each detection's area as the COCO API takes it: of the box for ``bbox``, of the mask for ``segm``."""
    if task == "bbox":
        boxes = _xywh(table, indices)
        return boxes[:, 2] * boxes[:, 3]
    if not len(indices):
        return np.zeros(0)
    return mask_util.area(_detection_rles(table, indices)).astype(np.float64)


def _get_ious(
    ground_truth: Any, table: DetectionTable, indices: np.ndarray, instances: list[dict], task: str
) -> np.ndarray:
    """[D, G] IoU of detections and ground truth (of a crowd region: the share of the detection inside it)."""
    crowd = [int(a.get("iscrowd", 0)) for a in instances]
    if task == "bbox":
        boxes = np.array([a["bbox"] for a in instances], dtype=np.float64)
        return np.asarray(mask_util.iou(_xywh(table, indices), boxes, crowd))
    regions = [ground_truth.annToRLE(a) for a in instances]
    return np.asarray(mask_util.iou(_detection_rles(table, indices), regions, crowd))


def _match(ious: np.ndarray, gt_ignored: np.ndarray, crowd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COCO's greedy matching of one image's detections of a category, best score first, for every area range
    and IoU threshold at once.

    Each detection takes, among the instances still free (a crowd region never stops being free) with IoU at
    least the threshold, the one of highest IoU, preferring any counted instance to an ignored one; of equal
    IoUs, the last in the instances' order (as COCO's loop, which keeps a later one that is as good).

    Args:
        ious: [D, G] detections in score order (high first) against the instances.
        gt_ignored: [A, G] instances ignored in each area range.
        crowd: [G] crowd regions.

    Returns:
        ([A, T, D] matched, [A, T, D] matched to an ignored instance).
    """
    num_areas, num_gt = gt_ignored.shape
    thresholds = np.minimum(IOU_THRESHOLDS, 1 - 1e-10)[None, :, None]
    if num_gt == 1:
        return _match_one_instance(ious[:, 0], gt_ignored[:, 0], bool(crowd[0]), thresholds[0, :, 0])
    preference = np.where(gt_ignored, 0.0, 2.0)[:, None, :]  # IoU is at most 1: counted instances come first
    taken = np.zeros((num_areas, len(IOU_THRESHOLDS), num_gt), dtype=bool)
    shape = (num_areas, len(IOU_THRESHOLDS), len(ious))
    matched, on_ignored = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    # A detection below the lowest threshold with every instance matches nothing and takes nothing.
    for detection in np.flatnonzero(ious.max(axis=1) >= thresholds.min()).tolist():
        free = ~taken | crowd
        if not free.any():  # every instance taken at every threshold: nothing left to match
            break
        row = ious[detection]
        key = np.where((row >= thresholds) & free, row + preference, -1.0)
        best = num_gt - 1 - np.argmax(key[..., ::-1], axis=-1)  # the last of equal keys
        areas, levels = np.nonzero(key.max(axis=-1) >= 0)
        chosen = best[areas, levels]
        taken[areas, levels, chosen] = True
        matched[areas, levels, detection] = True
        on_ignored[areas, levels, detection] = gt_ignored[areas, chosen]
    return matched, on_ignored


def _match_one_instance(
    ious: np.ndarray, ignored: np.ndarray, crowd: bool, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`_match` with one instance, for all detections at once: at each threshold the best-scoring detection
    reaching it takes it (a crowd region: every detection reaching it). `ious` [D], `ignored` [A]."""
    reaches = ious[None, :] >= thresholds[:, None]  # [T, D]
    if not crowd:
        reaches &= np.cumsum(reaches, axis=1) == 1
    matched = np.broadcast_to(reaches, (len(ignored), *reaches.shape)).copy()
    return matched, matched & ignored[:, None, None]


def _precision_at_recalls(true_positive: np.ndarray, false_positive: np.ndarray, num_gt: int) -> np.ndarray:
    """[T, R] precision at `RECALL_THRESHOLDS` of detections in ranking order (`true_positive`,
    `false_positive`: [T, N]; an ignored detection is neither): COCO's 101-point interpolation, where the
    precision at recall r is the best precision at any recall >= r, and 0 beyond the last recall reached."""
    tp = np.cumsum(true_positive, axis=1, dtype=np.float64)
    fp = np.cumsum(false_positive, axis=1, dtype=np.float64)
    recall = tp / num_gt
    precision = tp / (tp + fp + np.spacing(1))
    precision = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
    result = np.zeros((tp.shape[0], len(RECALL_THRESHOLDS)))
    for level in range(tp.shape[0]):
        index = np.searchsorted(recall[level], RECALL_THRESHOLDS, side="left")
        inside = index < tp.shape[1]
        result[level, inside] = precision[level, index[inside]]
    return result


def _curve(matches: _Matches, chosen: np.ndarray, area: int, num_gt: int) -> np.ndarray:
    """[T, R] precision of the detections `chosen` (in ranking order) in area range `area`."""
    matched, ignored = matches.matched[area][:, chosen], matches.ignored[area][:, chosen]
    return _precision_at_recalls(matched & ~ignored, ~matched & ~ignored, num_gt)


def _mean(values: np.ndarray) -> float:
    values = values[values > -1]
    return float(values.mean()) * 100.0 if values.size else float("nan")


def _fixed_metrics(matches: _Matches, buckets: np.ndarray) -> dict[str, float]:
    """LVIS's metrics on every category's own ranking of its detections."""
    num_categories, num_areas = matches.num_gt.shape
    # [T, R, C, A], -1 where a category has no ground truth in the area range (left out of the means).
    precision = np.full((len(IOU_THRESHOLDS), len(RECALL_THRESHOLDS), num_categories, num_areas), -1.0)
    order = np.lexsort((np.arange(len(matches.scores)), -matches.scores, matches.category_position))
    bounds = np.searchsorted(matches.category_position[order], np.arange(num_categories + 1))
    for category in range(num_categories):
        chosen = order[bounds[category] : bounds[category + 1]]
        for area in range(num_areas):
            if matches.num_gt[category, area]:
                precision[:, :, category, area] = _curve(
                    matches, chosen, area, matches.num_gt[category, area]
                )
    metrics = {
        "APfixed": _mean(precision[..., 0]),
        "APfixed50": _mean(precision[0, ..., 0]),
        "APfixed75": _mean(precision[5, ..., 0]),
    }
    for area, suffix in enumerate(_AREA_SUFFIXES[1:], start=1):
        metrics[f"APfixed{suffix}"] = _mean(precision[..., area])
    for bucket in _BUCKETS:
        metrics[f"APfixed_{bucket}"] = _mean(precision[:, :, buckets == bucket, 0])
    return metrics


def _pooled_metrics(matches: _Matches, buckets: np.ndarray) -> dict[str, float]:
    """AP of one ranking of the detections of all categories, and of each bucket's categories (area "all")."""
    pools = {"APpool": np.ones(len(buckets), dtype=bool)}
    pools.update({f"APpool_{bucket}": buckets == bucket for bucket in _BUCKETS})
    metrics = {}
    for name, members in pools.items():
        num_gt = int(matches.num_gt[members, 0].sum())
        if not num_gt:
            metrics[name] = float("nan")
            continue
        chosen = np.flatnonzero(members[matches.category_position])
        chosen = chosen[np.argsort(-matches.scores[chosen], kind="stable")]
        metrics[name] = _mean(_curve(matches, chosen, 0, num_gt))
    return metrics
