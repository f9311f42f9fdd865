"""An exponential moving average (EMA) of the weights: `ModelEMA`, kept up to date by `EMAHook`.

After every optimizer step, each floating-point entry of the model's state dict (parameters and buffers) moves
toward the model's: ``ema = d * ema + (1 - d) * model``, with a decay that warms up from 0 to `decay` as
``d(t) = decay * (1 - exp(-t / tau))`` after ``t`` optimizer steps (YOLOv5/ultralytics' formula; mmdet's
``ExpMomentumEMA`` is the same curve written as a momentum). The warm-up keeps the early average from
remembering the random initial weights. BatchNorm running statistics are averaged like the weights (as timm,
ultralytics and d2go's EMA do), integer buffers (``num_batches_tracked``) are copied.

What uses it, when ``train.ema.enabled`` (the default program builds it, `lazytrain.program.default`):

- `EMAHook` updates it after every step (an optimizer step, whatever the gradient accumulation).
- `lazytrain.engine.hooks.EvalHook` evaluates the EMA weights (`ModelEMA.applied_to` swaps them into the
  model for the evaluation and back, also on errors).
- `lazytrain.engine.checkpoint.Checkpointer` writes the EMA weights as the checkpoint's ``model`` (what
  evaluation measured, and what predict, export, ``train.eval_only`` and ``train.init_checkpoint`` load, as
  mmdet's EMA hook does) and the trained weights as ``training_model``, which a resumed run continues from.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator

import torch

from lazytrain.engine.batch_norm import average_over_ranks, get_batch_norm_statistics
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm

__all__ = ["EMAHook", "ModelEMA"]

logger = logging.getLogger(__name__)


class ModelEMA:
    """The moving average of a model's state dict (see the module docstring for the formula).

    Args:
        model: the model (DDP-wrapped or not); the average starts as a copy of its current state.
        decay: the decay after the warm-up, in [0, 1); larger averages over more steps (about
            ``1 / (1 - decay)``: 0.9998 averages over the last ~5000 steps).
        tau: the warm-up's time constant in optimizer steps (the decay reaches 63% of `decay` after `tau`
            steps, 99% after ``4.6 * tau``); 0: no warm-up.
    """

    def __init__(self, model: torch.nn.Module, decay: float = 0.9998, tau: float = 2000.0) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(
                f"ModelEMA(decay=) must be in [0, 1); got {decay} (train.ema.decay; e.g. 0.9998 averages over "
                "the last ~5000 steps)"
            )
        if tau < 0:
            raise ValueError(f"ModelEMA(tau=) must be >= 0 (0: no warm-up); got {tau} (train.ema.tau)")
        self.decay = float(decay)
        self.tau = float(tau)
        self.updates = 0
        model = comm.unwrap_model(model)
        self.weights: dict[str, torch.Tensor] = {
            name: tensor.detach().clone() for name, tensor in model.state_dict().items()
        }
        # BatchNorm statistics are rank-local under DDP (broadcast_buffers=False); so are their averages.
        self._rank_local = list(get_batch_norm_statistics(model))

    def decay_at(self, updates: int) -> float:
        """The decay of the `updates`-th update (counted from 1)."""
        if self.tau == 0:
            return self.decay
        return self.decay * (1.0 - math.exp(-updates / self.tau))

    def _pairs(self, model: torch.nn.Module) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(average, model tensor) for every state-dict entry, in state-dict order."""
        state = comm.unwrap_model(model).state_dict()
        if state.keys() != self.weights.keys():
            missing = sorted(set(self.weights) ^ set(state))[:3]
            raise ValueError(
                f"ModelEMA: the model's state dict no longer has the averaged entries (differences: {missing}); "
                "build the ModelEMA from the model it averages, after any change of its modules."
            )
        for name, tensor in state.items():
            yield self.weights[name], tensor

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One step of the average toward `model`'s current state (call once per optimizer step)."""
        self.updates += 1
        weight = 1.0 - self.decay_at(self.updates)
        averaged, current = [], []
        for average, tensor in self._pairs(model):
            if average.is_floating_point():
                averaged.append(average)
                current.append(tensor)
            else:
                average.copy_(tensor)
        if averaged:
            torch._foreach_lerp_(averaged, current, weight)

    @torch.no_grad()
    def reset(self, model: torch.nn.Module) -> None:
        """Start the average afresh from `model`'s current state (the next update is the first)."""
        for average, tensor in self._pairs(model):
            average.copy_(tensor)
        self.updates = 0

    def average_batch_norm_statistics(self) -> None:
        """Average the BatchNorm statistics of the EMA over the ranks (every rank calls it at the same moment;
        see `lazytrain.engine.batch_norm`)."""
        average_over_ranks([self.weights[name] for name in self._rank_local])

    @contextlib.contextmanager
    def applied_to(self, model: torch.nn.Module) -> Iterator[None]:
        """Within the block, `model` holds the EMA weights; its own come back after it, also on an error.

        The swap is in place, tensor by tensor (no second copy of the model is held), and exact.
        """
        self._swap(model)
        try:
            yield
        finally:
            self._swap(model)

    @torch.no_grad()
    def _swap(self, model: torch.nn.Module) -> None:
        for average, tensor in self._pairs(model):
            held = tensor.clone()
            tensor.copy_(average)
            average.copy_(held)

    def describe(self) -> str:
        """One line for logs: the settings and the decay of the last update."""
        warmup = f", warm-up tau {self.tau:g}" if self.tau else ""
        current = f", now {self.decay_at(self.updates):.6g}" if self.tau and self.updates else ""
        return f"decay {self.decay:g}{warmup}, {self.updates} updates{current}"

    def state_dict(self) -> dict:
        """``weights`` (name -> tensor, the model's state-dict names), ``updates``, ``decay``, ``tau``."""
        return {"weights": self.weights, "updates": self.updates, "decay": self.decay, "tau": self.tau}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (`decay` and `tau` stay this object's: the config's)."""
        weights = state["weights"]
        missing = [name for name in self.weights if name not in weights]
        if missing:
            logger.warning(
                "ModelEMA: the saved average lacks %d entries (e.g. %s); they keep the model's values.",
                len(missing),
                missing[:3],
            )
        for name, average in self.weights.items():
            if name in weights:
                average.copy_(weights[name])
        self.updates = int(state.get("updates", 0))


class EMAHook(HookBase):
    """Update ``trainer.model_ema`` (a `ModelEMA`) after every step; the default program sets it and registers
    this hook first when ``train.ema.enabled``.

    A run that starts without a saved average (a fresh run, or a resumed run whose checkpoint has none) starts
    it from the weights the run starts with (after ``train.init_checkpoint`` is loaded).
    """

    def _ema(self) -> ModelEMA:
        ema = getattr(self.trainer, "model_ema", None)
        if ema is None:
            raise ValueError(
                "EMAHook: trainer.model_ema is not set; set it to a ModelEMA of trainer.model (the default "
                "program does when train.ema.enabled=true)."
            )
        return ema

    def before_train(self) -> None:
        ema = self._ema()
        if ema.updates == 0:
            ema.reset(self.trainer.model)
        logger.info("EMA of the weights: %s; evaluation and checkpoints use the EMA weights.", ema.describe())

    def after_step(self) -> None:
        self._ema().update(self.trainer.model)
