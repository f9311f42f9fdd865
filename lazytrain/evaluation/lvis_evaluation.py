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

from lazytrain.evaluation.coco_evaluation import _LVIS_METRICS, TASKS, COCOEvaluator

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

    Args:
        dataset_name: registered data set, used for its metadata (may be None with `json_file`).
        tasks: ``"bbox"`` and/or ``"segm"``.
        max_dets_per_image: detections kept per image (LVIS: 300).
        output_dir: where to write ``lvis_instances_results.json`` and ``lvis_per_category_ap.csv``/``.md``.
        json_file: ground-truth json path; overrides the metadata's.
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
    ) -> None:
        super().__init__(
            dataset_name,
            tasks,
            max_dets_per_image,
            output_dir,
            backend="faster_coco_eval",
            json_file=json_file,
        )

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
