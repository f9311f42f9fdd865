"""The `Tracker` hook: when a tracker logs what, on the main process only, and how its failures are contained.

The invariant: every value ``metrics.json`` gets reaches the tracker run once, unless the tracker says, in one
line, that it gave up; training never waits on a tracker for longer than its ``timeout``. Subclasses
(`lazytrain.engine.trackers.mlflow`, `lazytrain.engine.trackers.wandb`) implement the library calls.
"""

from __future__ import annotations

import collections
import glob
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lazytrain.engine.trackers.delivery import CallWorker, RetrySchedule, TrackingLost, describe_error
from lazytrain.engine.trackers.run_info import get_flat_config
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm
from lazytrain.utils.events import get_scalars_by_iteration

__all__ = ["DEFAULT_ARTIFACTS", "Tracker"]

logger = logging.getLogger(__name__)

# Files of the run directory uploaded at the end of training (glob patterns relative to it).
DEFAULT_ARTIFACTS = ("*.png", "*.csv", "metrics.json", "config.yaml")
_WINDOW = 20  # the smoothing window of metrics.json (`JSONWriter`'s default)
# Logged iterations kept while the store does not answer; older ones are dropped first (metrics.json has them).
_MAX_UNSENT = 10_000
# Seconds of further tries at the end of training when the store is failing (a short outage, a restart).
_END_RETRIES = 10.0


class Tracker(HookBase):
    """Base of the experiment-tracker hooks: what to log when, on the main process only, failures contained.

    A subclass implements `open_run`, `log_params`, `log_metrics`, `log_files` and `close_run` (and may say
    where its run is, `describe_run`, and which files it leaves in the run directory, `get_local_files`).

    Metrics go through a buffer: every `period` iterations the values ``metrics.json`` got since the last time
    are added to it, and the tracker sends what the buffer holds. Each metric remembers the last step the
    tracker run holds, so a resumed run sends nothing twice and loses nothing (an evaluation the stopped run
    left pending is sent at its own iteration). The calls run in a worker thread (`CallWorker`): rank 0 waits
    at most `timeout` seconds, then trains on. A failure is one line (the tracker, what it was doing, the
    cause, what is kept); the buffer is kept, and sent at a later logging moment, after pauses of 2 s doubling
    up to a minute, once the store answers again (one line says so); after `retry_for` seconds of failures (or
    at the end of training, after 10 s more of tries), the tracker gives up, in one line, and calls its library
    no more. The run id stays hook state through all this: a failed reopen does not lose it, and values still
    unsent are saved in checkpoints too. `describe_outcome` says, for the end-of-run report, what the tracker
    run holds and what it lacks.

    Args:
        output_dir: the run directory (``${train.output_dir}``): its ``config.yaml`` becomes params, its
            plots are uploaded, and trackers keep their local files there.
        period: log metrics every this many iterations (``${train.log_period}`` logs what
            ``metrics.json`` gets, line for line), and at the end.
        artifacts: glob patterns, relative to `output_dir`, of the files uploaded at the end of training.
        timeout: seconds rank 0 waits for one batch of tracker calls before training on.
        retry_for: seconds of failures after which the tracker gives up for the rest of the run.
    """

    # The loggers of the tracker's library: their records go to log.txt at DEBUG level during its calls.
    library_loggers: tuple[str, ...] = ()

    def __init__(
        self,
        output_dir: str,
        *,
        period: int = 20,
        artifacts: Sequence[str] = DEFAULT_ARTIFACTS,
        timeout: float = 30.0,
        retry_for: float = 600.0,
    ) -> None:
        self._check_arguments(output_dir, period, artifacts, timeout, retry_for)
        self.output_dir = output_dir
        self.period = period
        self.artifacts = list(artifacts)
        self.timeout = float(timeout)
        self.run_id: str | None = None  # the tracker's id of this run, saved in checkpoints
        self._resume_id: str | None = None
        self._active = False
        self._gave_up = False
        self._params_sent = False
        self._logged: dict[str, int] = {}  # metric name -> the last step the tracker run holds
        self._scanned_until = -1  # the last iteration of the event storage put in the buffer
        self._unsent: collections.deque[tuple[int, dict[str, float]]] = collections.deque()
        self._lock = threading.Lock()  # the buffer is filled here and emptied by the worker thread
        self._sent = self._dropped = self._files_sent = 0
        self._failures: list[str] = []  # one line per thing not done, for the end-of-run report
        self._worker = CallWorker(type(self).__name__, self.library_loggers)
        self._retry = RetrySchedule(float(retry_for))
        self._cause = ""

    def _check_arguments(
        self, output_dir: Any, period: Any, artifacts: Any, timeout: Any, retry_for: Any
    ) -> None:
        name = type(self).__name__
        if not isinstance(output_dir, str) or not output_dir:
            raise ValueError(
                f"{name}(output_dir=) must be the run directory; got {output_dir!r}. Pass "
                "output_dir: ${train.output_dir}."
            )
        if not isinstance(period, int) or period <= 0:
            raise ValueError(
                f"{name}(period=) must be an int > 0; got {period!r} (e.g. ${{train.log_period}})"
            )
        if isinstance(artifacts, str):
            raise TypeError(
                f"{name}(artifacts=) must be a list of glob patterns; got the string {artifacts!r}"
            )
        for key, value in (("timeout", timeout), ("retry_for", retry_for)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}({key}=) must be a number of seconds > 0; got {value!r}")

    # What a subclass implements.

    def open_run(self, run_id: str | None) -> tuple[str, Mapping[str, int]]:
        """Start a tracker run, or reopen the run `run_id` (a resumed training run).

        Returns:
            The run's id and, for each metric the run already holds, the last step it holds it at (empty for a
            new run, or when the library itself refuses steps it already has).
        """
        raise NotImplementedError

    def log_params(self, params: Mapping[str, Any], *, resumed: bool) -> None:
        """Log the flattened config (`get_flat_config`); `resumed` when `open_run` reopened a run."""
        raise NotImplementedError

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the metrics of one iteration."""
        raise NotImplementedError

    def log_files(self, paths: Sequence[str]) -> None:
        """Upload files of the run directory (`artifacts`), keeping their paths relative to it."""
        raise NotImplementedError

    def close_run(self, status: str) -> None:
        """End the tracker run: `status` is ``"FINISHED"``, ``"FAILED"`` or ``"KILLED"`` (stopped by a
        signal, to be resumed)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """On the main process when training starts, before any call: import the library, find the store."""

    def describe_run(self) -> str:
        """Where the run is, for the end-of-run report."""
        return f"run {self.run_id}"

    def get_local_files(self) -> list[tuple[str, str]]:
        """``(name, what it holds)`` of what the tracker left in the run directory, for the report's file list."""
        return []

    # The hook's moments.

    def before_train(self) -> None:
        if not comm.is_main_process():
            return
        self._active = True
        try:
            self.prepare()
        except Exception as error:
            self._give_up("preparing the run", error)
            return
        self._collect()  # an evaluation the stopped run left pending was done just now
        self._deliver("starting the run")

    def after_step(self) -> None:
        if not self._active:
            return
        next_iter = self.trainer.iter + 1
        if next_iter % self.period == 0 or next_iter >= self.trainer.max_iter:
            self._collect()
            self._deliver("logging metrics")

    def after_train(self) -> None:
        if not self._active:
            return
        self._active = False
        self._collect()
        if self._deliver_at_end():
            deadline = time.monotonic() + self.timeout
            self._run_final_call(
                "uploading files", lambda: self._send_files(self._get_artifact_paths()), deadline
            )
        if self.run_id is not None:
            self._close(time.monotonic() + self.timeout)

    def state_dict(self) -> dict:
        state: dict[str, Any] = {}
        run_id = self.run_id or self._resume_id
        if run_id is not None:
            state["run_id"] = run_id
        with self._lock:
            unsent = [[step, dict(metrics)] for step, metrics in self._unsent]
        if unsent:
            state["unsent"] = unsent
        return state

    def load_state_dict(self, state: dict) -> None:
        self._resume_id = state.get("run_id")
        with self._lock:
            self._unsent.extendleft(
                (int(step), dict(metrics)) for step, metrics in reversed(state.get("unsent", []))
            )

    # What the end-of-run report reads.

    @property
    def is_complete(self) -> bool:
        """Whether everything the run produced reached the tracker."""
        return self.run_id is not None and not self._failures and not self._unsent and not self._dropped

    def describe_outcome(self) -> str:
        """One line: what the tracker run holds, or what it lacks and why."""
        logged = self._sent + len(self._unsent) + self._dropped
        if self.is_complete:
            return (
                f"{self.describe_run()}: config, metrics of {self._sent} logged iteration"
                f"{'s' if self._sent != 1 else ''}, {self._files_sent} file{'s' if self._files_sent != 1 else ''}"
            )
        where = self.describe_run() if self.run_id is not None else "no run opened"
        missing = len(self._unsent) + self._dropped
        text = f"INCOMPLETE, {where}: metrics of {self._sent} of {logged} logged iterations sent"
        if missing:
            text += f", {missing} not"
        text += "".join(f"; {failure}" for failure in self._failures)
        return text + "; metrics.json has every value"

    # Internals.

    def _collect(self) -> None:
        """Add what the event storage got since the last time to the buffer of unsent metrics."""
        by_iter = get_scalars_by_iteration(self.trainer.storage, _WINDOW, after=self._scanned_until)
        with self._lock:
            self._unsent.extend(by_iter.items())
            while len(self._unsent) > _MAX_UNSENT:
                self._unsent.popleft()
                self._dropped += 1
        if by_iter:
            self._scanned_until = max(by_iter)

    def _send_pending(self) -> None:
        """Open the run if it is not, log params once, then send the buffer oldest first (in the worker)."""
        if self.run_id is None:
            run_id, logged = self.open_run(self._resume_id)
            self.run_id, self._logged = run_id, dict(logged)
        if not self._params_sent:
            self.log_params(get_flat_config(self.output_dir), resumed=self.run_id == self._resume_id)
            self._params_sent = True
        while True:
            with self._lock:
                if not self._unsent:
                    return
                step, metrics = self._unsent[0]
            new = {key: value for key, value in metrics.items() if self._logged.get(key, -1) < step}
            if new:
                self.log_metrics(new, step)
                self._logged.update(dict.fromkeys(new, step))
            with self._lock:
                if self._unsent and self._unsent[0][0] == step:
                    self._unsent.popleft()
                    self._sent += 1

    def _deliver(self, action: str) -> None:
        """Send what is pending, unless a call is still running, a pause after failures is not over, or the
        tracker gave up."""
        now = time.monotonic()
        if self._gave_up:
            return
        if self._worker.busy or not self._retry.is_due(now):
            if self._retry.is_exhausted(now):
                self._give_up(action, None)
            return
        self._attempt(action, self.timeout)

    def _deliver_at_end(self) -> bool:
        """Send what is left: at once when all is well, else with a few more tries over `_END_RETRIES` seconds
        (pausing 1, 2, 4 ... s; there is no later moment to wait for). Whether everything was sent."""
        if self._gave_up:
            return False
        if (
            not self._retry.failing
            and not self._worker.busy
            and self._attempt("logging metrics", self.timeout)
        ):
            return True
        deadline = time.monotonic() + min(self.timeout, _END_RETRIES)
        pause = 1.0
        while not self._gave_up:
            left = deadline - time.monotonic()
            if self._worker.wait(left) and self._attempt("logging metrics", max(left, 1.0)):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                self._give_up("logging metrics", None)
                break
            time.sleep(min(pause, left))
            pause *= 2
        return False

    def _attempt(self, action: str, timeout: float) -> bool:
        """One bounded attempt at sending what is pending; whether it succeeded."""
        sent_before = self._sent
        try:
            self._worker.run(self._send_pending, timeout)
        except Exception as error:
            self._record_failure(action, error)
            return False
        if self._retry.failing:
            logger.info(
                "%s: the store answers again; sent the metrics of %d kept logged iteration(s).",
                type(self).__name__,
                self._sent - sent_before,
            )
            self._retry.record_success()
        return True

    def _record_failure(self, action: str, error: Exception) -> None:
        now = time.monotonic()
        first = self._retry.record_failure(now)
        self._cause = describe_error(error)
        if isinstance(error, TrackingLost) or self._retry.is_exhausted(now):
            self._give_up(action, error)
        elif first:
            logger.warning(
                "%s: %s failed (%s); kept %s to send when it answers, trying again for up to %s; training "
                "goes on.",
                type(self).__name__,
                action,
                self._cause,
                self._describe_kept(),
                _format_seconds(self._retry.give_up_after),
            )
        else:
            logger.debug("%s: %s failed again (%s)", type(self).__name__, action, self._cause)

    def _describe_kept(self) -> str:
        with self._lock:
            kept = len(self._unsent)
        metrics = f"the metrics of {kept} logged iteration{'s' if kept != 1 else ''}"
        return f"the run id and {metrics}" if (self.run_id or self._resume_id) else metrics

    def _give_up(self, action: str, error: Exception | None) -> None:
        """Stop calling the library for the rest of the run, saying so in one line."""
        if self._gave_up:
            return
        self._gave_up = True
        if error is not None:
            self._cause = describe_error(error)
        if not self._retry.failing:
            self._retry.record_failure(time.monotonic())
        logger.warning(
            "%s: gave up after %s (%s: %s); it sends nothing more this run (metrics.json has every value, the "
            "end of the run says what the tracker holds); training goes on.",
            type(self).__name__,
            self._retry.describe_series(time.monotonic()),
            action,
            self._cause,
        )
        self._failures.append(f"gave up while {action} ({self._cause})")

    def _run_final_call(self, action: str, function: Any, deadline: float) -> bool:
        """One bounded call at the end of training; a failure is one line."""
        if self._gave_up or self._worker.busy:
            return False
        try:
            self._worker.run(function, max(deadline - time.monotonic(), min(self.timeout, 10.0)))
        except Exception as error:
            cause = describe_error(error)
            logger.warning("%s: %s failed (%s); training goes on.", type(self).__name__, action, cause)
            self._failures.append(f"{action} failed ({cause})")
            return False
        return True

    def _send_files(self, paths: list[str]) -> None:
        self.log_files(paths)
        self._files_sent = len(paths)

    def _close(self, deadline: float) -> None:
        if not self._gave_up:
            self._run_final_call("closing the run", lambda: self.close_run(self._get_status()), deadline)
            return
        # After giving up: free what the library holds (a service process), quietly and briefly.
        if self._worker.busy:
            return
        try:
            self._worker.run(lambda: self.close_run("FAILED"), min(self.timeout, 10.0))
        except Exception:
            logger.debug("%s: closing the run after giving up failed too", type(self).__name__, exc_info=True)

    def _get_artifact_paths(self) -> list[str]:
        paths = set()
        for pattern in self.artifacts:
            paths.update(p for p in glob.glob(os.path.join(self.output_dir, pattern)) if os.path.isfile(p))
        return sorted(paths)

    def _get_status(self) -> str:
        if self.trainer.agreed_stop_signal:
            return "KILLED"
        return "FINISHED" if self.trainer.iter >= self.trainer.max_iter else "FAILED"


def _format_seconds(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
