"""The global random generators' states (torch, CUDA, numpy, python), read and put back as one value.

Exact resume needs every generator a training step may draw from back where the checkpoint left it, and an
evaluation must not move them (`lazytrain.engine.hooks.EvalHook` puts them back after evaluating). The state
holds only what ``torch.load(weights_only=True)`` accepts, so it travels inside a checkpoint.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["get_rng_state", "set_rng_state"]


def get_rng_state() -> dict:
    """torch/numpy/python (and CUDA, when available) RNG states in a form ``torch.load(weights_only=True)``
    accepts."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `get_rng_state` returned (the CUDA state only where CUDA is available)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
