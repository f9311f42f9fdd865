"""COCO and LVIS instance evaluation (bbox and segm) on faster-coco-eval.

`COCOEvaluator` reports AP, AP50, AP75, APs, APm, APl; `LVISEvaluator` uses the federated LVIS protocol
(``lvis_style=True``: detections of a category count as false positives only in images where it is
annotated or a verified negative) and adds APr, APc, APf. Both write ``<task>_instances_results.json`` and
a per-category AP table (with each category's r/c/f bucket and train image count when the json has them).
``COCOEvaluator(backend="pycocotools")`` uses the reference implementation as a cross-check.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
from collections.abc import Sequence

import numpy as np

from lazytrain.evaluation.evaluator import DatasetEvaluator
from lazytrain.utils import comm
from lazytrain.utils.logger import create_small_table

__all__ = ["COCOEvaluator", "LVISEvaluator", "instances_to_coco_json"]

logger = logging.getLogger(__name__)

_COCO_METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")
# faster-coco-eval's stats_as_dict names -> the names lazytrain reports
_STATS_KEYS = {
    "AP": "AP_all",
    "AP50": "AP_50",
    "AP75": "AP_75",
    "APs": "AP_small",
    "APm": "AP_medium",
    "APl": "AP_large",
    "APr": "APr",
    "APc": "APc",
    "APf": "APf",
}


def instances_to_coco_json(instances: dict, image_id: int, contiguous_to_json: Sequence[int]) -> list[dict]:
    """One image's predicted instances -> COCO result dicts (XYWH boxes, RLE masks, json category ids)."""
    from pycocotools import mask as mask_util

    boxes = instances["boxes"].detach().cpu().numpy().astype(np.float64)
    scores = instances["scores"].detach().cpu().numpy().tolist()
    classes = instances["classes"].detach().cpu().numpy().tolist()
    masks = instances.get("masks")
    results = []
    for i, (box, score, cls) in enumerate(zip(boxes, scores, classes)):
        if not 0 <= cls < len(contiguous_to_json):
            raise ValueError(
                f"evaluator: image {image_id} has a prediction of class {cls}, outside the data set's "
                f"{len(contiguous_to_json)} categories; check model.num_classes against the data set."
            )
        result = {
            "image_id": int(image_id),
            "category_id": int(contiguous_to_json[cls]),
            "score": float(score),
            "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
        }
        if masks is not None:
            mask = masks[i].detach().cpu().numpy().astype(np.uint8)
            rle = mask_util.encode(np.asfortranarray(mask))
            result["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
        results.append(result)
    return results


class COCOEvaluator(DatasetEvaluator):
    """COCO-style AP for bbox and segm.

    Args:
        dataset_name: a registered data set (its metadata gives ``json_file``), used when `json_file` is None.
        tasks: ``("bbox", "segm")`` or a subset.
        max_dets_per_image: detections per image counted.
        output_dir: where result json and per-category table go (None: not written).
        backend: "faster_coco_eval" (default) or "pycocotools".
        json_file: ground truth annotation file (overrides the metadata's).
    """

    lvis_style = False

    def __init__(
        self,
        dataset_name: str | None = None,
        tasks: Sequence[str] = ("bbox", "segm"),
        max_dets_per_image: int = 100,
        output_dir: str | None = None,
        backend: str = "faster_coco_eval",
        json_file: str | None = None,
    ) -> None:
        if backend not in ("faster_coco_eval", "pycocotools"):
            raise ValueError(
                f"{type(self).__name__}(backend=) must be 'faster_coco_eval' or 'pycocotools'; got {backend!r}"
            )
        if backend == "pycocotools" and self.lvis_style:
            raise ValueError(
                "LVISEvaluator needs backend='faster_coco_eval' (pycocotools has no LVIS protocol)"
            )
        if json_file is None:
            from lazytrain.data.catalog import MetadataCatalog

            json_file = MetadataCatalog.get(dataset_name).get("json_file")
            if json_file is None:
                raise ValueError(
                    f"{type(self).__name__}: data set '{dataset_name}' has no json_file in its metadata; load it first or pass json_file="
                )
        self.json_file, self.tasks, self.max_dets = json_file, tuple(tasks), max_dets_per_image
        self.output_dir, self.backend = output_dir, backend
        with open(json_file) as f:
            self._gt_data = json.load(f)
        self._contiguous_to_json = sorted(c["id"] for c in self._gt_data["categories"])
        self.reset()

    def reset(self) -> None:
        self._predictions: list[dict] = []

    def process(self, inputs: list[dict], outputs: list[dict]) -> None:
        for item, output in zip(inputs, outputs):
            self._predictions.extend(
                instances_to_coco_json(output["instances"], item["image_id"], self._contiguous_to_json)
            )

    def _coco_api(self):
        if self.backend == "pycocotools":
            from pycocotools.coco import COCO
            from pycocotools.cocoeval import COCOeval

            return COCO, COCOeval
        from faster_coco_eval import COCO, COCOeval_faster

        return COCO, COCOeval_faster

    def evaluate(self) -> dict:
        predictions = [p for chunk in comm.gather(self._predictions) for p in chunk]
        if not comm.is_main_process():
            return {}
        if not predictions:
            logger.warning("%s: no predictions to evaluate; returning an empty result.", type(self).__name__)
            return {}
        if self.output_dir:
            os.makedirs(self.output_dir, exist_ok=True)
        coco_class, eval_class = self._coco_api()
        with contextlib.redirect_stdout(io.StringIO()):
            gt = coco_class(self.json_file)
        results = {}
        for task in self.tasks:
            task_predictions = [p for p in predictions if task == "bbox" or "segmentation" in p]
            if self.output_dir:
                with open(os.path.join(self.output_dir, f"{task}_instances_results.json"), "w") as f:
                    json.dump(task_predictions, f)
            results[task] = self._evaluate_task(gt, eval_class, task, task_predictions)
            logger.info("Evaluation results for %s:\n%s", task, create_small_table(results[task]))
        return results

    def _evaluate_task(self, gt, eval_class, task: str, predictions: list[dict]) -> dict:
        if task == "bbox":
            predictions = [{k: v for k, v in p.items() if k != "segmentation"} for p in predictions]
        with contextlib.redirect_stdout(io.StringIO()):
            dt = gt.loadRes(predictions)
            kwargs = {"lvis_style": True} if self.lvis_style else {}
            if self.backend == "faster_coco_eval":
                kwargs["print_function"] = logger.debug
            evaluation = eval_class(gt, dt, task, **kwargs)
            evaluation.params.maxDets = [1, 10, self.max_dets]
            evaluation.evaluate()
            evaluation.accumulate()
            evaluation.summarize()
        if self.backend == "pycocotools":
            values = dict(zip(_COCO_METRICS, evaluation.stats[:6]))
        else:
            stats = evaluation.stats_as_dict
            values = {name: stats[key] for name, key in _STATS_KEYS.items() if key in stats}
        metrics = {name: float(value * 100) if value >= 0 else math.nan for name, value in values.items()}
        self._write_per_category(task, evaluation)
        return metrics

    def _write_per_category(self, task: str, evaluation) -> None:
        if not self.output_dir:
            return
        precision = evaluation.eval["precision"]  # [iou, recall, category, area, max dets]
        categories = {c["id"]: c for c in self._gt_data["categories"]}
        lines = ["| category | id | frequency | train image count | AP |", "|---|---|---|---|---|"]
        for k, category_id in enumerate(evaluation.params.catIds):
            values = precision[:, :, k, 0, -1]
            values = values[values > -1]
            ap = float(values.mean() * 100) if values.size else math.nan
            c = categories[category_id]
            lines.append(
                f"| {c['name']} | {category_id} | {c.get('frequency', '-')} | {c.get('image_count', '-')} | {ap:.2f} |"
            )
        with open(os.path.join(self.output_dir, f"{task}_per_category_ap.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


class LVISEvaluator(COCOEvaluator):
    """LVIS federated evaluation (AP, AP50, AP75, APs/m/l, APr, APc, APf), 300 detections per image.

    Args: as `COCOEvaluator` (backend is always faster_coco_eval).
    """

    lvis_style = True

    def __init__(
        self,
        dataset_name: str | None = None,
        tasks: Sequence[str] = ("bbox", "segm"),
        max_dets_per_image: int = 300,
        output_dir: str | None = None,
        json_file: str | None = None,
    ) -> None:
        super().__init__(dataset_name, tasks, max_dets_per_image, output_dir, "faster_coco_eval", json_file)
