"""LVIS evaluation: the federated LVIS protocol (faster-coco-eval's ``lvis_style``) with APr/APc/APf.

LVIS is annotated federatedly: a detection of category c in an image counts only when c is annotated there
or listed in the image's ``neg_category_ids``; unmatched detections of a category in
``not_exhaustive_category_ids`` are not false positives. Categories fall into frequency buckets by the
number of train images they appear in: rare (1-10), common (11-100), frequent (>100).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lazytrain.evaluation.coco_evaluation import _LVIS_METRICS, TASKS, COCOEvaluator
from lazytrain.evaluation.fixed_ap import CategoryTopK, evaluate_fixed_ap, take_detections
from lazytrain.evaluation.predictions import pack_instances
from lazytrain.utils import comm
from lazytrain.utils.logger import create_small_table
from lazytrain.utils.preemption import abandon_on_stop

__all__ = ["LVISEvaluator", "get_frequency_bucket"]

logger = logging.getLogger(__name__)


def get_frequency_bucket(image_count: int) -> str:
    """LVIS frequency bucket of a category seen in `image_count` train images: ``"r"``, ``"c"`` or ``"f"``."""
    if image_count <= 10:
        return "r"
    return "c" if image_count <= 100 else "f"


class LVISEvaluator(COCOEvaluator):
    """Box and mask AP with the LVIS protocol, including APr/APc/APf, on faster-coco-eval.

    The ground-truth json needs ``neg_category_ids`` and ``not_exhaustive_category_ids`` per image (an
    exhaustively annotated synthetic set must list every absent category as negative, or wrong-class false
    positives go uncounted) and a ``frequency`` per category; missing frequencies are derived from the
    category's ``image_count`` or the metadata's ``class_image_count``. At most `max_dets_per_image`
    top-scoring detections per image are kept, over all categories, as the LVIS API does.

    `ap_fixed` and `ap_pool` add Dave et al.'s metrics (`lazytrain.evaluation.fixed_ap`) to each task's
    results: ``APfixed`` (and ``APfixed50``, ..., ``APfixed_r``/``_c``/``_f``), LVIS AP on the
    `max_dets_per_category` best detections of each category over the data set with no per-image cap, and
    ``APpool`` (``APpool_r``/``_c``/``_f``), one ranking of all categories' detections. They are only as good as
    the detections the model gives: with the usual 0.05 score threshold or 300 detections per image, few
    categories get near `max_dets_per_category` (the log says how many do, and the most detections one image
    had; README, "AP-fixed and AP-pool", has the paper's inference as model keys). Each process holds its
    running top `max_dets_per_category` per category and sends at most that many of each; the main process
    merges the processes' shares one at a time (`CategoryTopK.merge`), so it holds about twice K per category,
    whatever the number of processes. The standard metrics are unchanged.

    Args:
        dataset_name: registered data set, used for its metadata (may be None with `json_file`).
        tasks: ``"bbox"`` and/or ``"segm"``.
        max_dets_per_image: detections kept per image (LVIS: 300) for the standard metrics.
        output_dir: where to write ``lvis_instances_results.json`` and ``lvis_per_category_ap.csv``/``.md``.
        json_file: ground-truth json path; overrides the metadata's.
        ap_fixed: add the AP-fixed metrics.
        ap_pool: add the AP-pool metrics.
        max_dets_per_category: K of AP-fixed and AP-pool, detections kept per category (Dave et al.: 10,000
            for LVIS).
    """

    _prefix = "lvis"
    _lvis_style = True
    _metrics = _LVIS_METRICS

    def __init__(
        self,
        dataset_name: str | None = None,
        tasks: Sequence[str] = TASKS,
        max_dets_per_image: int = 300,
        output_dir: str | None = None,
        *,
        json_file: str | None = None,
        ap_fixed: bool = False,
        ap_pool: bool = False,
        max_dets_per_category: int = 10_000,
    ) -> None:
        if isinstance(max_dets_per_category, bool) or int(max_dets_per_category) < 1:
            raise ValueError(
                f"LVISEvaluator(max_dets_per_category=) must be an int >= 1 (the K of AP-fixed and AP-pool; "
                f"Dave et al. use 10000 on LVIS); got {max_dets_per_category!r}"
            )
        super().__init__(
            dataset_name,
            tasks,
            max_dets_per_image,
            output_dir,
            backend="faster_coco_eval",
            json_file=json_file,
        )
        self.ap_fixed, self.ap_pool = bool(ap_fixed), bool(ap_pool)
        self.max_dets_per_category = int(max_dets_per_category)
        self._top_k: CategoryTopK | None = None
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._top_k = CategoryTopK(self.max_dets_per_category) if self.ap_fixed or self.ap_pool else None
        self._most_detections_in_an_image = 0

    def process(self, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
        if self._top_k is None:
            super().process(inputs, outputs)
            return
        category_ids = np.asarray(self.get_category_ids(), dtype=np.int64)
        for record, output in zip(inputs, outputs):
            instances = output["instances"]
            scores = torch.as_tensor(instances["scores"]).detach().cpu()
            self._most_detections_in_an_image = max(self._most_detections_in_an_image, len(scores))
            classes = torch.as_tensor(instances["classes"]).detach().cpu().long().reshape(-1).numpy()
            valid = (classes >= 0) & (classes < len(category_ids))
            may_enter = self._top_k.may_enter(
                category_ids[np.where(valid, classes, 0)], scores.double().numpy()
            )
            # The standard metrics' detections, exactly as `COCOEvaluator.process` keeps them.
            image_top = torch.arange(len(scores))
            if len(scores) > self.max_dets_per_image:
                image_top = scores.topk(self.max_dets_per_image).indices
            # Mask encoding is most of the cost: only what either set needs is packed (an invalid class too,
            # for `pack_instances`'s error).
            kept = may_enter | ~valid
            kept[image_top.numpy()] = True
            packed_index = np.cumsum(kept) - 1
            keep = torch.from_numpy(np.flatnonzero(kept))
            packed = pack_instances(
                {k: v[keep] for k, v in instances.items()}, record["image_id"], category_ids
            )
            self._predictions.append(take_detections(packed, packed_index[image_top.numpy()]))
            self._top_k.add(take_detections(packed, packed_index[np.flatnonzero(may_enter)]))

    def evaluate(self) -> dict[str, Any]:
        if self._top_k is None:
            return super().evaluate()
        # Each process sends at most K per category (a process never needs more), with the masks of those
        # only; the main process merges them as they arrive, one process's at a time, cutting to K after each.
        # All of it before the main process's long work, so that no process waits on it to send.
        states = comm.gather_in_turn(self._top_k.get_state(), dst=0)
        top_k = CategoryTopK.merge(self.max_dets_per_category, states)
        most_in_an_image = comm.max_over_ranks(self._most_detections_in_an_image)
        results = super().evaluate()
        if not results:
            return results
        with abandon_on_stop():
            detections = top_k.get_detections()
            self._log_detections_per_category(detections, most_in_an_image)
            ground_truth = self._load_ground_truth()
            for task, metrics in results.items():
                added = evaluate_fixed_ap(
                    ground_truth, detections, task, sorted(top_k.image_ids), fixed=self.ap_fixed,
                    pooled=self.ap_pool,
                )  # fmt: skip
                logger.info("AP-fixed / AP-pool for %s (lvis):\n%s", task, create_small_table(added))
                metrics.update(added)
        return results

    def _log_detections_per_category(self, detections: list[Any], most_in_an_image: int) -> None:
        found = np.concatenate([p.category_ids for p in detections]) if detections else np.zeros(0, np.int64)
        full = int(np.sum(np.unique(found, return_counts=True)[1] >= self.max_dets_per_category))
        logger.info(
            "AP-fixed / AP-pool: %d of %d categories have K=%d detections, the others fewer (they score lower "
            "than with K: lower model.roi_heads.score_thresh). The most detections in one image: %d (if that is "
            "model.roi_heads.detections_per_img, the cap cut some: the paper's inference has none, "
            "detections_per_img=null).",
            full, len(self.get_category_ids()), self.max_dets_per_category, most_in_an_image,
        )  # fmt: skip

    def _prepare_ground_truth(self, ground_truth: Any) -> None:
        counts = self._train_image_counts()
        frequencies = {
            int(entry["id"]): entry["frequency"]
            for entry in getattr(self.metadata, "class_image_count", None) or []
            if "frequency" in entry
        }
        for category in ground_truth.dataset["categories"]:
            if category.get("frequency") in ("r", "c", "f"):
                continue
            category_id = int(category["id"])
            if category_id in frequencies:
                category["frequency"] = frequencies[category_id]
            elif "image_count" in category or category_id in counts:
                category["frequency"] = get_frequency_bucket(
                    int(category.get("image_count", counts.get(category_id)))
                )
            else:
                raise ValueError(
                    f"LVISEvaluator: category {category_id} ({category.get('name', '?')}) in {self.json_file} has "
                    "no 'frequency' ('r'/'c'/'f') or 'image_count', and the metadata has no class_image_count "
                    "for it; APr/APc/APf need one of them."
                )
        ground_truth.createIndex()
