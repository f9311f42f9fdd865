"""A finished (or failed) training run stops its data-loader worker processes, so jobs of a multirun sweep
running one after another in one process do not pile up workers."""

import os

import pytest
import torch

from lazytrain.data.build import build_detection_train_loader
from lazytrain.engine.train_loop import SimpleTrainer


class TinyModel(torch.nn.Module):
    """Records the pids of the workers that mapped its batches; raises at the 3rd step if `explode`."""

    def __init__(self, explode: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.explode, self.steps, self.worker_pids = explode, 0, set()

    def forward(self, batch):
        self.steps += 1
        if self.explode and self.steps == 3:
            raise RuntimeError("boom")
        self.worker_pids |= {sample["pid"] for sample in batch}
        values = torch.tensor([sample["value"] for sample in batch])
        return {"loss": ((self.weight * values - 1.0) ** 2).mean()}


def map_in_worker(record):
    return {"value": float(record["image_id"] % 3), "pid": os.getpid()}


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("explode", [False, True], ids=["completed", "failed"])
def test_training_stops_its_loader_workers(explode):
    records = [{"file_name": f"{i}.jpg", "image_id": i, "width": 10, "height": 10} for i in range(16)]
    loader = build_detection_train_loader(
        records, mapper=map_in_worker, total_batch_size=2, num_workers=2, seed=0
    )
    model = TinyModel(explode)
    trainer = SimpleTrainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1))
    if explode:
        with pytest.raises(RuntimeError, match="boom"):
            trainer.train(0, 5)
    else:
        trainer.train(0, 5)
    assert len(model.worker_pids) == 2 and os.getpid() not in model.worker_pids
    # the trainer object is still referenced here; its workers must be gone anyway
    assert [pid for pid in model.worker_pids if running(pid)] == []
