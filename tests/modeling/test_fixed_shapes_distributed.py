"""The fixed-shape step's counters under two CPU processes (gloo): `PeriodicWriter` logs every process's."""

from __future__ import annotations

import json

import torch

from lazytrain.engine.hooks import PeriodicWriter
from lazytrain.engine.train_loop import SimpleTrainer
from lazytrain.launch.launch import find_free_port, launch
from lazytrain.modeling.fixed_shapes import FixedShapeCounters
from lazytrain.utils import comm
from tests.engine import toy


class RankCountingRegressor(toy.ToyRegressor):
    """The toy model with device counters summed per training forward as `RCNN.forward` sums them: rank r
    drops r + 1 mask positives per step and counts NMS not final on rank 1 only."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed_shape_counters: FixedShapeCounters | None = None

    def forward(self, batch):
        losses = super().forward(batch)
        rank = comm.get_rank()
        step = FixedShapeCounters(torch.tensor(rank + 1), torch.tensor(rank))
        totals = self.fixed_shape_counters
        self.fixed_shape_counters = (
            step if totals is None else FixedShapeCounters(*(a + b for a, b in zip(totals, step)))
        )
        return losses


def _train(output_dir: str) -> None:
    torch.set_num_threads(1)
    model = RankCountingRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.register_hooks({"writer": PeriodicWriter(output_dir, period=2, tensorboard=False)})
    trainer.train(0, 4)


def test_counters_are_summed_over_the_processes(tmp_path):
    url = f"tcp://127.0.0.1:{find_free_port()}"
    assert launch(_train, 2, dist_url=url, args=(str(tmp_path),), backend="gloo", use_gpu=False) is None
    rows = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    # Per write (2 steps): rank 0 drops 1 + 1, rank 1 drops 2 + 2; NMS not final: rank 1's 1 + 1.
    assert [
        (r["iteration"], r["fixed_shapes/dropped_mask_positives"], r["fixed_shapes/nms_not_final"])
        for r in rows
    ] == [(1, 6, 2), (3, 6, 2)]
