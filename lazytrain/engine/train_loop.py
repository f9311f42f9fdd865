"""The training loop: `HookBase`, `TrainerBase` (iterations and hook calls) and `SimpleTrainer` (one step).

A step of `SimpleTrainer`: next batch -> forward (a dict of losses) -> the step agreement (one all-reduce of
the losses, non-finite flags and stop requests; `lazytrain.engine.step_agreement`) -> backward ->
``after_backward`` hooks -> optional gradient clipping -> optimizer step -> metrics. Mixed precision and
gradient accumulation (`lazytrain.engine.accumulation`) are options of the same trainer. Hooks do everything
else (LR schedule, checkpoints, eval, logging).

How hooks reach shared objects: the default program builds the model, optimizer and data loader once and
passes them to the trainer; it then attaches ``trainer.checkpointer`` and ``trainer.test_function``. A hook
uses ``self.trainer.model``, ``.optimizer``, ``.data_loader``, ``.checkpointer``, ``.test_function``,
``.storage``, ``.iter`` and ``.max_iter``; its own settings are plain values, so hook configs stay data.

What the trainer saves for exact resume (see `TrainerBase.state_dict`): iteration, hook states, grad scaler,
the recent metric history, and per rank the data-loader position and the RNG states
(`lazytrain.engine.rng_state`). The RNG states are put back just before the first step of the resumed run,
after the ``before_train`` hooks and after the data iterator is created, so random numbers drawn by setup code
do not shift the resumed stream.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from lazytrain.engine.accumulation import (
    check_images_per_forward,
    split_for_accumulation,
    sync_gradients_if_last,
)
from lazytrain.engine.batch_norm import get_rank_local_state, load_rank_local_state
from lazytrain.engine.rng_state import get_rng_state, set_rng_state
from lazytrain.engine.step_agreement import agree_on_step
from lazytrain.engine.training_batches import TrainingBatches
from lazytrain.errors import LazytrainError, mark_agreed
from lazytrain.utils import comm
from lazytrain.utils.events import EventStorage, get_event_storage
from lazytrain.utils.preemption import StopRequest, TrainingInterrupted, signal_name

__all__ = ["HookBase", "SimpleTrainer", "TrainerBase"]

logger = logging.getLogger(__name__)


class HookBase:
    """A hook runs at five moments of training; `self.trainer` is set when it is registered.

    Implement only the moments you need and keep ``before_step`` cheap. Hooks that hold state worth
    resuming implement `state_dict`/`load_state_dict`.
    """

    trainer: TrainerBase

    def before_train(self) -> None:
        """Called once before the first step (also when resuming)."""

    def after_train(self) -> None:
        """Called once at the end, also after an exception (then ``trainer.iter < trainer.max_iter``)."""

    def before_step(self) -> None:
        """Called before each step; ``trainer.iter`` is the step about to run."""

    def after_backward(self) -> None:
        """Called after the backward pass, before gradient clipping and the optimizer step."""

    def after_step(self) -> None:
        """Called after each step; ``trainer.iter`` is the step that just ran."""

    def state_dict(self) -> dict:
        """Resumable state (only what ``torch.load(weights_only=True)`` accepts); ``{}`` for none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""


class TrainerBase:
    """Runs iterations ``start_iter .. max_iter - 1`` and calls hooks in registration order.

    Subclasses implement `run_step`. Attributes the default program sets for hooks to use:
    ``checkpointer`` (a `Checkpointer` holding this trainer), ``test_function`` (``() -> results``),
    ``model_ema`` (a `lazytrain.engine.ema.ModelEMA` when ``train.ema.enabled``, else None) and
    ``last_eval_results`` (set by `EvalHook`).

    Stopping early on a signal (SIGTERM/SIGINT, `lazytrain.utils.preemption`) is this class's state: every
    rank must stop after the same step, so this rank's own request (``own_stop_request``) becomes
    ``agreed_stop_signal`` only once all ranks agreed on it, after each step (`_agree_on_stop`).
    """

    def __init__(self) -> None:
        self._hooks: dict[str, HookBase] = {}
        self.iter = 0
        self.start_iter = 0
        self.max_iter = 0
        self.storage: EventStorage | None = None
        self.checkpointer = None
        self.test_function = None
        self.model_ema = None
        self.last_eval_results: dict = {}
        self._pending_rng_state: dict | None = None
        self._pending_storage_state: dict | None = None
        # This rank's stop request, entered by `train` (``signum``: the signal this process received, 0 while
        # none); None before the first `train`.
        self.own_stop_request: StopRequest | None = None
        # The signal all ranks agreed to stop on, 0 to go on. Set after every step (`_loop`), and by
        # `EvalHook` when a signal abandons an evaluation; hooks read it to save, or to skip an evaluation.
        self.agreed_stop_signal = 0
        # The stop signal the step's own collective agreed on, when it carried the stop requests
        # (`SimpleTrainer`'s step agreement does, saving an all-reduce); reset to None before each step, and
        # while None `_agree_on_stop` asks the ranks.
        self.stop_signal_agreed_in_step: int | None = None

    def register_hooks(self, hooks: Mapping[str, HookBase | None] | Iterable[HookBase | None]) -> None:
        """Register hooks (a name -> hook mapping or a list); ``None`` entries are skipped."""
        items = hooks.items() if isinstance(hooks, Mapping) else ((type(h).__name__, h) for h in hooks)
        for name, hook in items:
            if hook is None:
                continue
            if not isinstance(hook, HookBase):
                raise TypeError(
                    f"train.hooks.{name}: expected a HookBase instance, got {type(hook).__name__}; give the "
                    f"hook a `_target_` naming a HookBase subclass (or remove it with ~train.hooks.{name})"
                )
            hook.trainer = weakref.proxy(self)
            unique = name
            while unique in self._hooks:
                unique += "_"
            self._hooks[unique] = hook

    @property
    def hooks(self) -> list[HookBase]:
        return list(self._hooks.values())

    def train(self, start_iter: int, max_iter: int) -> None:
        """Train from `start_iter` up to (excluding) `max_iter`; after_train hooks always run.

        Raises:
            TrainingInterrupted: after a SIGTERM/SIGINT: the step in progress was finished, a checkpoint of
                it written and the after_train hooks run (see `lazytrain.utils.preemption`).
        """
        logger.info("Starting training from iteration %d", start_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        self.agreed_stop_signal = 0
        with EventStorage(start_iter) as self.storage:
            if self._pending_storage_state is not None:
                self.storage.load_state_dict(self._pending_storage_state)
                self._pending_storage_state = None
            # The after_train hooks run under the stop request too: a signal during the final evaluation
            # abandons it (`EvalHook`) instead of ending the process mid-write.
            with StopRequest() as self.own_stop_request:
                try:
                    self._call_hooks("before_train")
                    self._restore_rng_state()
                    # Already set when an evaluation left pending by a stopped run was stopped again.
                    if not self.agreed_stop_signal:
                        self._loop(start_iter, max_iter)
                except LazytrainError as e:  # a known problem (bad data, say): its message says it all
                    logger.error("Training stopped at iteration %d: %s", self.iter, e)
                    raise
                except Exception:
                    logger.exception("Exception during training at iteration %d:", self.iter)
                    raise
                finally:
                    self._call_hooks("after_train")
        if self.agreed_stop_signal:
            # Every rank stops here at the same iteration: a rank watch must not take it for a failure and end
            # a peer that is still writing its checkpoint.
            raise mark_agreed(TrainingInterrupted(self.agreed_stop_signal, self._stop_message()))

    def _stop_message(self) -> str:
        name = signal_name(self.agreed_stop_signal)
        resume = "run the same command with train.resume=true to continue."
        if self.iter >= self.max_iter:
            return (
                f"Training stopped by {name} during the final evaluation, which was abandoned (the final "
                f"checkpoint is saved); {resume[:-1]} and evaluate."
            )
        saved = " (checkpoint saved)" if self.checkpointer is not None else ""
        return f"Training stopped by {name} after iteration {self.iter}{saved}; {resume}"

    def _loop(self, start_iter: int, max_iter: int) -> None:
        for self.iter in range(start_iter, max_iter):
            self._call_hooks("before_step")
            self.stop_signal_agreed_in_step = None
            self.run_step()
            self.agreed_stop_signal = self._agree_on_stop()
            self._call_hooks("after_step")
            if self.agreed_stop_signal:
                self._save_on_stop()
                return
        self.iter = max_iter  # after_train sees iter == max_iter on a completed run

    def _agree_on_stop(self) -> int:
        """The signal all ranks stop on after this step (0: none). Every rank must stop after the same step
        (checkpointing is collective), so they agree first, unless the step's own collective already did."""
        if self.stop_signal_agreed_in_step is not None:
            return self.stop_signal_agreed_in_step
        return comm.max_over_ranks(self.own_stop_request.signum)

    def _save_on_stop(self) -> None:
        name = signal_name(self.agreed_stop_signal)
        if self.checkpointer is None:
            logger.warning(
                "Received %s: stopping after iteration %d (no checkpointer: nothing saved).", name, self.iter
            )
            return
        logger.warning("Received %s: stopping after iteration %d; saving a checkpoint.", name, self.iter)
        # A checkpoint hook may already have saved this iteration (it saves on a stop request too).
        if getattr(self.checkpointer, "last_saved_iteration", None) != self.iter:
            self.checkpointer.save(f"model_{self.iter:07d}", iteration=self.iter)

    def _call_hooks(self, moment: str) -> None:
        """Call `moment` (``"before_step"``, say) of every hook, in registration order."""
        if moment == "before_step":
            self.storage.iter = self.iter
        for hook in self._hooks.values():
            getattr(hook, moment)()

    def run_step(self) -> None:
        """One training step (subclasses implement it)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Iteration, hook states and, per rank, `_per_rank_state` (gathered: every rank must call it)."""
        hooks = {name: hook.state_dict() for name, hook in self._hooks.items()}
        return {
            "iteration": self.iter,
            "hooks": {name: state for name, state in hooks.items() if state},
            # Metrics are put on the main process; their recent history makes the resumed run's windowed
            # medians (console, metrics.json) the same as the uninterrupted run's.
            "storage": self.storage.state_dict() if self.storage is not None else {},
            "per_rank": comm.all_gather(self._per_rank_state()),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` (register hooks first: their states are matched by name)."""
        self.iter = state["iteration"]
        self._pending_storage_state = state.get("storage")
        for name, hook_state in state.get("hooks", {}).items():
            if name in self._hooks:
                self._hooks[name].load_state_dict(hook_state)
            else:
                logger.warning("checkpoint holds state for hook '%s', which is not registered; ignored", name)
        per_rank = state.get("per_rank", [])
        if len(per_rank) != comm.get_world_size():
            resharded = bool(per_rank) and self._load_resharded_state(per_rank[0])
            logger.warning(
                "checkpoint was written by %d process(es), this run has %d: %s (training continues, but not "
                "bit-exactly).",
                len(per_rank),
                comm.get_world_size(),
                "the data continue the same global stream, RNG states are not restored"
                if resharded
                else "data position and RNG states are not restored",
            )
            return
        self._load_per_rank_state(per_rank[comm.get_rank()])

    def _per_rank_state(self) -> dict:
        return {"rng": get_rng_state()}

    def _load_resharded_state(self, state: dict) -> bool:
        """Continue what can be continued exactly from rank 0's `_per_rank_state`, saved by another number of
        processes; True when the data position was restored."""
        return False

    def _load_per_rank_state(self, state: dict) -> None:
        # Applied when training starts: whatever runs in between (hook setup, building the evaluator) may
        # draw random numbers, and the resumed stream must continue exactly where the checkpoint left it.
        self._pending_rng_state = state["rng"]

    def _restore_rng_state(self) -> None:
        if self._pending_rng_state is not None:
            set_rng_state(self._pending_rng_state)
            self._pending_rng_state = None


class SimpleTrainer(TrainerBase):
    """The standard step for a model whose forward returns a dict of losses.

    Args:
        model: returns ``dict[str, Tensor]`` of losses in training mode (already on its device/DDP-wrapped).
        data_loader: an infinite iterable of batches; if it has ``state_dict``/``load_state_dict`` the
            position is checkpointed for exact resume (architecture.md, "Resumable data protocol"). For
            exact resume it must not draw from the global RNGs while iterating: give a torch ``DataLoader``
            created inside ``__iter__`` its own ``generator=``.
        optimizer: a torch optimizer.
        clip_grad_enabled: clip the global gradient norm (``train.clip_grad.enabled``).
        clip_grad_max_norm: the norm to clip to (``train.clip_grad.max_norm``).
        amp_enabled: run the forward in autocast (``train.amp.enabled``).
        amp_dtype: ``"bfloat16"`` or ``"float16"`` (float16 uses a grad scaler, checkpointed).
        images_per_forward: gradient accumulation (``train.images_per_forward``, `lazytrain.engine.accumulation`):
            each batch from the loader goes through the model in chunks of this many images, each chunk's loss
            divided by their number, the gradients summed, then one optimizer step; None: the whole batch in
            one forward. It must divide the batch.

    One step is one optimizer step whatever the accumulation, so ``train.max_iter``, the LR schedule,
    checkpoints and the data position count optimizer steps.

    To change what a step does (several optimizers, say), subclass it, override `run_step`, and point
    ``train.trainer._target_`` at the subclass.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data_loader: Iterable,
        optimizer: torch.optim.Optimizer,
        *,
        clip_grad_enabled: bool = False,
        clip_grad_max_norm: float | None = None,
        amp_enabled: bool = False,
        amp_dtype: str = "bfloat16",
        images_per_forward: int | None = None,
    ) -> None:
        super().__init__()
        check_images_per_forward(images_per_forward)
        if amp_dtype not in ("bfloat16", "float16"):
            raise ValueError(
                f"SimpleTrainer(amp_dtype=) must be 'bfloat16' or 'float16'; got {amp_dtype!r} "
                "(train.amp.dtype)"
            )
        if clip_grad_enabled and (clip_grad_max_norm is None or clip_grad_max_norm <= 0):
            raise ValueError(
                f"SimpleTrainer(clip_grad_max_norm=) must be > 0 when clipping is enabled; got "
                f"{clip_grad_max_norm}. Set train.clip_grad.max_norm (e.g. 10.0) or train.clip_grad.enabled=false"
            )
        if not clip_grad_enabled and clip_grad_max_norm is not None:
            logger.warning(
                "SimpleTrainer: clip_grad_max_norm=%s is set but clipping is disabled, so gradients are NOT "
                "clipped; set train.clip_grad.enabled=true to clip.",
                clip_grad_max_norm,
            )
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.clip_grad_norm = clip_grad_max_norm if clip_grad_enabled else None
        self.amp_enabled = amp_enabled
        self.amp_dtype = getattr(torch, amp_dtype)
        self.device_type = next(model.parameters()).device.type
        use_scaler = amp_enabled and amp_dtype == "float16"
        self.grad_scaler = torch.amp.GradScaler(self.device_type) if use_scaler else None
        self.images_per_forward = images_per_forward
        self._batches = TrainingBatches(data_loader)

    def run_step(self) -> None:
        """Next batch, forward and backward (per chunk with accumulation), non-finite check, clipping,
        optimizer step, metrics."""
        data, data_time = self._batches.next(self.iter)
        chunks = split_for_accumulation(data, self.images_per_forward)
        self.optimizer.zero_grad(set_to_none=True)
        summed: dict[str, torch.Tensor] = {}  # the chunks' mean losses, for the metrics
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            with sync_gradients_if_last(self.model, last):
                loss_dict = self._forward(chunk)
                losses = sum(loss.float() for loss in loss_dict.values())
                if len(chunks) > 1:
                    losses = losses / len(chunks)
                    for name, loss in loss_dict.items():
                        summed[name] = summed.get(name, 0.0) + loss.detach().float() / len(chunks)
                if last:  # before the backward with DDP's collective: all ranks stop here together
                    loss_values = self._agree_on_step(summed or loss_dict)
                (self.grad_scaler.scale(losses) if self.grad_scaler else losses).backward()
        self._call_hooks("after_backward")
        self._optimizer_step()
        self._write_metrics(loss_values, data_time)

    def _forward(self, data: Any) -> dict[str, torch.Tensor]:
        with torch.autocast(self.device_type, dtype=self.amp_dtype, enabled=self.amp_enabled):
            loss_dict = self.model(data)
        return {"total_loss": loss_dict} if isinstance(loss_dict, torch.Tensor) else loss_dict

    def _optimizer_step(self) -> None:
        """Clip (the summed gradient, unscaled first under a grad scaler), step, update the scaler."""
        if self.clip_grad_norm is not None:
            if self.grad_scaler:
                self.grad_scaler.unscale_(self.optimizer)
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        if self.grad_scaler:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()

    def _agree_on_step(self, loss_dict: dict[str, torch.Tensor]) -> dict[str, float]:
        """The step agreement (`lazytrain.engine.step_agreement`): the losses averaged over the ranks, for the
        metrics; the stop signal recorded in `stop_signal_agreed_in_step`, so that the loop needs no other
        collective; a non-finite loss on any rank raises on every rank."""
        requested = self.own_stop_request.signum if self.own_stop_request is not None else 0
        agreement = agree_on_step(loss_dict, requested, self.iter)
        self.stop_signal_agreed_in_step = agreement.stop_signal
        return agreement.loss_means

    def _write_metrics(self, loss_values: dict[str, float], data_time: float) -> None:
        if comm.is_main_process():
            storage = get_event_storage()
            storage.put_scalar("data_time", data_time)
            if "total_loss" not in loss_values:
                storage.put_scalar("total_loss", sum(loss_values.values()))
            storage.put_scalars(**loss_values)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.grad_scaler is not None and "grad_scaler" in state:
            self.grad_scaler.load_state_dict(state["grad_scaler"])

    def _per_rank_state(self) -> dict:
        state = super()._per_rank_state()
        loader_state = self._batches.state_dict()
        if loader_state is not None:
            state["data_loader"] = loader_state
        return {**state, **get_rank_local_state(self.model, self._ema_statistics())}

    def _load_per_rank_state(self, state: dict) -> None:
        super()._load_per_rank_state(state)
        if "data_loader" in state:
            self._batches.load_state_dict(state["data_loader"])
        load_rank_local_state(self.model, self._ema_statistics(), state)

    def _load_resharded_state(self, state: dict) -> bool:
        # Every rank's loader state is the same at a step boundary where the loader can reshard it.
        return "data_loader" in state and self._batches.load_resharded_state_dict(state["data_loader"])

    def _ema_statistics(self) -> dict[str, torch.Tensor] | None:
        return None if self.model_ema is None else self.model_ema.rank_local_statistics()

    def train(self, start_iter: int, max_iter: int) -> None:
        try:
            super().train(start_iter, max_iter)
        finally:
            self._batches.close()

    def _loop(self, start_iter: int, max_iter: int) -> None:
        super()._loop(start_iter, max_iter)
        # The loader's workers are not needed by the after_train hooks: free their memory before the final
        # evaluation (and keep a stop signal sent to every process of the job from killing them mid-evaluation).
        self._batches.close()

    def _restore_rng_state(self) -> None:
        # Create the iterator first, so that a loader whose __iter__ draws from the global RNG (torch's DataLoader
        # without a generator) draws before the restored state. A loader whose __iter__ is a generator function
        # only starts at the first next(), after the restore: it must not draw at all (`TrainLoader` does not).
        self._batches.start()
        super()._restore_rng_state()
