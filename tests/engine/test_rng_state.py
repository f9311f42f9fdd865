"""The global generators' states travel through a weights-only checkpoint and come back exactly."""

import io
import random

import numpy as np
import torch

from lazytrain.engine.rng_state import get_rng_state, set_rng_state


def _draw():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_state_restores_every_generator_after_a_weights_only_round_trip():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal()  # a cached gaussian is part of numpy's state
    buffer = io.BytesIO()
    torch.save(get_rng_state(), buffer)
    expected = _draw()
    _draw()
    buffer.seek(0)
    set_rng_state(torch.load(buffer, weights_only=True))
    assert _draw() == expected
