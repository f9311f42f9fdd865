"""COCO-style instance evaluation (box and mask AP) on faster-coco-eval, with pycocotools as a cross-check.

`COCOEvaluator` keeps model outputs compactly as they arrive (`predictions.ImagePredictions`: boxes, scores,
the json's category ids, masks as RLE), gathers them on the main process and runs the COCO protocol on the
ground-truth json, a chunk of categories at a time. `LVISEvaluator` (lvis_evaluation.py) reuses it with the
federated LVIS protocol. Results are AP x 100; a metric that cannot be computed (no ground truth in that range) is NaN.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pycocotools.mask as mask_util
import torch

from lazytrain.evaluation.evaluator import DatasetEvaluator
from lazytrain.evaluation.predictions import (
    ENTRY_FIELDS,
    DetectionTable,
    ImagePredictions,
    get_coco_entries,
    pack_instances,
    write_coco_results,
)
from lazytrain.utils import comm
from lazytrain.utils.logger import create_small_table
from lazytrain.utils.preemption import abandon_on_stop

__all__ = ["COCOEvaluator", "instances_to_coco_json"]

logger = logging.getLogger(__name__)

TASKS = ("bbox", "segm")
BACKENDS = ("faster_coco_eval", "pycocotools")
# Our metric names and faster-coco-eval's `stats_as_dict` labels for them.
_COCO_METRICS = {
    "AP": "AP_all",
    "AP50": "AP_50",
    "AP75": "AP_75",
    "APs": "AP_small",
    "APm": "AP_medium",
    "APl": "AP_large",
}
_LVIS_METRICS = {**_COCO_METRICS, "APr": "APr", "APc": "APc", "APf": "APf"}
# (image, category) pairs the COCO API is given at once: faster-coco-eval keeps ~1 kB per pair while it
# evaluates (a record per area range), whether or not the pair has detections; 1M pairs is ~1 GB.
_MAX_PAIRS_PER_CHUNK = 1_000_000


def instances_to_coco_json(
    instances: Mapping[str, Any], image_id: int, category_ids: Sequence[int]
) -> list[dict[str, Any]]:
    """COCO result entries for one image's predicted instances.

    Args:
        instances: ``boxes`` [N, 4] XYXY, ``scores`` [N], ``classes`` [N] contiguous, optional ``masks``
            [N, H, W] (0/1) in the original image size.
        image_id: the json image id.
        category_ids: json category id of each contiguous class.

    Returns:
        One dict per instance: ``image_id``, ``category_id``, ``bbox`` (XYWH), ``score`` and, with masks,
        ``segmentation`` (compressed RLE, ``counts`` as str).

    Raises:
        ValueError: a class is outside ``0 .. len(category_ids) - 1``.
    """
    return get_coco_entries(pack_instances(instances, image_id, category_ids))


def _nan_if_missing(value: float) -> float:
    return float("nan") if value is None or value < 0 else float(value) * 100.0


def _get_metadata(dataset_name: str | None) -> Any:
    if dataset_name is None:
        return None
    from lazytrain.data.catalog import MetadataCatalog

    return MetadataCatalog.get(dataset_name)


class COCOEvaluator(DatasetEvaluator):
    """Box and mask AP with the COCO protocol.

    Ground truth is the COCO json of the data set: ``json_file`` if given, else
    ``MetadataCatalog.get(dataset_name).json_file``. Contiguous classes map to json category ids through the
    metadata's ``thing_dataset_id_to_contiguous_id`` when there is one, else through the json's sorted
    category ids. Only the images seen by `process` are evaluated (so a subset run is a fair score).

    Writes to `output_dir` (main process): ``<prefix>_instances_results.json`` (all predictions) and
    ``<prefix>_per_category_ap.csv``/``.md`` (AP per category with its frequency bucket and train image
    count when the json has them), where the prefix is ``coco`` or ``lvis``.

    Args:
        dataset_name: registered data set, used for its metadata (may be None with `json_file`).
        tasks: ``"bbox"`` and/or ``"segm"``; ``segm`` is skipped (with a warning) if outputs have no masks.
        max_dets_per_image: detections per image considered (COCO's ``maxDets`` upper value).
        output_dir: where to write results; None writes nothing.
        backend: ``"faster_coco_eval"`` (default) or ``"pycocotools"`` (reference implementation).
        json_file: ground-truth json path; overrides the metadata's.
    """

    _prefix = "coco"
    _lvis_style = False
    _metrics = _COCO_METRICS

    def __init__(
        self,
        dataset_name: str | None = None,
        tasks: Sequence[str] = TASKS,
        max_dets_per_image: int = 100,
        output_dir: str | None = None,
        *,
        backend: str = "faster_coco_eval",
        json_file: str | None = None,
    ) -> None:
        name = type(self).__name__
        tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
        if not tasks or any(task not in TASKS for task in tasks):
            raise ValueError(f"{name}(tasks=) must be a non-empty subset of {TASKS}; got {tasks!r}")
        if backend not in BACKENDS:
            raise ValueError(f"{name}(backend=) must be one of {BACKENDS}; got {backend!r}")
        if int(max_dets_per_image) < 1:
            raise ValueError(f"{name}(max_dets_per_image=) must be >= 1; got {max_dets_per_image!r}")
        self.metadata = _get_metadata(dataset_name)
        json_file = json_file or getattr(self.metadata, "json_file", None)
        if not json_file:
            raise ValueError(
                f"{name}: no ground-truth json: pass json_file= or register json_file in the metadata of "
                f"dataset {dataset_name!r}."
            )
        self.dataset_name = dataset_name
        self.json_file = str(json_file)
        self.tasks = tasks
        self.max_dets_per_image = int(max_dets_per_image)
        self.output_dir = output_dir
        self.backend = backend
        self._ground_truth: Any = None
        self._category_ids: list[int] | None = None
        self._predictions: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ ground truth
    def _load_ground_truth(self) -> Any:
        if self._ground_truth is None:
            with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
                if self.backend == "pycocotools":
                    from pycocotools.coco import COCO
                else:
                    from faster_coco_eval import COCO
                self._ground_truth = COCO(self.json_file)
            _complete_annotations(self._ground_truth)
            self._prepare_ground_truth(self._ground_truth)
        return self._ground_truth

    def _prepare_ground_truth(self, ground_truth: Any) -> None:
        """Hook for subclasses to complete the loaded ground truth (LVIS fills category frequencies)."""

    def get_category_ids(self) -> list[int]:
        """Json category id of each contiguous class."""
        if self._category_ids is None:
            mapping = getattr(self.metadata, "thing_dataset_id_to_contiguous_id", None)
            if mapping:
                inverse = {int(contiguous): int(json_id) for json_id, contiguous in mapping.items()}
                self._category_ids = [inverse[i] for i in range(len(inverse))]
            else:
                self._category_ids = sorted(int(c) for c in self._load_ground_truth().getCatIds())
        return self._category_ids

    # ------------------------------------------------------------------ protocol
    def reset(self) -> None:
        self._predictions = []

    def process(self, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
        category_ids = self.get_category_ids()
        for record, output in zip(inputs, outputs):
            instances = output["instances"]
            if self._lvis_style and len(instances["scores"]) > self.max_dets_per_image:
                # LVIS caps detections per image over all categories (not per category like COCO).
                keep = torch.as_tensor(instances["scores"]).topk(self.max_dets_per_image).indices
                instances = {key: value[keep] for key, value in instances.items()}
            self._predictions.append(pack_instances(instances, record["image_id"], category_ids))

    def evaluate(self) -> dict[str, Any]:
        gathered = comm.gather(self._predictions, dst=0)
        if not comm.is_main_process():
            return {}
        # Minutes on LVIS, longer than a scheduler's grace period: a stop signal abandons it (no collectives).
        with abandon_on_stop():
            return self._evaluate_gathered(gathered)

    def _evaluate_gathered(self, gathered: list[list[ImagePredictions]]) -> dict[str, Any]:
        per_image: dict[int, ImagePredictions] = {}
        for part in gathered:
            for prediction in part:
                per_image.setdefault(prediction.image_id, prediction)
        predictions = list(per_image.values())
        if self.output_dir:
            os.makedirs(self.output_dir, exist_ok=True)
            path = os.path.join(self.output_dir, f"{self._prefix}_instances_results.json")
            with open(path, "wb") as f:
                written = write_coco_results(f, predictions)
            logger.info("Wrote %d predictions to %s", written, path)
        if not per_image:
            logger.warning("%s received no images; returning no metrics.", type(self).__name__)
            return {}
        has_masks = all(prediction.has_masks for prediction in predictions)
        if not any(prediction.num_detections for prediction in predictions):
            # A model that detects nothing has AP 0 (and a sweep's summary row must not be blank).
            logger.warning(
                "%s received no predictions (%d images processed): every metric is 0.",
                type(self).__name__, len(per_image),
            )  # fmt: skip
            return {
                task: dict.fromkeys(self._metrics, 0.0) for task in self.tasks if task != "segm" or has_masks
            }
        ground_truth = self._load_ground_truth()
        unknown = sorted(set(per_image) - set(ground_truth.getImgIds()))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: predictions for image ids {unknown[:5]} that are not in {self.json_file}; "
                "is the evaluator reading the same data set as the test loader?"
            )
        table = DetectionTable(predictions)
        metrics: dict[str, dict[str, float]] = {}
        per_category: dict[str, list[float]] = {}
        for task in self.tasks:
            if task == "segm" and not has_masks:
                logger.warning("%s: outputs carry no masks; skipping segm.", type(self).__name__)
                continue
            metrics[task], per_category[task] = self._evaluate_task(
                ground_truth, table, task, sorted(per_image)
            )
            if not self._lvis_style:  # LVIS's own evaluation reports the buckets
                metrics[task].update(self._frequency_bucket_metrics(ground_truth, per_category[task]))
            logger.info(
                "Evaluation results for %s (%s):\n%s", task, self._prefix, create_small_table(metrics[task])
            )
        if self.output_dir and per_category:
            self._write_per_category_table(ground_truth, per_category)
        return metrics

    # ------------------------------------------------------------------ COCO API
    def _evaluate_task(
        self, ground_truth: Any, table: DetectionTable, task: str, image_ids: list[int]
    ) -> tuple[dict[str, float], list[float]]:
        """Metrics and per-category AP of one task, the COCO API run on a chunk of categories at a time.

        Each category's precision and recall depend only on its own detections and ground truth, so the
        chunks' arrays, side by side, are those of one run over every category, and the library's own
        summary of them gives the same metrics. What a chunk costs is bounded: the COCO API keeps a record
        per (image, category, area range) and a result dict per detection, which for LVIS val in one go
        took more memory than rank 0 holds otherwise (docs/benchmarks.md).
        """
        # One geometry per entry: with both, the COCO API takes instance areas (S/M/L) from the box.
        fields = [field for field in ENTRY_FIELDS if field != ("segmentation" if task == "bbox" else "bbox")]
        max_dets = [self.max_dets_per_image] if self._lvis_style else [1, 10, self.max_dets_per_image]
        category_ids = sorted(int(c) for c in ground_truth.getCatIds())
        summary = self._create_coco_eval(ground_truth, None, task)
        params = summary.params
        params.imgIds, params.catIds, params.maxDets = image_ids, category_ids, max_dets
        precision, recall = [], []
        for chunk, indices, chunk_image_ids in self._category_chunks(
            ground_truth, table, category_ids, image_ids
        ):
            if not chunk_image_ids:  # no ground truth and no detection of these categories: nothing to score
                shape = (len(params.iouThrs), len(chunk), len(params.areaRng), len(max_dets))
                precision.append(np.full((shape[0], len(params.recThrs), *shape[1:]), -1.0))
                recall.append(np.full(shape, -1.0))
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                coco_eval = self._create_coco_eval(
                    ground_truth, ground_truth.loadRes(table.get_entries(indices, fields)), task
                )
                coco_eval.params.imgIds, coco_eval.params.catIds = chunk_image_ids, chunk
                coco_eval.params.maxDets = max_dets
                coco_eval.evaluate()
                coco_eval.accumulate()
            precision.append(np.asarray(coco_eval.eval["precision"]))
            recall.append(np.asarray(coco_eval.eval["recall"]))
            del coco_eval  # its records and result dicts go before the next chunk builds its own
        summary.eval = {
            "precision": np.concatenate(precision, axis=2),
            "recall": np.concatenate(recall, axis=1),
        }
        if self._lvis_style:  # the r/c/f category groups of APr/APc/APf, as the library's evaluate sets them
            summary.freq_groups = summary._prepare_freq_group()
        with contextlib.redirect_stdout(io.StringIO()):
            summary.summarize()
        if self.backend == "pycocotools":
            stats = dict(zip(_COCO_METRICS.values(), summary.stats[:6]))
        else:
            stats = summary.stats_as_dict
        metrics = {name: _nan_if_missing(stats[label]) for name, label in self._metrics.items()}
        # precision: [IoU thresholds, recall thresholds, categories, area ranges, max dets]
        per_category = []
        for values in np.moveaxis(summary.eval["precision"][:, :, :, 0, -1], 2, 0):
            values = values[values > -1]
            per_category.append(float(values.mean()) * 100.0 if values.size else float("nan"))
        return metrics, per_category

    def _create_coco_eval(self, ground_truth: Any, detections: Any, task: str) -> Any:
        if self.backend == "pycocotools":
            from pycocotools.cocoeval import COCOeval

            return COCOeval(ground_truth, detections, task)
        from faster_coco_eval import COCOeval_faster

        return COCOeval_faster(
            ground_truth, detections, task, lvis_style=self._lvis_style, print_function=logger.debug
        )

    def _category_chunks(
        self, ground_truth: Any, table: DetectionTable, category_ids: list[int], image_ids: list[int]
    ) -> Iterator[tuple[list[int], np.ndarray, list[int]]]:
        """(categories, their detections' numbers in table order, images with ground truth or detections of
        them) per chunk of at most ``_MAX_PAIRS_PER_CHUNK / len(image_ids)`` categories.

        An image with neither ground truth nor detections of a category adds nothing to that category's
        precision, so a chunk evaluates only the images that have some. In the federated protocol the
        detections it ignores (of a category neither annotated nor listed as negative in their image) are
        left out here rather than dropped by the library after it has built their result dicts. pycocotools,
        the reference, evaluates everything in one run as given.
        """
        if self.backend == "pycocotools":
            yield category_ids, np.arange(len(table)), image_ids
            return
        categories = np.asarray(category_ids, dtype=np.int64)
        position, scored = _find(categories, table.category_ids)
        if self._lvis_style:
            scored &= _is_scored_by_federated_protocol(ground_truth, table, categories, image_ids)
        order = np.flatnonzero(scored)
        order = order[np.argsort(position[order], kind="stable")]
        per_chunk = max(_MAX_PAIRS_PER_CHUNK // len(image_ids), 1)
        starts = list(range(0, len(categories), per_chunk))
        bounds = np.searchsorted(position[order], [*starts, len(categories)])
        evaluated = set(image_ids)
        for index, start in enumerate(starts):
            chunk = category_ids[start : start + per_chunk]
            indices = np.sort(order[bounds[index] : bounds[index + 1]])
            with_ground_truth = {i for c in chunk for i in ground_truth.catToImgs.get(c, ())} & evaluated
            yield chunk, indices, sorted(with_ground_truth.union(table.image_ids[indices].tolist()))

    def _frequency_bucket_metrics(self, ground_truth: Any, per_category: list[float]) -> dict[str, float]:
        """APr/APc/APf as LVIS defines them (the mean AP of the bucket's categories that have ground truth),
        when every category's bucket is known (metadata ``class_image_count`` or the json's ``frequency``)."""
        category_ids = sorted(ground_truth.getCatIds())  # the order of the per-category values
        entries = getattr(self.metadata, "class_image_count", None) or []
        frequency = {int(entry["id"]): entry.get("frequency") for entry in entries}
        for category_id in category_ids:
            frequency.setdefault(category_id, ground_truth.cats[category_id].get("frequency"))
        if not category_ids or any(frequency[c] not in ("r", "c", "f") for c in category_ids):
            return {}
        metrics = {}
        for bucket in "rcf":
            values = [
                ap
                for c, ap in zip(category_ids, per_category)
                if frequency[c] == bucket and not math.isnan(ap)
            ]
            metrics[f"AP{bucket}"] = sum(values) / len(values) if values else float("nan")
        return metrics

    def _write_per_category_table(self, ground_truth: Any, per_category: dict[str, list[float]]) -> None:
        categories = [ground_truth.cats[c] for c in sorted(ground_truth.getCatIds())]
        counts = self._train_image_counts()
        entries = getattr(self.metadata, "class_image_count", None) or []
        frequencies = {int(entry["id"]): entry.get("frequency", "") for entry in entries}
        header = ["id", "name", "frequency", "train_images", *[f"{task}_AP" for task in per_category]]
        rows = []
        for index, category in enumerate(categories):
            count = category.get("image_count", counts.get(category["id"], ""))
            frequency = category.get("frequency") or frequencies.get(category["id"], "")
            ap_cells = [_format_ap(values[index]) for values in per_category.values()]
            rows.append([category["id"], category.get("name", ""), frequency, count, *ap_cells])
        base = os.path.join(self.output_dir, f"{self._prefix}_per_category_ap")
        with open(base + ".csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
        with open(base + ".md", "w") as f:
            f.write("| " + " | ".join(header) + " |\n|" + "|".join("---" for _ in header) + "|\n")
            f.writelines("| " + " | ".join(str(cell) for cell in row) + " |\n" for row in rows)
        logger.info("Wrote per-category AP to %s.csv and .md", base)

    def _train_image_counts(self) -> dict[int, int]:
        """Train image count per json category id, from the metadata's ``class_image_count``."""
        entries = getattr(self.metadata, "class_image_count", None) or []
        return {int(entry["id"]): int(entry["image_count"]) for entry in entries}


def _complete_annotations(ground_truth: Any) -> None:
    """Fill what the COCO protocol reads and exports may omit: ``iscrowd`` (0) and ``area`` (of the mask, else
    of the box)."""
    changed = False
    for annotation in ground_truth.dataset.get("annotations") or []:
        if "iscrowd" not in annotation:
            annotation["iscrowd"], changed = 0, True
        if "area" not in annotation:
            if annotation.get("segmentation"):
                area = float(mask_util.area(ground_truth.annToRLE(annotation)))
            else:
                area = float(annotation["bbox"][2] * annotation["bbox"][3])
            annotation["area"], changed = area, True
    if changed:
        ground_truth.createIndex()


def _format_ap(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.2f}"


def _find(sorted_values: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position of each of `values` in `sorted_values`, whether it is there)."""
    position = np.searchsorted(sorted_values, values)
    inside = position < len(sorted_values)
    found = np.zeros(len(values), dtype=bool)
    found[inside] = sorted_values[position[inside]] == values[inside]
    return position, found


def _is_scored_by_federated_protocol(
    ground_truth: Any, table: DetectionTable, categories: np.ndarray, image_ids: list[int]
) -> np.ndarray:
    """Per detection: is its category annotated in its image or listed in the image's ``neg_category_ids``
    (the LVIS rule, as faster-coco-eval's ``lvis_style`` applies it)?"""
    keys = []
    for index, image_id in enumerate(image_ids):
        listed = {annotation["category_id"] for annotation in ground_truth.imgToAnns.get(image_id, ())}
        listed.update(ground_truth.imgs[image_id].get("neg_category_ids") or ())
        position, found = _find(categories, np.array(sorted(listed), dtype=np.int64))
        keys.append(index * len(categories) + position[found])
    image_position, _ = _find(np.asarray(image_ids, dtype=np.int64), table.image_ids)
    category_position, _ = _find(categories, table.category_ids)
    allowed = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    return np.isin(image_position * len(categories) + category_position, allowed)
