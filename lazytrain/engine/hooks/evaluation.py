"""`EvalHook`: evaluation every `eval_period` steps and after training, its results put to the event storage
as flat ``task/metric`` names (`flatten_results`) and shared with every rank.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from lazytrain.engine.batch_norm import batch_norm_statistics_averaged
from lazytrain.engine.hooks.period import is_period_end
from lazytrain.engine.rng_state import get_rng_state, set_rng_state
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm
from lazytrain.utils.logger import create_small_table
from lazytrain.utils.preemption import EvaluationStopped, signal_name

__all__ = ["EvalHook", "flatten_results"]

logger = logging.getLogger(__name__)


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
        rng_state = get_rng_state()
        stopped = 0
        try:
            # Every rank evaluates with every rank's BatchNorm statistics (DDP leaves them rank-local), and
            # trains on with its own after.
            with self._weights_to_evaluate(), batch_norm_statistics_averaged(self.trainer.model):
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
        trainer.agreed_stop_signal = signum
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
        stopping = self.trainer.agreed_stop_signal
        if is_period_end(self.trainer, self.eval_period) and not (
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
