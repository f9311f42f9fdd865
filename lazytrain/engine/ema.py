"""An exponential moving average (EMA) of the weights: `ModelEMA`, kept up to date by `EMAHook`.

After every optimizer step, each floating-point entry of the model's state dict (parameters and buffers) moves
toward the model's: ``ema = d * ema + (1 - d) * model``, with a decay that warms up from 0 to `decay` as
``d(t) = decay * (1 - exp(-t / tau))`` after ``t`` optimizer steps (YOLOv5/ultralytics' formula; mmdet's
``ExpMomentumEMA`` is the same curve written as a momentum). The warm-up keeps the early average from
remembering the random initial weights. BatchNorm running statistics are averaged like the weights (as timm,
ultralytics and d2go's EMA do), integer buffers (``num_batches_tracked``) are copied.

What uses it, when ``train.ema.enabled`` (the default program builds it, `lazytrain.program.default`):

- `EMAHook` updates it after every optimizer step (whatever the gradient accumulation); a step the float16
  grad scaler skipped (inf/nan gradients, the weights unchanged) is no update: the average and its warm-up
  stay where they are.
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
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from lazytrain.engine.batch_norm import averaged_over_ranks, get_batch_norm_statistics
from lazytrain.engine.train_loop import HookBase
from lazytrain.errors import CheckpointError
from lazytrain.utils import comm

__all__ = ["EMAHook", "ModelEMA", "find_setting_problems"]

logger = logging.getLogger(__name__)


def find_setting_problems(settings: Mapping[str, Any]) -> dict[str, str]:
    """What is wrong with the `ModelEMA` settings given (``decay``, ``tau``; absent ones are not checked): the
    argument's name -> what it must be, what it got and a value to use. `ModelEMA` raises the first; the checks
    before a run report each under its ``train.ema`` key."""
    problems = {}
    if "decay" in settings and not (_is_number(settings["decay"]) and 0.0 <= settings["decay"] < 1.0):
        problems["decay"] = (
            f"must be in [0, 1) (the decay after the warm-up); got {settings['decay']!r}. E.g. 0.9998 averages "
            "over the last ~5000 steps"
        )
    if "tau" in settings and not (_is_number(settings["tau"]) and settings["tau"] >= 0):
        problems["tau"] = (
            f"must be >= 0 (the warm-up's time constant in optimizer steps; 0: no warm-up); got {settings['tau']!r}"
        )
    return problems


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        problems = find_setting_problems({"decay": decay, "tau": tau})
        if problems:
            name, problem = next(iter(problems.items()))
            raise ValueError(f"ModelEMA({name}=) {problem} (train.ema.{name})")
        self.decay = float(decay)
        self.tau = float(tau)
        self.updates = 0
        model = comm.unwrap_model(model)
        # Every state-dict entry: the parameters and the buffers (BatchNorm statistics, counters).
        self.averaged_state: dict[str, torch.Tensor] = {
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
        if state.keys() != self.averaged_state.keys():
            missing = sorted(set(self.averaged_state) ^ set(state))[:3]
            raise ValueError(
                f"ModelEMA: the model's state dict no longer has the averaged entries (differences: {missing}); "
                "build the ModelEMA from the model it averages, after any change of its modules."
            )
        for name, tensor in state.items():
            yield self.averaged_state[name], tensor

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

    def averaged_batch_norm_statistics(self) -> dict[str, torch.Tensor]:
        """The EMA's BatchNorm statistics averaged over the ranks, as new tensors by state-dict name (the EMA
        keeps this rank's own); empty with one process. Every rank calls it at the same moment (see
        `lazytrain.engine.batch_norm`)."""
        if comm.get_world_size() == 1:
            return {}
        return averaged_over_ranks(self.rank_local_statistics())

    def rank_local_statistics(self) -> dict[str, torch.Tensor]:
        """This rank's own EMA of its BatchNorm statistics, by state-dict name (the tensors themselves)."""
        return {name: self.averaged_state[name] for name in self._rank_local}

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
        """``averaged_state`` (name -> tensor, the model's state-dict names: parameters and buffers),
        ``updates``, ``decay``, ``tau``."""
        return {
            "averaged_state": self.averaged_state,
            "updates": self.updates,
            "decay": self.decay,
            "tau": self.tau,
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (`decay` and `tau` stay this object's: the config's).

        Raises:
            CheckpointError: the saved average is not of this model (an entry missing, extra or of another shape),
                naming the first such tensor; nothing is changed.
        """
        saved = state["averaged_state"]
        mismatch = self._describe_mismatch(saved)
        if mismatch:
            raise CheckpointError(
                f"ModelEMA: the saved average is not of this model: {mismatch}. Resume with the model the "
                "checkpoint was saved from, or start from its weights with train.resume=false "
                "train.init_checkpoint=CHECKPOINT (the average starts afresh from them)."
            )
        for name, average in self.averaged_state.items():
            average.copy_(saved[name])
        self.updates = int(state.get("updates", 0))

    def _describe_mismatch(self, saved: Mapping[str, torch.Tensor]) -> str | None:
        """How `saved` differs from the averaged entries (their names and shapes), or None."""
        reshaped = [
            f"{name} is {tuple(saved[name].shape)} in the checkpoint and {tuple(average.shape)} in the model"
            for name, average in self.averaged_state.items()
            if name in saved and saved[name].shape != average.shape
        ]
        missing = [name for name in self.averaged_state if name not in saved]
        unexpected = [name for name in saved if name not in self.averaged_state]
        parts = reshaped[:1] + [f"{len(reshaped)} entries of another shape"] * (len(reshaped) > 1)
        if missing:
            parts.append(f"{len(missing)} missing ({', '.join(missing[:3])}{', ...' * (len(missing) > 3)})")
        if unexpected:
            parts.append(
                f"{len(unexpected)} not in the model ({', '.join(unexpected[:3])}{', ...' * (len(unexpected) > 3)})"
            )
        return "; ".join(parts) or None


class EMAHook(HookBase):
    """Update ``trainer.model_ema`` (a `ModelEMA`) after every optimizer step; the default program sets it and
    registers this hook first when ``train.ema.enabled``.

    A run that starts without a saved average (a fresh run, or a resumed run whose checkpoint has none) starts
    it from the weights the run starts with (after ``train.init_checkpoint`` is loaded).

    A step that the trainer's float16 grad scaler (``trainer.grad_scaler``) skipped, because the gradients held
    an inf or nan, changed no weight, so it is no update of the average either: it neither moves the average
    nor advances its warm-up. The scaler lowers its scale after exactly such a step and at no other time, so
    the hook compares the scale with the one after the previous step (one read of the scale per step, only
    under a grad scaler, whose own step already waits for its inf check).
    """

    def __init__(self) -> None:
        super().__init__()
        self._scale: float | None = None  # the grad scaler's scale after the previous step

    def _ema(self) -> ModelEMA:
        ema = getattr(self.trainer, "model_ema", None)
        if ema is None:
            raise ValueError(
                "EMAHook: trainer.model_ema is not set; set it to a ModelEMA of trainer.model (the default "
                "program does when train.ema.enabled=true)."
            )
        return ema

    def _get_scale(self) -> float | None:
        scaler = getattr(self.trainer, "grad_scaler", None)
        return scaler.get_scale() if scaler is not None and scaler.is_enabled() else None

    def before_train(self) -> None:
        ema = self._ema()
        if ema.updates == 0:
            ema.reset(self.trainer.model)
        self._scale = self._get_scale()
        logger.info("EMA of the weights: %s; evaluation and checkpoints use the EMA weights.", ema.describe())

    def after_step(self) -> None:
        scale, previous = self._get_scale(), self._scale
        self._scale = scale
        if scale is not None and previous is not None and scale < previous:
            logger.debug(
                "EMA: iteration %d's step was skipped by the grad scaler; no update.", self.trainer.iter
            )
            return
        self._ema().update(self.trainer.model)
