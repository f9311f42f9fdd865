"""The training loop: `HookBase`, `TrainerBase` (iterations and hook calls) and `SimpleTrainer` (one step).

A step of `SimpleTrainer`: next batch -> forward (a dict of losses) -> non-finite check -> backward ->
``after_backward`` hooks -> optional gradient clipping -> optimizer step -> metrics. Mixed precision and
gradient accumulation (``images_per_forward``: the batch in several forward/backward passes, one optimizer
step) are options of the same trainer. Hooks do everything else (LR schedule, checkpoints, eval, logging).

How hooks reach shared objects: the default program builds the model, optimizer and data loader once and
passes them to the trainer; it then attaches ``trainer.checkpointer`` and ``trainer.test_function``. A hook
uses ``self.trainer.model``, ``.optimizer``, ``.data_loader``, ``.checkpointer``, ``.test_function``,
``.storage``, ``.iter`` and ``.max_iter``; its own settings are plain values, so hook configs stay data.

What the trainer saves for exact resume (see `TrainerBase.state_dict`): iteration, hook states, grad scaler,
the recent metric history, and per rank the data-loader position and the torch/numpy/python (and CUDA) RNG
states. RNG states are put back just before the first step of the resumed run, after the ``before_train``
hooks and after the data iterator is created, so random numbers drawn by setup code do not shift the resumed
stream.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from lazytrain.errors import LazytrainError, mark_agreed
from lazytrain.utils import comm
from lazytrain.utils.events import EventStorage, get_event_storage
from lazytrain.utils.preemption import (
    REQUEUE_SIGNAL,
    STOP_SIGNALS,
    StopRequest,
    TrainingInterrupted,
    signal_name,
)

__all__ = ["HookBase", "SimpleTrainer", "TrainerBase", "get_batch_size", "split_batch"]

logger = logging.getLogger(__name__)

# The signals a stop request may carry; when ranks got different ones, the highest number wins everywhere.
_STOP_SIGNALS = (*STOP_SIGNALS, REQUEUE_SIGNAL)


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
    rank must stop after the same step, so a rank's own request (``stop_request``) becomes ``stop_signal``
    only once all ranks agreed on it, after each step (`_agree_on_stop`).
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
        # This rank's stop request, entered by `train` (``signum``: the signal it received, 0 while none); None
        # before the first `train`.
        self.stop_request: StopRequest | None = None
        # The signal all ranks agreed to stop on, 0 to go on. Set after every step (`_loop`), and by
        # `EvalHook` when a signal abandons an evaluation; hooks read it to save, or to skip an evaluation.
        self.stop_signal = 0
        # What the step itself agreed on, when its own collective carried the stop requests (`SimpleTrainer`
        # does, saving an all-reduce); None, reset before each step: `_agree_on_stop` asks the ranks.
        self.step_stop_signal: int | None = None

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
        self.stop_signal = 0
        with EventStorage(start_iter) as self.storage:
            if self._pending_storage_state is not None:
                self.storage.load_state_dict(self._pending_storage_state)
                self._pending_storage_state = None
            # The after_train hooks run under the stop request too: a signal during the final evaluation
            # abandons it (`EvalHook`) instead of ending the process mid-write.
            with StopRequest() as self.stop_request:
                try:
                    self._call("before_train")
                    self._restore_rng_state()
                    if not self.stop_signal:  # an evaluation left pending by a stopped run was stopped again
                        self._loop(start_iter, max_iter)
                except LazytrainError as e:  # a known problem (bad data, say): its message says it all
                    logger.error("Training stopped at iteration %d: %s", self.iter, e)
                    raise
                except Exception:
                    logger.exception("Exception during training at iteration %d:", self.iter)
                    raise
                finally:
                    self._call("after_train")
        if self.stop_signal:
            raise TrainingInterrupted(self.stop_signal, self._stop_message())

    def _stop_message(self) -> str:
        name = signal_name(self.stop_signal)
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
            self._call("before_step")
            self.step_stop_signal = None
            self.run_step()
            self.stop_signal = self._agree_on_stop()
            self._call("after_step")
            if self.stop_signal:
                self._save_on_stop()
                return
        self.iter = max_iter  # after_train sees iter == max_iter on a completed run

    def _agree_on_stop(self) -> int:
        """The signal all ranks stop on after this step (0: none). Every rank must stop after the same step
        (checkpointing is collective), so they agree first, unless the step's own collective already did."""
        if self.step_stop_signal is not None:
            return self.step_stop_signal
        return comm.max_over_ranks(self.stop_request.signum)

    def _save_on_stop(self) -> None:
        name = signal_name(self.stop_signal)
        if self.checkpointer is None:
            logger.warning(
                "Received %s: stopping after iteration %d (no checkpointer: nothing saved).", name, self.iter
            )
            return
        logger.warning("Received %s: stopping after iteration %d; saving a checkpoint.", name, self.iter)
        # A checkpoint hook may already have saved this iteration (it saves on a stop request too).
        if getattr(self.checkpointer, "last_saved_iteration", None) != self.iter:
            self.checkpointer.save(f"model_{self.iter:07d}", iteration=self.iter)

    def _call(self, moment: str) -> None:
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
            logger.warning(
                "checkpoint was written by %d process(es), this run has %d: data position and RNG states are "
                "not restored (training continues, but not bit-exactly).",
                len(per_rank),
                comm.get_world_size(),
            )
            return
        self._load_per_rank_state(per_rank[comm.get_rank()])

    def _per_rank_state(self) -> dict:
        return {"rng": get_rng_state()}

    def _load_per_rank_state(self, state: dict) -> None:
        # Applied when training starts: whatever runs in between (hook setup, building the evaluator) may
        # draw random numbers, and the resumed stream must continue exactly where the checkpoint left it.
        self._pending_rng_state = state["rng"]

    def _restore_rng_state(self) -> None:
        if self._pending_rng_state is not None:
            set_rng_state(self._pending_rng_state)
            self._pending_rng_state = None


def get_rng_state() -> dict:
    """torch/numpy/python RNG states in a form ``torch.load(weights_only=True)`` accepts."""
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
    """Restore what `get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def get_batch_size(batch: Any) -> int:
    """The number of samples in `batch`: a list's length (a list of per-image dicts, as lazytrain's loaders
    yield), a tensor's first dimension, or that of the elements of a tuple or dict (which must agree)."""
    if isinstance(batch, list):
        return len(batch)
    if isinstance(batch, torch.Tensor) and batch.dim() > 0:
        return batch.shape[0]
    elements = list(batch.values()) if isinstance(batch, Mapping) else batch
    if isinstance(elements, (list, tuple)) and elements:
        sizes = {get_batch_size(element) for element in elements}
        if len(sizes) == 1:
            return sizes.pop()
    raise TypeError(
        "gradient accumulation (train.images_per_forward) splits each training batch into smaller ones: a list "
        "of samples, a tensor (first dimension), or a tuple or dict of those with one batch size; got "
        f"{type(batch).__name__}. Set train.images_per_forward=null, or subclass SimpleTrainer to split your "
        "loader's batches."
    )


def split_batch(batch: Any, parts: int) -> list:
    """`batch` cut into `parts` consecutive batches of equal size (see `get_batch_size` for the forms)."""
    if parts == 1:
        return [batch]
    if isinstance(batch, list):
        size = len(batch) // parts
        return [batch[i * size : (i + 1) * size] for i in range(parts)]
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(parts))
    if isinstance(batch, Mapping):
        columns = {key: split_batch(value, parts) for key, value in batch.items()}
        return [{key: column[i] for key, column in columns.items()} for i in range(parts)]
    return [type(batch)(column) for column in zip(*(split_batch(element, parts) for element in batch))]


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
        images_per_forward: gradient accumulation (``train.images_per_forward``): each batch from the loader
            (this process's share of ``dataloader.train.total_batch_size``) goes through the model in chunks of
            this many images, each chunk's loss divided by their number, the gradients summed, then one
            optimizer step; None: the whole batch in one forward. It must divide the batch.

    One step is one optimizer step, so ``train.max_iter``, the LR schedule, checkpoints and the data position
    count optimizer steps whatever the accumulation. With accumulation the loader still yields the whole
    batch, so samplers (RFS), aspect grouping and exact resume see the same batches; only one chunk at a time
    is on the device. A model whose losses are means over its images (Mask R-CNN's are, up to the per-image
    sampling of anchors and RoIs) gets the gradient of the whole batch, as DDP's average over ranks does;
    BatchNorm statistics see the chunks. DDP synchronises the gradients once, after the last chunk
    (``no_sync`` before), the grad scaler unscales and steps once, and clipping sees the summed gradient.

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
        if images_per_forward is not None and (
            not isinstance(images_per_forward, int)
            or isinstance(images_per_forward, bool)
            or images_per_forward < 1
        ):
            raise ValueError(
                f"SimpleTrainer(images_per_forward=) must be an integer >= 1 or None (no accumulation); got "
                f"{images_per_forward!r} (train.images_per_forward)"
            )
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
        self._data_iter = None

    def run_step(self) -> None:
        """Next batch, forward and backward (per chunk with accumulation), non-finite check, clipping,
        optimizer step, metrics."""
        data, data_time = self._next_batch()
        chunks = split_batch(data, self._accumulation_steps(data))
        self.optimizer.zero_grad(set_to_none=True)
        summed: dict[str, torch.Tensor] = {}  # the chunks' mean losses, for the metrics
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            with self._gradient_sync(last):
                loss_dict = self._forward(chunk)
                losses = sum(loss.float() for loss in loss_dict.values())
                if len(chunks) > 1:
                    losses = losses / len(chunks)
                    for name, loss in loss_dict.items():
                        summed[name] = summed.get(name, 0.0) + loss.detach().float() / len(chunks)
                if last:  # before the backward with DDP's collective: all ranks stop here together
                    loss_values = self._agree_on_step(summed or loss_dict)
                (self.grad_scaler.scale(losses) if self.grad_scaler else losses).backward()
        self._call("after_backward")
        self._optimizer_step()
        self._write_metrics(loss_values, data_time)

    def _next_batch(self) -> tuple[Any, float]:
        if self._data_iter is None:
            self._data_iter = iter(self.data_loader)
        start = time.perf_counter()
        try:
            data = next(self._data_iter)
        except StopIteration:
            raise RuntimeError(
                f"SimpleTrainer: the training data loader ended at iteration {self.iter}; it must yield batches "
                "forever (use an infinite training sampler, e.g. lazytrain.data.samplers.TrainingSampler)."
            ) from None
        return data, time.perf_counter() - start

    def _accumulation_steps(self, data: Any) -> int:
        """Forward passes for this batch: its size / ``images_per_forward`` (1 without accumulation)."""
        if self.images_per_forward is None:
            return 1
        size = get_batch_size(data)
        if size % self.images_per_forward:
            divisors = [n for n in range(1, size + 1) if size % n == 0]
            raise ValueError(
                f"SimpleTrainer(images_per_forward={self.images_per_forward}) must divide the batch of each "
                f"process; got a batch of {size} (dataloader.train.total_batch_size / processes). Set "
                f"train.images_per_forward to one of {divisors}, or change dataloader.train.total_batch_size."
            )
        return size // self.images_per_forward

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """DDP all-reduces the gradients in the backward pass of the last chunk only (``no_sync`` before)."""
        if last or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

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
        """All ranks agree on the step in one all-reduce, before the backward pass: the losses (averaged, for
        the metrics), which ranks got a non-finite loss, and stop requests (recorded in `step_stop_signal`,
        so that the loop needs no other collective). Its ``tolist()`` is the step's one wait for the device.

        Raises:
            FloatingPointError: on every rank, with the same message, when any rank's loss is not finite.
        """
        world_size, rank = comm.get_world_size(), comm.get_rank()
        names = list(loss_dict)
        losses = torch.stack([loss_dict[name].detach().float().reshape(()) for name in names])
        non_finite = torch.zeros(world_size, device=losses.device)
        non_finite[rank] = (~torch.isfinite(losses).all()).float()
        signum = self.stop_request.signum if self.stop_request is not None else 0
        # Filled on the device: torch.tensor(values, device=...) would copy from host memory, which waits for the
        # device's queue like the tolist() below.
        requested = torch.zeros(len(_STOP_SIGNALS), device=losses.device)
        if signum in _STOP_SIGNALS:
            requested[_STOP_SIGNALS.index(signum)] = 1.0
        packed = torch.cat([losses, non_finite, requested])
        if world_size > 1:
            torch.distributed.all_reduce(packed)
        values = packed.tolist()
        means = {name: value / world_size for name, value in zip(names, values)}
        failed = [r for r, flag in enumerate(values[len(names) : len(names) + world_size]) if flag]
        if failed:
            raise mark_agreed(FloatingPointError(self._non_finite_message(means, failed, world_size)))
        requested_counts = values[len(names) + world_size :]
        self.step_stop_signal = max((s for s, n in zip(_STOP_SIGNALS, requested_counts) if n), default=0)
        return means

    def _non_finite_message(self, means: dict[str, float], ranks: list[int], world_size: int) -> str:
        values = ", ".join(f"{name}={value:.4g}" for name, value in means.items())
        where = f" on rank {', '.join(map(str, ranks))} of {world_size}" if world_size > 1 else ""
        mean = " (mean over ranks)" if world_size > 1 else ""
        return (
            f"Loss became infinite or NaN at iteration {self.iter}{where}: {values}{mean}. Every rank stops here; "
            "the last checkpoint on disk is intact. Lower the learning rate, enable train.clip_grad, start from "
            "pretrained weights (train.init_checkpoint), or check the data of this batch."
        )

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
        if hasattr(self.data_loader, "state_dict"):
            state["data_loader"] = self.data_loader.state_dict()
        return state

    def _load_per_rank_state(self, state: dict) -> None:
        super()._load_per_rank_state(state)
        if "data_loader" in state and hasattr(self.data_loader, "load_state_dict"):
            self.data_loader.load_state_dict(state["data_loader"])
            self._data_iter = None

    def train(self, start_iter: int, max_iter: int) -> None:
        try:
            super().train(start_iter, max_iter)
        finally:
            self._close_data_iter()

    def _loop(self, start_iter: int, max_iter: int) -> None:
        super()._loop(start_iter, max_iter)
        # The loader's workers are not needed by the after_train hooks: free their memory before the final
        # evaluation (and keep a stop signal sent to every process of the job from killing them mid-evaluation).
        self._close_data_iter()

    def _close_data_iter(self) -> None:
        # Stop the loader's worker processes now: the trainer may live on (reference cycles with its hooks),
        # and a multirun sweep runs many jobs in one process, each leaving its workers (~0.7 GB each) behind.
        close = getattr(self._data_iter, "close", None)
        if close is not None:
            close()
        self._data_iter = None

    def _restore_rng_state(self) -> None:
        # Create the iterator first, so that a loader whose __iter__ draws from the global RNG (torch's DataLoader
        # without a generator) draws before the restored state. A loader whose __iter__ is a generator function
        # only starts at the first next(), after the restore: it must not draw at all (`TrainLoader` does not).
        if self._data_iter is None:
            self._data_iter = iter(self.data_loader)
        super()._restore_rng_state()
