"""The evaluator protocol and the inference loop.

An evaluator implements ``reset()``, ``process(inputs, outputs)`` for each batch and ``evaluate()``, which
returns ``{task: {metric: float}}`` on the main process (after gathering from all ranks) and ``{}`` on the
others. `inference_on_dataset` runs a model over a loader and feeds an evaluator.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager

import torch

from lazytrain.utils import comm

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "inference_on_dataset"]

logger = logging.getLogger(__name__)


class DatasetEvaluator:
    """Base of evaluators: accumulate predictions in `process`, compute metrics in `evaluate`."""

    def reset(self) -> None:
        pass

    def process(self, inputs: list[dict], outputs: list[dict]) -> None:
        raise NotImplementedError

    def evaluate(self) -> dict:
        raise NotImplementedError


class DatasetEvaluators(DatasetEvaluator):
    """Several evaluators as one; their result dicts are merged (task names must not clash)."""

    def __init__(self, evaluators: Sequence[DatasetEvaluator]) -> None:
        self.evaluators = list(evaluators)

    def reset(self) -> None:
        for evaluator in self.evaluators:
            evaluator.reset()

    def process(self, inputs: list[dict], outputs: list[dict]) -> None:
        for evaluator in self.evaluators:
            evaluator.process(inputs, outputs)

    def evaluate(self) -> dict:
        results: dict = {}
        for evaluator in self.evaluators:
            for task, metrics in (evaluator.evaluate() or {}).items():
                if task in results:
                    raise ValueError(f"DatasetEvaluators: two evaluators report task '{task}'")
                results[task] = metrics
        return results


@contextmanager
def _eval_mode(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def inference_on_dataset(
    model: torch.nn.Module, data_loader: Iterable, evaluator: DatasetEvaluator | None
) -> dict:
    """Run `model` on every batch of `data_loader` in eval + inference mode and evaluate.

    The model's training mode is restored afterwards. Shows a progress bar on the main process and logs the
    total and per-image time. Returns the evaluator's results ({} on non-main ranks or without evaluator).
    """
    from tqdm import tqdm

    if evaluator is not None:
        evaluator.reset()
    total = len(data_loader) if hasattr(data_loader, "__len__") else None
    logger.info("Start inference on %s batches", total if total is not None else "?")
    num_images = 0
    start = time.perf_counter()
    progress = tqdm(
        total=total, desc="inference", unit="batch", disable=not comm.is_main_process(), mininterval=2.0
    )
    with _eval_mode(model), torch.inference_mode():
        for inputs in data_loader:
            outputs = model(inputs)
            if evaluator is not None:
                evaluator.process(inputs, outputs)
            num_images += len(inputs)
            progress.update(1)
    progress.close()
    seconds = time.perf_counter() - start
    logger.info(
        "Inference done: %d images in %s (%.4f s / image on this rank)",
        num_images,
        datetime.timedelta(seconds=int(seconds)),
        seconds / max(num_images, 1),
    )
    results = evaluator.evaluate() if evaluator is not None else {}
    return results if comm.is_main_process() else {}
