"""`PeriodicWriter` logs a model's fixed-shape counters (`RCNN.fixed_shape_counters`) at write time only."""

from __future__ import annotations

import json
import logging

import torch

from lazytrain.engine.hooks import PeriodicWriter
from lazytrain.engine.train_loop import SimpleTrainer
from lazytrain.modeling.fixed_shapes import FixedShapeCounters
from tests.engine import toy


class CountingRegressor(toy.ToyRegressor):
    """The toy model with device counters summed in each training forward, as `RCNN.forward` sums them:
    2 dropped mask positives from the third call on, 0 NMS steps not final."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed_shape_counters: FixedShapeCounters | None = None

    def forward(self, batch):
        losses = super().forward(batch)
        if self.training:
            step = FixedShapeCounters(torch.tensor(2 if self.calls >= 3 else 0), torch.tensor(0))
            totals = self.fixed_shape_counters
            self.fixed_shape_counters = (
                step if totals is None else FixedShapeCounters(*(a + b for a, b in zip(totals, step)))
            )
        return losses


def test_counters_are_logged_per_write_with_one_warning(tmp_path, caplog):
    model = CountingRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.register_hooks({"writer": PeriodicWriter(str(tmp_path), period=2, tensorboard=False)})
    with caplog.at_level(logging.WARNING, logger="lazytrain.engine"):
        trainer.train(0, 6)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    # Iterations 0-1: calls 1-2 drop none; 2-3: calls 3-4 drop 2 each; 4-5: 2 each. Counts since the last write.
    assert [(r["iteration"], r["fixed_shapes/dropped_mask_positives"]) for r in rows] == [
        (1, 0),
        (3, 4),
        (5, 4),
    ]
    assert [r["fixed_shapes/nms_not_final"] for r in rows] == [0, 0, 0]
    warnings = [r.getMessage() for r in caplog.records if "Fixed shapes" in r.getMessage()]
    assert len(warnings) == 1
    assert "left out 4 foreground RoIs beyond model.fixed_shapes.mask_positives" in warnings[0]


def test_a_model_without_counters_logs_none(tmp_path):
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.register_hooks({"writer": PeriodicWriter(str(tmp_path), period=2, tensorboard=False)})
    trainer.train(0, 2)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    assert not any(key.startswith("fixed_shapes/") for row in rows for key in row)
