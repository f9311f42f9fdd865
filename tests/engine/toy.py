"""A toy regression task for engine tests: importable targets, deterministic data, resumable loader."""

from __future__ import annotations

import os

import torch

from lazytrain.engine.train_loop import HookBase, SimpleTrainer

CONSTRUCTIONS: dict[str, int] = {}


def _count(name: str) -> None:
    CONSTRUCTIONS[name] = CONSTRUCTIONS.get(name, 0) + 1


class ToyRegressor(torch.nn.Module):
    """y = w.x + b with an MSE loss; returns a loss dict in training mode."""

    def __init__(self, dim: int = 4, nan_at_call: int = -1) -> None:
        super().__init__()
        _count("model")
        self.linear = torch.nn.Linear(dim, 1)
        self.norm = torch.nn.BatchNorm1d(dim)
        self.calls = 0
        self.nan_at_call = nan_at_call

    def forward(self, batch):
        x, y = batch
        self.calls += 1
        prediction = self.linear(self.norm(x)).squeeze(1)
        loss = torch.nn.functional.mse_loss(prediction, y)
        if self.calls == self.nan_at_call:
            loss = loss * float("nan")
        return {"loss_mse": loss, "loss_zero": 0.0 * loss}


class ToyLoader:
    """An infinite stream of batches; batch k is a pure function of (seed, k) plus noise from torch's
    global RNG (so RNG restore matters), with the resumable-data protocol."""

    def __init__(self, batch_size: int = 8, dim: int = 4, seed: int = 0) -> None:
        _count("loader")
        self.batch_size, self.dim, self.seed = batch_size, dim, seed
        self.position = 0
        self.true_w = torch.arange(1.0, dim + 1)

    def __iter__(self):
        while True:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.position)
            x = torch.randn(self.batch_size, self.dim, generator=g)
            y = x @ self.true_w + 0.01 * torch.randn(self.batch_size)
            self.position += 1
            yield x, y

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def make_sgd(params, lr: float = 0.05):
    _count("optimizer")
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


class RecordingHook(HookBase):
    """Records (moment, iteration) for every call."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.events: list[tuple[str, int]] = []
        RecordingHook.last = self

    def before_train(self):
        self.events.append(("before_train", self.trainer.iter))

    def before_step(self):
        self.events.append(("before_step", self.trainer.iter))

    def after_backward(self):
        self.events.append(("after_backward", self.trainer.iter))

    def after_step(self):
        self.events.append(("after_step", self.trainer.iter))

    def after_train(self):
        self.events.append(("after_train", self.trainer.iter))


class MarkerTrainer(SimpleTrainer):
    """A user subclass: counts its steps."""

    def run_step(self):
        self.marker_steps = getattr(self, "marker_steps", 0) + 1
        super().run_step()


class ConstantEvaluator:
    """Evaluator protocol stub for toy runs: the mean |error| of the model on a fixed batch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self):
        self.errors = []

    def process(self, inputs, outputs):
        self.errors.append(float(outputs))

    def evaluate(self):
        return {"toy": {"AP": 100.0 - sum(self.errors)}}


def kill_self_at(trainer, iteration: int) -> None:
    if trainer.iter == iteration:
        os.kill(os.getpid(), 9)
