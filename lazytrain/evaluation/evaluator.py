"""The evaluator protocol (`DatasetEvaluator`), combining evaluators, and the inference loop.

An evaluator sees every batch given to the model and the model's outputs (`process`), then computes metrics
once (`evaluate`) on the main process after gathering what each process saw. `inference_on_dataset` runs a
model over a loader and feeds an evaluator.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from lazytrain.utils import comm
from lazytrain.utils.preemption import EvaluationStopped, abandon_on_stop, get_stop_request

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "inference_on_dataset"]

logger = logging.getLogger(__name__)


class DatasetEvaluator:
    """Base class of evaluators: accumulate model outputs batch by batch, then compute metrics.

    Subclasses implement `reset`, `process` and `evaluate`. In a multi-process run every process calls
    `process` on its shard and `evaluate`; the evaluator gathers to the main process (`comm.gather`), which
    returns the metrics while the others return ``{}``.
    """

    def reset(self) -> None:
        """Forget everything processed so far (called before each evaluation)."""

    def process(self, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
        """Take in one batch given to the model (`inputs`) and its outputs (same order)."""

    def evaluate(self) -> dict[str, Any]:
        """Metrics as ``{task: {metric: float}}`` on the main process; ``{}`` elsewhere or when empty."""
        return {}


class DatasetEvaluators(DatasetEvaluator):
    """Several evaluators run as one; their results are merged (a task name may appear only once).

    Args:
        evaluators: the evaluators, called in order.
    """

    def __init__(self, evaluators: Sequence[DatasetEvaluator]) -> None:
        self.evaluators = list(evaluators)

    def reset(self) -> None:
        for evaluator in self.evaluators:
            evaluator.reset()

    def process(self, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
        for evaluator in self.evaluators:
            evaluator.process(inputs, outputs)

    def evaluate(self) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for evaluator in self.evaluators:
            for task, metrics in (evaluator.evaluate() or {}).items():
                if task in results:
                    raise ValueError(
                        f"DatasetEvaluators: two evaluators report task '{task}' ({type(evaluator).__name__} "
                        "and an earlier one); give them distinct task names."
                    )
                results[task] = metrics
        return results


def _length(loader: Iterable) -> int | None:
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None


def _abandon_together_on_stop() -> None:
    """Every rank gets here once per evaluation, finished or stopped; if any rank got a stop signal during
    training, all abandon the evaluation together (before the evaluator's collective gather)."""
    request = get_stop_request()
    if request is None:  # not training: signals keep their usual effect
        return
    signum = comm.max_over_ranks(request.signum)
    if signum:
        raise EvaluationStopped(signum)


def inference_on_dataset(
    model: nn.Module,
    data_loader: Iterable[list[dict[str, Any]]],
    evaluator: DatasetEvaluator | Sequence[DatasetEvaluator] | None,
) -> dict[str, Any]:
    """Run `model` on every batch of `data_loader` in eval and inference mode and evaluate the outputs.

    The model's training/eval mode is restored afterwards. The main process shows a progress bar (images/s,
    ETA) and logs the total time and the time per image (model time excludes the first few warm-up batches).

    Args:
        model: takes a list of dicts (one per image) and returns one output per image.
        data_loader: yields lists of dicts; in a multi-process run each process gets its own shard.
        evaluator: an evaluator, a list of them, or None to only time the model.

    Returns:
        The evaluator's results on the main process (``{}`` on the others or without an evaluator).
    """
    evaluator = _as_evaluator(evaluator)
    evaluator.reset()
    num_batches = _length(data_loader)
    warmup = min(5, num_batches - 1) if num_batches else 0
    was_training = model.training
    start = time.perf_counter()
    progress = _progress_bar(num_batches)
    try:
        num_images, model_time, timed_images = _run_batches(
            model, data_loader, evaluator, warmup, progress, start
        )
    finally:
        progress.close()
        model.train(was_training)
    _abandon_together_on_stop()
    _log_inference_time(num_images, time.perf_counter() - start, model_time, timed_images, warmup)
    results = evaluator.evaluate()
    return results if results is not None else {}


def _as_evaluator(evaluator: DatasetEvaluator | Sequence[DatasetEvaluator] | None) -> DatasetEvaluator:
    if evaluator is None:
        return DatasetEvaluators([])
    if not isinstance(evaluator, DatasetEvaluator):
        return DatasetEvaluators(evaluator)
    return evaluator


def _progress_bar(num_batches: int | None) -> tqdm:
    """Batches done, images/s and ETA; shown on the main process only."""
    return tqdm(
        total=num_batches,
        desc="inference",
        unit="batch",
        disable=not comm.is_main_process(),
        dynamic_ncols=True,
    )


def _run_batches(
    model: nn.Module,
    data_loader: Iterable[list[dict[str, Any]]],
    evaluator: DatasetEvaluator,
    warmup: int,
    progress: tqdm,
    start: float,
) -> tuple[int, float, int]:
    """Put `model` in eval mode and feed it and `evaluator` every batch, in inference mode.

    A stop request abandons the loop (the ranks agree on it afterwards, in `_abandon_together_on_stop`).

    Returns:
        Images seen, model seconds after the first `warmup` batches, and the images those seconds cover;
        counted up to where the loop stopped.
    """
    num_images, model_time, timed_images = 0, 0.0, 0
    try:
        model.eval()
        with torch.inference_mode(), abandon_on_stop():
            for index, inputs in enumerate(data_loader):
                if index == warmup:
                    model_time, timed_images = 0.0, 0
                tick = time.perf_counter()
                outputs = model(inputs)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                model_time += time.perf_counter() - tick
                timed_images += len(inputs)
                evaluator.process(inputs, outputs)
                num_images += len(inputs)
                progress.update(1)
                progress.set_postfix(img_s=f"{num_images / (time.perf_counter() - start):.2f}", refresh=False)
    except EvaluationStopped:
        pass  # the ranks agree in `inference_on_dataset`, after the model's mode is restored
    return num_images, model_time, timed_images


def _log_inference_time(
    num_images: int, total: float, model_time: float, timed_images: int, warmup: int
) -> None:
    logger.info(
        "Inference on %d images took %s (%.4f s/image; model %.4f s/image after %d warm-up batches) on %d "
        "process(es)",
        num_images, datetime.timedelta(seconds=int(total)), total / max(num_images, 1),
        model_time / max(timed_images, 1), warmup, comm.get_world_size(),
    )  # fmt: skip
