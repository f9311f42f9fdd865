"""What the hook tests share: a toy trainer and a checkpointer that only records what it was asked to save."""

import torch

from lazytrain.engine.train_loop import SimpleTrainer
from tests.engine import toy


class FakeCheckpointer:
    save_dir = ""

    def __init__(self):
        self.saved = []

    def save(self, name, **extra):
        self.saved.append((name, extra["iteration"]))


def toy_trainer(**kwargs):
    model = toy.ToyRegressor()
    return SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01), **kwargs)
