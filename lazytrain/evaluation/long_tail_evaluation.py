"""Long-tail metrics for any COCO- or LVIS-format data set: AP with APr/APc/APf, under the protocol its json
supports.

An LVIS-style val json (images listing ``neg_category_ids``) is evaluated with LVIS's federated protocol
(`LVISEvaluator`). Any other json is taken as exhaustively annotated, COCO's assumption: every category not
annotated in an image is absent there, so a detection of it is a false positive (`COCOEvaluator`, COCO AP
with maxDets 100). Both report APr/APc/APf from the r/c/f bucket of each category, which the metadata holds
(`lazytrain.data.datasets.custom.bin_categories`: the json's LVIS ``frequency``, else train image counts).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lazytrain.evaluation.coco_evaluation import TASKS, COCOEvaluator
from lazytrain.evaluation.evaluator import DatasetEvaluator
from lazytrain.evaluation.lvis_evaluation import LVISEvaluator

__all__ = ["PROTOCOL_KEY", "LongTailEvaluator"]

logger = logging.getLogger(__name__)

PROTOCOL_KEY = "eval_protocol"
"""Results carry ``{PROTOCOL_KEY: {protocol: 1.0}}``; metrics.json then has ``eval_protocol/exhaustive`` or
``eval_protocol/federated``."""

_DESCRIPTIONS = {
    "federated": "federated (LVIS): {json} lists neg_category_ids, so a detection of a category counts only in "
    "images where it is annotated or listed as absent",
    "exhaustive": "exhaustive (COCO-style): {json} lists no neg_category_ids, so every category not annotated "
    "in an image counts as absent there and its detections as false positives",
}


class LongTailEvaluator(DatasetEvaluator):
    """Box and mask AP plus APr/APc/APf for a data set registered with `register_json_dataset`.

    The protocol is the metadata's ``evaluation_protocol`` (``"federated"`` when the json lists
    ``neg_category_ids``, else ``"exhaustive"``); it is logged with the rule that binned the categories and
    reported in the results as ``eval_protocol/<protocol>: 1.0``. To force a protocol, use `LVISEvaluator`
    or `COCOEvaluator` directly.

    Args:
        dataset_name: the registered val/test data set.
        tasks: ``"bbox"`` and/or ``"segm"``.
        max_dets_per_image: detections per image; None: the protocol's own (LVIS 300, COCO 100).
        output_dir: where the evaluator writes predictions and the per-category AP table.
        ap_fixed, ap_pool, max_dets_per_category: AP-fixed and AP-pool (`LVISEvaluator`'s), federated
            protocol only.
    """

    def __init__(
        self,
        dataset_name: str,
        tasks: Sequence[str] = TASKS,
        max_dets_per_image: int | None = None,
        output_dir: str | None = None,
        *,
        ap_fixed: bool = False,
        ap_pool: bool = False,
        max_dets_per_category: int = 10_000,
    ) -> None:
        from lazytrain.data.catalog import MetadataCatalog

        metadata = MetadataCatalog.get(dataset_name)
        self.protocol = metadata.get("evaluation_protocol") or (
            "federated" if metadata.get("evaluator_type") == "lvis" else "exhaustive"
        )
        if self.protocol == "federated":
            self.evaluator: COCOEvaluator = LVISEvaluator(
                dataset_name, tasks, max_dets_per_image or 300, output_dir, ap_fixed=ap_fixed, ap_pool=ap_pool,
                max_dets_per_category=max_dets_per_category,
            )  # fmt: skip
        else:
            if ap_fixed or ap_pool:
                raise ValueError(
                    f"LongTailEvaluator(ap_fixed=, ap_pool=): AP-fixed and AP-pool follow LVIS's federated "
                    f"protocol, and {metadata.get('json_file')} lists no neg_category_ids (exhaustive "
                    "protocol); evaluate without them."
                )
            self.evaluator = COCOEvaluator(dataset_name, tasks, max_dets_per_image or 100, output_dir)
        description = _DESCRIPTIONS[self.protocol].format(json=self.evaluator.json_file)
        rule = metadata.get("frequency_rule")
        logger.info(
            "Evaluation protocol for %s: %s.%s",
            dataset_name,
            description,
            f" APr/APc/APf bin categories by {rule}." if rule else "",
        )

    def reset(self) -> None:
        self.evaluator.reset()

    def process(self, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
        self.evaluator.process(inputs, outputs)

    def evaluate(self) -> dict[str, Any]:
        results = self.evaluator.evaluate()
        if results:
            results[PROTOCOL_KEY] = {self.protocol: 1.0}
        return results
