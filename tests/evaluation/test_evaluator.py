import logging

import pytest
import torch
from torch import nn

from lazytrain.evaluation import DatasetEvaluator, DatasetEvaluators, inference_on_dataset


class _EchoModel(nn.Module):
    """Returns one output per input and records the mode it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, inputs):
        self.seen.append((self.training, torch.is_inference_mode_enabled()))
        return [{"value": self.weight * x["x"]} for x in inputs]


class _CountingEvaluator(DatasetEvaluator):
    def __init__(self, task: str = "count") -> None:
        self.task = task
        self.resets = 0
        self.images = 0

    def reset(self) -> None:
        self.resets += 1
        self.images = 0

    def process(self, inputs, outputs):
        assert len(inputs) == len(outputs)
        self.images += len(inputs)

    def evaluate(self):
        return {self.task: {"images": float(self.images)}}


def _loader(batches=7, batch_size=3):
    return [
        [{"x": torch.tensor(float(i * batch_size + j))} for j in range(batch_size)] for i in range(batches)
    ]


@pytest.mark.parametrize("training", [True, False], ids=["from-train", "from-eval"])
def test_runs_in_eval_and_inference_mode_and_restores_mode(training):
    model = _EchoModel().train(training)
    evaluator = _CountingEvaluator()
    results = inference_on_dataset(model, _loader(), evaluator)
    assert results == {"count": {"images": 21.0}}
    assert evaluator.resets == 1
    assert set(model.seen) == {(False, True)}
    assert model.training is training


def test_mode_is_restored_when_the_model_fails():
    model = _EchoModel().train()

    def broken(inputs):
        raise RuntimeError("boom")

    model.forward = broken
    with pytest.raises(RuntimeError, match="boom"):
        inference_on_dataset(model, _loader(), _CountingEvaluator())
    assert model.training


def test_logs_timing_and_accepts_a_list_or_none(caplog):
    with caplog.at_level(logging.INFO, logger="lazytrain.evaluation"):
        results = inference_on_dataset(
            _EchoModel(), _loader(), [_CountingEvaluator("a"), _CountingEvaluator("b")]
        )
    assert results == {"a": {"images": 21.0}, "b": {"images": 21.0}}
    assert "Inference on 21 images" in caplog.text and "s/image" in caplog.text
    assert inference_on_dataset(_EchoModel(), iter(_loader()), None) == {}  # unsized loader, no evaluator


def test_evaluators_with_the_same_task_are_an_error():
    evaluators = DatasetEvaluators([_CountingEvaluator("x"), _CountingEvaluator("x")])
    with pytest.raises(ValueError, match="two evaluators report task 'x'"):
        evaluators.evaluate()
