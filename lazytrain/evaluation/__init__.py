"""Evaluation: the evaluator protocol, the inference loop, COCO, LVIS and long-tail instance evaluators."""

from lazytrain.evaluation.coco_evaluation import COCOEvaluator, instances_to_coco_json
from lazytrain.evaluation.evaluator import DatasetEvaluator, DatasetEvaluators, inference_on_dataset
from lazytrain.evaluation.long_tail_evaluation import LongTailEvaluator
from lazytrain.evaluation.lvis_evaluation import LVISEvaluator

__all__ = [
    "COCOEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "LVISEvaluator",
    "LongTailEvaluator",
    "inference_on_dataset",
    "instances_to_coco_json",
]
