"""Evaluation: the evaluator protocol, the inference loop, COCO and LVIS evaluators."""
