"""The standard hooks. Each is configured with plain values (so hook configs stay saveable and overridable)
and reaches the objects the program built through its trainer: ``self.trainer.model``, ``.optimizer``,
``.data_loader``, ``.checkpointer``, ``.test_function``, ``.storage``.

Recipes list them as a named mapping in run order (``train.hooks.timer``, ``train.hooks.lr_scheduler``,
``train.hooks.checkpointer``, ``train.hooks.eval``, ``train.hooks.writer``), so ``~train.hooks.eval`` removes
one and ``train.hooks.checkpointer.period=1000`` tunes one. Order matters in two places: `EvalHook` before
`BestCheckpointer` (which reads its metrics) and before `PeriodicWriter` (so the final evaluation is written
to ``metrics.json``).

Hooks that save checkpoints call ``trainer.checkpointer.save`` on every rank (saving gathers per-rank state);
their decisions must therefore be the same on all ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from lazytrain.engine.batch_norm import average_batch_norm_statistics
from lazytrain.engine.rng_state import get_rng_state, set_rng_state
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm
from lazytrain.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, TensorboardWriter
from lazytrain.utils.logger import create_small_table
from lazytrain.utils.preemption import EvaluationStopped, signal_name

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "EvalHook",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "TorchMemoryStats",
    "TorchProfiler",
    "flatten_results",
]

logger = logging.getLogger(__name__)


def _is_period_end(trainer, period: int) -> bool:
    return period > 0 and (trainer.iter + 1) % period == 0


class CallbackHook(HookBase):
    """Run plain functions ``fn(trainer)`` at chosen moments.

    In a config, give a function by path: ``L(CallbackHook)(after_step=L(functools.partial)(
    L(locate)("my_module.fn"), ...))`` or any ``_partial_: true`` node.
    """

    def __init__(
        self,
        *,
        before_train: Callable | None = None,
        after_train: Callable | None = None,
        before_step: Callable | None = None,
        after_backward: Callable | None = None,
        after_step: Callable | None = None,
    ) -> None:
        self._callbacks = {
            "before_train": before_train,
            "after_train": after_train,
            "before_step": before_step,
            "after_backward": after_backward,
            "after_step": after_step,
        }

    def _run(self, moment: str) -> None:
        if self._callbacks[moment] is not None:
            self._callbacks[moment](self.trainer)

    def before_train(self) -> None:
        self._run("before_train")

    def after_train(self) -> None:
        self._run("after_train")

    def before_step(self) -> None:
        self._run("before_step")

    def after_backward(self) -> None:
        self._run("after_backward")

    def after_step(self) -> None:
        self._run("after_step")


class IterationTimer(HookBase):
    """Put the step time as ``time`` and log the total training time at the end."""

    def __init__(self, warmup_iter: int = 3) -> None:
        self._warmup = warmup_iter
        self._step_start = 0.0
        self._train_start = 0.0
        self._steps = 0
        self._measured = 0.0

    def before_train(self) -> None:
        self._train_start = time.perf_counter()

    def before_step(self) -> None:
        self._step_start = time.perf_counter()

    def after_step(self) -> None:
        seconds = time.perf_counter() - self._step_start
        self._steps += 1
        if self._steps > self._warmup:
            self._measured += seconds
        self.trainer.storage.put_scalar("time", seconds)

    def after_train(self) -> None:
        total = time.perf_counter() - self._train_start
        counted = self._steps - self._warmup
        if counted > 0:
            logger.info(
                "Overall training speed: %d iterations in %s (%.4f s / it)",
                counted,
                datetime.timedelta(seconds=int(self._measured)),
                self._measured / counted,
            )
        logger.info("Total training time: %s", datetime.timedelta(seconds=int(total)))


class LRScheduler(HookBase):
    """Set every param group's LR to ``initial_lr * multiplier(iteration)`` before each step.

    The LR is a pure function of the iteration, so this hook has no state of its own: a resumed run (whose
    optimizer state restores ``initial_lr``) continues the schedule exactly.

    Args:
        multiplier: a callable ``iteration -> factor`` (see `lazytrain.engine.lr_schedule`); in configs,
            ``multiplier="${lr_multiplier}"``.
    """

    def __init__(self, multiplier: Callable[[int], float]) -> None:
        self.multiplier = multiplier

    def before_train(self) -> None:
        for group in self.trainer.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])

    def before_step(self) -> None:
        factor = self.multiplier(self.trainer.iter)
        groups = self.trainer.optimizer.param_groups
        for group in groups:
            group["lr"] = group["initial_lr"] * factor
        self.trainer.storage.put_scalar("lr", groups[0]["lr"], smoothing_hint=False)


class PeriodicCheckpointer(HookBase):
    """Save ``model_{iter:07d}.pth`` every `period` iterations, keep the last `max_to_keep`, and save
    ``model_final.pth`` after the last iteration (through ``trainer.checkpointer``).

    Args:
        period: save every this many iterations (``${train.checkpointer.period}``).
        max_to_keep: how many periodic checkpoints to keep (None: all); ``model_final`` and
            ``model_best`` are never deleted. Survives resume: the list of kept files is hook state.
        file_prefix: file name prefix.
    """

    def __init__(self, period: int, max_to_keep: int | None = None, file_prefix: str = "model") -> None:
        if period <= 0:
            raise ValueError(
                f"PeriodicCheckpointer(period=) must be > 0; got {period} (train.checkpointer.period)"
            )
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(
                f"PeriodicCheckpointer(max_to_keep=) must be >= 1 or None (keep all); got {max_to_keep}"
            )
        self.period = period
        self.max_to_keep = max_to_keep
        self.file_prefix = file_prefix
        self._saved: list[str] = []  # basenames of periodic checkpoints, oldest first

    def after_step(self) -> None:
        trainer = self.trainer
        if trainer.checkpointer is None:
            return
        # On a stop request (SIGTERM/SIGINT) this step is saved like a periodic one, so it is rotated too.
        due = _is_period_end(trainer, self.period) or trainer.stop_signal
        if due and trainer.iter + 1 < trainer.max_iter:
            name = f"{self.file_prefix}_{trainer.iter:07d}"
            # Recorded before saving, so the checkpoint's own copy of this list includes it.
            self._saved.append(f"{name}.pth")
            trainer.checkpointer.save(name, iteration=trainer.iter)
            self._remove_old()
        if trainer.iter + 1 >= trainer.max_iter:
            trainer.checkpointer.save(f"{self.file_prefix}_final", iteration=trainer.iter)

    def _remove_old(self) -> None:
        if self.max_to_keep is None:
            return
        save_dir = self.trainer.checkpointer.save_dir
        while len(self._saved) > self.max_to_keep:
            old = os.path.join(save_dir, self._saved.pop(0))
            if save_dir and comm.is_main_process() and os.path.exists(old):
                os.remove(old)

    def state_dict(self) -> dict:
        return {"saved": list(self._saved)}

    def load_state_dict(self, state: dict) -> None:
        self._saved = [os.path.basename(path) for path in state.get("saved", [])]


def flatten_results(results: Mapping, prefix: str = "") -> dict[str, float]:
    """``{"bbox": {"AP": 1.0}}`` -> ``{"bbox/AP": 1.0}``; values must be numbers."""
    flat: dict[str, float] = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_results(value, f"{name}/"))
        else:
            try:
                flat[name] = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"EvalHook: evaluation result '{name}' must be a number; got {value!r}"
                ) from None
    return flat


class EvalHook(HookBase):
    """Evaluate every `eval_period` iterations and after training; results go to storage as ``task/metric``.

    The final evaluation (after the last step) is recorded at iteration ``max_iter``, so the writer hook
    that follows writes it to ``metrics.json`` as its own line. Results (computed on the main process) are
    shared with all ranks, and the global RNG states are put back after evaluating so that evaluation does
    not change the training random stream (which exact resume relies on). BatchNorm running statistics are
    averaged over the ranks before each evaluation (`lazytrain.engine.batch_norm`). With an EMA of the weights
    (``trainer.model_ema``, ``train.ema.enabled``) the model holds the EMA weights while it is evaluated
    (`lazytrain.engine.ema.ModelEMA.applied_to`). The results are also kept in ``trainer.last_eval_results``
    (what the default program returns).

    A stop signal (SIGTERM, Ctrl-C) during an evaluation abandons it within seconds on every rank (see
    `lazytrain.utils.preemption.abandon_on_stop`): training stops at this iteration with its checkpoint saved,
    and the resumed run evaluates this iteration first (the final evaluation: when it resumes after the end).

    Args:
        eval_period: 0 evaluates only after training.
        eval_function: ``() -> dict`` of results; default ``trainer.test_function`` set by the program.
        eval_after_train: also evaluate at the end.
    """

    def __init__(
        self,
        eval_period: int,
        eval_function: Callable[[], Mapping] | None = None,
        eval_after_train: bool = True,
    ) -> None:
        self.eval_period = eval_period
        self.eval_function = eval_function
        self.eval_after_train = eval_after_train
        self._last_eval_iter = -1
        self._pending_iter: int | None = None  # an evaluation abandoned on a stop signal

    def _evaluate(self, iteration: int | None = None) -> None:
        iteration = self.trainer.iter if iteration is None else iteration
        function = self.eval_function or self.trainer.test_function
        if function is None:
            raise ValueError(
                "EvalHook: no eval_function given and trainer.test_function is not set; pass "
                "eval_function=... or remove the hook with ~train.hooks.eval."
            )
        # Every rank evaluates with every rank's BatchNorm statistics (DDP leaves them rank-local).
        average_batch_norm_statistics(self.trainer.model)
        rng_state = get_rng_state()
        stopped = 0
        try:
            with self._weights_to_evaluate():
                results = function() or {}
        except EvaluationStopped as e:
            results, stopped = {}, e.signum
        finally:
            set_rng_state(rng_state)
        # Evaluators return results on the main process only; every rank records the same metrics so that
        # hooks deciding on them (BestCheckpointer, whose save is collective) agree. A main process stopped
        # while computing metrics tells the other ranks (waiting here) that the evaluation was abandoned.
        gathered = comm.all_gather((results, stopped))
        results, stopped = gathered[0][0], max(signum for _, signum in gathered)
        if stopped:
            self._abandon(stopped, iteration)
            return
        flat = flatten_results(results)
        if flat:
            self.trainer.storage.put_scalars(**flat, smoothing_hint=False, cur_iter=iteration)
            if comm.is_main_process():
                # DEBUG: the evaluator has shown these on the console; the run summary repeats the final ones.
                logger.debug("Evaluation at iteration %d:\n%s", iteration, create_small_table(flat))
        self.trainer.last_eval_results = results
        self._last_eval_iter = iteration
        self._pending_iter = None
        comm.synchronize()

    def _weights_to_evaluate(self) -> contextlib.AbstractContextManager:
        """The EMA weights in the model during the evaluation when the trainer has an EMA (``train.ema``)."""
        ema = getattr(self.trainer, "model_ema", None)
        if ema is None:
            return contextlib.nullcontext()
        ema.average_batch_norm_statistics()
        logger.info("Evaluating with EMA weights (%s)", ema.describe())
        return ema.applied_to(self.trainer.model)

    def _abandon(self, signum: int, iteration: int) -> None:
        """Stop training now, keeping this evaluation for the resumed run (a final one runs again anyway)."""
        trainer = self.trainer
        logger.warning(
            "Received %s during the evaluation at iteration %d: evaluation abandoned; train.resume=true runs it "
            "again.",
            signal_name(signum),
            iteration,
        )
        trainer.stop_signal = signum
        if iteration < trainer.max_iter:
            self._pending_iter = iteration
            checkpointer = trainer.checkpointer
            # The checkpoint hook saved this iteration before the evaluation: saved again on stop, so that the
            # checkpoint records the pending evaluation.
            if checkpointer is not None and checkpointer.last_saved_iteration == trainer.iter:
                checkpointer.last_saved_iteration = None

    def before_train(self) -> None:
        # A run stopped during the evaluation of iteration N resumes at N + 1: evaluate N first.
        if self._pending_iter is not None and self._pending_iter == self.trainer.start_iter - 1:
            self._evaluate(self._pending_iter)

    def after_step(self) -> None:
        is_last = self.trainer.iter + 1 >= self.trainer.max_iter
        # Stopping on a signal (preemption) leaves no time for an evaluation: the resumed run goes on.
        stopping = self.trainer.stop_signal
        if _is_period_end(self.trainer, self.eval_period) and not (
            is_last and self.eval_after_train or stopping
        ):
            self._evaluate()

    def after_train(self) -> None:
        # Evaluate at the end of a completed run only (not after an exception or a stop).
        if self.eval_after_train and self.trainer.iter >= self.trainer.max_iter:
            self._evaluate()  # recorded at iteration max_iter, after the last training metrics

    def state_dict(self) -> dict:
        return {"pending_iter": self._pending_iter} if self._pending_iter is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self._pending_iter = state.get("pending_iter")


class BestCheckpointer(HookBase):
    """Save ``model_best.pth`` when `val_metric` (e.g. ``segm/AP``) improves; NaN is never best.

    Place it after the `EvalHook` in ``train.hooks`` with the same period.
    """

    def __init__(
        self, eval_period: int, val_metric: str, mode: str = "max", file_prefix: str = "model_best"
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer(mode=) must be 'max' or 'min'; got {mode!r}")
        self.eval_period = eval_period
        self.val_metric = val_metric
        self.mode = mode
        self.file_prefix = file_prefix
        self.best_value: float | None = None
        self.best_iter: int | None = None

    def _improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value if self.mode == "max" else value < self.best_value

    def _check(self) -> None:
        latest = self.trainer.storage.latest()
        if self.val_metric not in latest:
            logger.warning(
                "BestCheckpointer: metric '%s' not found; recorded: %s", self.val_metric, sorted(latest)
            )
            return
        value, iteration = latest[self.val_metric]
        if iteration != self.trainer.iter or not self._improves(value):
            return
        self.best_value, self.best_iter = value, iteration
        if self.trainer.checkpointer is not None:
            self.trainer.checkpointer.save(self.file_prefix, iteration=iteration)
        logger.info("New best %s = %.4f at iteration %d", self.val_metric, value, iteration)

    def after_step(self) -> None:
        # No evaluation ran at a stop (skipped or abandoned by the EvalHook).
        if _is_period_end(self.trainer, self.eval_period) and not self.trainer.stop_signal:
            self._check()

    def after_train(self) -> None:
        if self.trainer.iter >= self.trainer.max_iter:
            self._check()

    def state_dict(self) -> dict:
        return {"best_value": self.best_value, "best_iter": self.best_iter}

    def load_state_dict(self, state: dict) -> None:
        self.best_value, self.best_iter = state.get("best_value"), state.get("best_iter")


class PeriodicWriter(HookBase):
    """Run the writers every `period` iterations and at the end (main process only).

    Args:
        output_dir: where ``metrics.json`` and TensorBoard events go (``${train.output_dir}``).
        period: write every this many iterations.
        writers: explicit writers; default: console line, ``metrics.json`` and TensorBoard (if installed).
        tensorboard: include the TensorBoard writer in the defaults.
    """

    def __init__(
        self,
        output_dir: str = "",
        period: int = 20,
        writers: Sequence[EventWriter] | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.output_dir = output_dir
        self.period = period
        self.writers = list(writers) if writers is not None else None
        self.tensorboard = tensorboard

    def before_train(self) -> None:
        if self.writers is None:
            self.writers = []
            if comm.is_main_process():
                self.writers.append(CommonMetricPrinter(self.trainer.max_iter))
                if self.output_dir:
                    json_file = os.path.join(self.output_dir, "metrics.json")
                    self.writers.append(JSONWriter(json_file, start_iter=self.trainer.start_iter))
                    if self.tensorboard:
                        self.writers.append(TensorboardWriter(self.output_dir))

    def after_step(self) -> None:
        if _is_period_end(self.trainer, self.period) or self.trainer.iter + 1 >= self.trainer.max_iter:
            for writer in self.writers:
                writer.write()

    def after_train(self) -> None:
        for writer in self.writers or []:
            writer.write()
            writer.close()


class TorchProfiler(HookBase):
    """Profile iterations ``[start_iter, end_iter)`` with torch.profiler and write a Chrome trace.

    Add it from the command line: ``+train.hooks.profiler="{_target_: lazytrain.engine.hooks.TorchProfiler,
    output_dir: ${train.output_dir}}"``.
    """

    def __init__(self, output_dir: str, start_iter: int = 5, end_iter: int = 10) -> None:
        self.output_dir = output_dir
        self.start_iter = start_iter
        self.end_iter = end_iter
        self._profiler = None

    def before_step(self) -> None:
        if self.trainer.iter == self.start_iter:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            self._profiler.__enter__()

    def after_step(self) -> None:
        if self._profiler is not None and self.trainer.iter + 1 >= self.end_iter:
            self._finish()

    def after_train(self) -> None:
        if self._profiler is not None:  # training ended inside the profiled window
            self._finish()

    def _finish(self) -> None:
        self._profiler.__exit__(None, None, None)
        os.makedirs(self.output_dir, exist_ok=True)
        path = os.path.join(
            self.output_dir, f"profiler-trace-rank{comm.get_rank()}-iter{self.trainer.iter}.json"
        )
        self._profiler.export_chrome_trace(path)
        logger.info("Profiler trace written to %s", path)
        self._profiler = None


class TorchMemoryStats(HookBase):
    """Log CUDA memory statistics every `period` iterations (a no-op without CUDA)."""

    def __init__(self, period: int = 20, max_runs: int = 10) -> None:
        self.period = period
        self.max_runs = max_runs
        self._runs = 0

    def after_step(self) -> None:
        if not torch.cuda.is_available() or self._runs >= self.max_runs:
            return
        if _is_period_end(self.trainer, self.period):
            self._runs += 1
            allocated = torch.cuda.max_memory_allocated() / 1024**2
            reserved = torch.cuda.max_memory_reserved() / 1024**2
            logger.info(
                "iter %d: max allocated %.0f MB, max reserved %.0f MB", self.trainer.iter, allocated, reserved
            )
            torch.cuda.reset_peak_memory_stats()
