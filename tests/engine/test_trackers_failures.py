"""A tracker whose library fails, stalls or comes back: one line per failure, the unsent metrics kept and sent
when the store answers again, a bounded wait, a bounded time before giving up, and an end-of-run report that
says what was tracked. A recording tracker stands for any library; MLflow's own SQLite store is broken for real
(corrupted, deleted, replaced by a folder) and shared by two processes."""

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import mlflow
import pytest
from omegaconf import OmegaConf

from lazytrain.engine.hooks import CallbackHook
from lazytrain.engine.trackers.base import Tracker
from lazytrain.engine.trackers.delivery import CallWorker, describe_error
from lazytrain.engine.trackers.mlflow import MLflowTracker
from lazytrain.program.run_report import format_run_summary
from tests.engine.test_trackers import (  # noqa: F401  (the fixture keeps this machine's settings out)
    _no_tracker_settings,
    make_run_dir,
    metric_lines,
    mlflow_history,
    train_toy,
)

TRACKER_LOGS = "lazytrain.engine.trackers"


class RecordingTracker(Tracker):
    """A tracker whose method `failing` raises `error` `failures` times (always: None), and whose
    `log_metrics` stalls `stall` seconds once; records the calls and the metrics it gets."""

    def __init__(self, output_dir, failing=None, failures=None, stall=0.0, error=None, **kwargs):
        super().__init__(output_dir, period=2, **{"timeout": 5.0, "retry_for": 60.0, **kwargs})
        self.failing, self.failures, self.stall = failing, failures, stall
        self.error = error or ConnectionError("tracking server unreachable")
        self.calls, self.metrics = [], {}

    def _record(self, name):
        self.calls.append(name)
        if name == self.failing and (self.failures is None or self.failures > 0):
            self.failures = None if self.failures is None else self.failures - 1
            raise self.error

    def open_run(self, run_id):
        self._record("open_run")
        return run_id or "run-1", {}

    def log_params(self, params, *, resumed):
        self._record("log_params")

    def log_metrics(self, metrics, step):
        if self.stall:
            stall, self.stall = self.stall, 0.0
            time.sleep(stall)
        self._record("log_metrics")
        self.metrics[step] = dict(metrics)

    def log_files(self, paths):
        self._record("log_files")

    def close_run(self, status):
        self._record("close_run")


def assert_same_metrics(got, expected):
    assert sorted(got) == sorted(expected)
    for step, values in expected.items():
        assert got[step] == pytest.approx(values), step


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("failing", ["open_run", "log_params", "log_metrics"])
def test_a_failure_is_one_line_and_the_kept_metrics_are_sent_when_the_store_answers(
    tmp_path, caplog, failing
):
    tracker = RecordingTracker(str(make_run_dir(tmp_path / "run")), failing, failures=2, timeout=10.0)
    with caplog.at_level(logging.INFO, logger=TRACKER_LOGS):
        trainer = train_toy(tmp_path / "run", tracker, max_iter=4)
    assert trainer.iter == 4
    (warning,) = warnings_of(caplog)
    assert warning.startswith(
        f"RecordingTracker: {'starting the run' if failing != 'log_metrics' else 'logging'}"
    )
    assert "(ConnectionError: tracking server unreachable)" in warning and "\n" not in warning
    assert "kept the" in warning and "to send when it answers" in warning and "training goes on" in warning
    back = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(back) == 1
    # Every iteration metrics.json got reached the tracker, once, at its own step.
    assert_same_metrics(tracker.metrics, metric_lines(tmp_path / "run"))
    assert tracker.calls.count("open_run") == (3 if failing == "open_run" else 1)
    assert tracker.calls[-2:] == ["log_files", "close_run"] and tracker.is_complete


@pytest.mark.parametrize("failing", ["open_run", "log_params", "log_metrics", "log_files", "close_run"])
def test_a_tracker_that_keeps_failing_gives_up_in_one_line_and_training_goes_on(tmp_path, caplog, failing):
    tracker = RecordingTracker(str(make_run_dir(tmp_path / "run")), failing, timeout=2.0)
    with caplog.at_level(logging.INFO, logger=TRACKER_LOGS):
        trainer = train_toy(tmp_path / "run", tracker, max_iter=4)
    assert trainer.iter == 4 and sorted(metric_lines(tmp_path / "run")) == [1, 3, 4]  # training went on
    warnings = warnings_of(caplog)
    assert all("\n" not in w and w.startswith("RecordingTracker: ") for w in warnings), warnings
    assert all("ConnectionError: tracking server unreachable" in w for w in warnings), warnings
    if failing in ("log_files", "close_run"):  # at the end: one line
        (warning,) = warnings
        assert warning.startswith(
            f"RecordingTracker: {'uploading files' if failing == 'log_files' else 'closing'}"
        )
    else:  # the first failure, then giving up at the end of training
        assert len(warnings) == 2 and "gave up after" in warnings[1], warnings
        assert "metrics.json has every value" in warnings[1]
        # After giving up, only one last close of an opened run.
        assert tracker.calls[-1] == ("close_run" if failing != "open_run" else "open_run")
    assert not tracker.is_complete and "INCOMPLETE" in tracker.describe_outcome()


def test_a_library_exit_in_a_call_is_a_failure_retried_and_reported(tmp_path, caplog):
    """A library that calls sys.exit in a call: the call failed (before, the thread ended quietly and the
    metrics counted as sent), so the metrics are kept and sent when a later call succeeds."""
    run_dir = str(make_run_dir(tmp_path / "run"))
    tracker = RecordingTracker(run_dir, "log_metrics", failures=2, error=SystemExit(2), timeout=10.0)
    with caplog.at_level(logging.INFO, logger=TRACKER_LOGS):
        train_toy(tmp_path / "run", tracker, max_iter=4)
    (warning,) = warnings_of(caplog)
    assert warning.startswith("RecordingTracker: logging metrics failed")
    assert "(LibraryExit: the library raised SystemExit(2))" in warning and "\n" not in warning
    assert len([r for r in caplog.records if "answers again" in r.getMessage()]) == 1
    assert_same_metrics(tracker.metrics, metric_lines(tmp_path / "run"))
    assert tracker.calls.count("log_metrics") == 2 + len(metric_lines(tmp_path / "run"))
    assert tracker.is_complete


def test_a_keyboard_interrupt_in_a_call_goes_on_in_the_callers_thread():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        CallWorker("Tracker").run(interrupted, timeout=5.0)


def test_failures_for_longer_than_retry_for_give_up_during_training(tmp_path, caplog):
    tracker = RecordingTracker(str(make_run_dir(tmp_path / "run")), "log_metrics", timeout=2.0, retry_for=0.3)
    slow = CallbackHook(after_step=lambda trainer: time.sleep(0.05))
    with caplog.at_level(logging.INFO, logger=TRACKER_LOGS):
        train_toy(tmp_path / "run", tracker, max_iter=20, extra_hooks={"slow": slow})
    first, gave_up = warnings_of(caplog)
    assert "trying again for up to 0.3 s" in first and "gave up after" in gave_up
    calls_before_end = tracker.calls.count("log_metrics")
    assert calls_before_end <= 3  # pauses between attempts, none after giving up


def test_a_stalled_call_does_not_hold_training_up(tmp_path, caplog):
    """The library stalls 3 s in one call: the hook returns after its timeout, training goes on, and the
    metrics kept meanwhile are sent once the call has come back."""
    tracker = RecordingTracker(str(make_run_dir(tmp_path / "run")), stall=3.0, timeout=1.0)
    durations = []
    timed = CallbackHook(after_step=lambda trainer: durations.append(time.monotonic()))
    slow = CallbackHook(after_step=lambda trainer: time.sleep(0.1))
    with caplog.at_level(logging.INFO, logger=TRACKER_LOGS):
        train_toy(tmp_path / "run", tracker, max_iter=40, extra_hooks={"slow": slow, "timed": timed})
    gaps = [b - a for a, b in zip(durations, durations[1:])]
    assert max(gaps) < 1.0 + 0.1 + 0.5, gaps  # the timeout, the step's sleep, slack for a busy machine
    (warning,) = warnings_of(caplog)
    assert "(CallTimeout: no answer in 1 s)" in warning
    assert_same_metrics(tracker.metrics, metric_lines(tmp_path / "run"))
    assert tracker.is_complete


def test_describe_error_is_one_line_without_the_sql():
    error = mlflow.exceptions.MlflowException(
        "(sqlite3.DatabaseError) file is not a database\n[SQL: SELECT runs.run_uuid FROM runs WHERE x = ?]\n"
        "[parameters: ('abc',)]\n(Background on this error at: https://sqlalche.me/e/14/4xp6)"
    )
    assert describe_error(error) == "MlflowException: (sqlite3.DatabaseError) file is not a database"
    assert describe_error(ConnectionError()) == "ConnectionError"
    # SQLAlchemy 2, when a query's autoflush fails (seen on a store replaced by a folder mid-run)
    autoflush = mlflow.exceptions.MlflowException(
        "(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush block if this "
        "flush is occurring prematurely)\n(sqlite3.OperationalError) unable to open database file\n"
        "[SQL: INSERT INTO metrics (key) VALUES (?)]"
    )
    assert (
        describe_error(autoflush)
        == "MlflowException: (sqlite3.OperationalError) unable to open database file"
    )


def make_store(directory):
    """A SQLite store with its tables (created in seconds on a busy machine, longer than the tests' timeouts)."""
    uri = f"sqlite:///{directory}/mlflow.db"
    os.makedirs(directory, exist_ok=True)
    mlflow.MlflowClient(uri).search_experiments()
    return uri


def break_store(how, store_dir):
    """Make a run's SQLite store unusable mid-run, as a user or a full disk might."""
    store = os.path.join(store_dir, "mlflow.db")
    if how == "corrupted":
        with open(store, "r+b") as f:
            f.write(b"not a database " * 64)
    elif how == "deleted-folder":
        shutil.rmtree(store_dir)
    elif how == "replaced-by-a-folder":
        os.replace(store, store + ".away")
        os.mkdir(store)


def mend_store(store_dir):
    store = os.path.join(store_dir, "mlflow.db")
    os.rmdir(store)
    os.replace(store + ".away", store)


def summary_of(run_dir, trainer):
    cfg = OmegaConf.create({"train": {"output_dir": str(run_dir)}})
    return format_run_summary(cfg, trainer, 1.0)


@pytest.mark.parametrize("how", ["corrupted", "deleted-folder"])
def test_a_broken_mlflow_store_is_one_line_quiet_and_reported(tmp_path, caplog, capfd, how):
    # A store path of its own per case: pytest names both cases' tmp_path ..._is_0 (names cut at 30 characters,
    # a passing test's folder deleted), and MLflow keeps one store per URI in the process, whose tables were
    # created in the first case's file ("no such table: experiments" on the floor's MLflow 3.7).
    run_dir, store_dir = make_run_dir(tmp_path / "run"), tmp_path / f"store-{how}"
    uri = make_store(store_dir)
    tracker = MLflowTracker(str(run_dir), period=2, tracking_uri=uri, timeout=6.0)
    breaker = CallbackHook(after_step=lambda t: break_store(how, str(store_dir)) if t.iter == 1 else None)
    with caplog.at_level(logging.DEBUG, logger=TRACKER_LOGS):
        trainer = train_toy(
            run_dir, tracker, max_iter=4, extra_hooks={"breaker": breaker}, before_tracker=True
        )
    assert trainer.iter == 4
    warnings = warnings_of(caplog)
    if how == "corrupted":  # perhaps mended soon: tried again until the end of training, then given up
        assert len(warnings) == 2 and all("\n" not in w for w in warnings), warnings
        assert warnings[0].startswith("MLflowTracker: logging metrics failed (MlflowException: ")
        assert "file is not a database" in warnings[0] and "gave up after" in warnings[1]
    else:  # no store to come back: given up at once
        (warning,) = warnings
        assert warning.startswith("MLflowTracker: gave up after 1 attempt") and "\n" not in warning
        assert f"TrackingLost: the store {uri} was deleted during the run" in warning
    assert "[SQL:" not in "".join(warnings)
    # MLflow's own traceback went to the log at DEBUG level, not to the console.
    assert "Traceback" not in capfd.readouterr().err
    summary = summary_of(run_dir, trainer)
    assert f"  MLflowTracker  INCOMPLETE, run {tracker.run_id} in experiment" in summary
    assert "metrics of 0 of 3 logged iterations sent, 3 not" in summary, summary
    assert "metrics.json has every value" in summary
    assert "mlflow ui" not in summary  # the store is not pointed at as if the run were in it


def test_a_store_down_mid_run_gets_every_metric_when_it_is_back(tmp_path, caplog, capfd):
    run_dir = make_run_dir(tmp_path / "run")
    make_store(run_dir)  # the default store, RUN_DIR/mlflow.db
    tracker = MLflowTracker(str(run_dir), period=2, timeout=10.0)

    def down_then_back(trainer):
        if trainer.iter == 1:
            break_store("replaced-by-a-folder", str(run_dir))
        elif trainer.iter == 4:
            mend_store(str(run_dir))

    breaker = CallbackHook(after_step=down_then_back)
    with caplog.at_level(logging.DEBUG, logger=TRACKER_LOGS):
        trainer = train_toy(
            run_dir, tracker, max_iter=6, extra_hooks={"breaker": breaker}, before_tracker=True
        )
    # MLflow's logger reports the failed connection with a whole traceback: in the log at DEBUG level only.
    assert "Traceback" not in capfd.readouterr().err
    assert any(
        r.levelno == logging.DEBUG and "mlflow.store.db.utils ERROR" in r.getMessage() for r in caplog.records
    )
    (warning,) = warnings_of(caplog)
    # SQLite's own words vary with the pool's state when the file goes: "unable to open database file" or
    # "attempt to write a readonly database" (both seen in CI); the warning names one, not SQLAlchemy's notes.
    assert "MLflowTracker: logging metrics failed (MlflowException: (sqlite3.OperationalError) " in warning
    assert any("answers again" in r.getMessage() for r in caplog.records)
    history = mlflow_history(mlflow.MlflowClient(f"sqlite:///{run_dir}/mlflow.db"), tracker.run_id)
    written = metric_lines(run_dir)
    assert sorted(history) == sorted(written) == [1, 3, 5, 6]
    for step, values in written.items():
        assert history[step] == pytest.approx(values)
    summary = summary_of(run_dir, trainer)
    assert f"  MLflowTracker  run {tracker.run_id} in experiment " in summary
    assert "metrics of 4 logged iterations" in summary, summary
    assert re.search(
        r"\n  mlflow\.db +MLflowTracker's runs: mlflow ui --backend-store-uri sqlite:///", summary
    )


# Another sweep job's long write to the shared store (as when it creates the store's tables on a busy machine):
# it holds the store's lock file, as lazytrain's trackers do, and SQLite's write lock, for longer than the 20 s
# MLflow lets SQLite wait (its busy_timeout) before "database is locked".
HOLD_STORE = """
import sqlite3, sys, time
from filelock import FileLock
with FileLock(sys.argv[1] + ".lock"):
    connection = sqlite3.connect(sys.argv[1], isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
    connection.execute("COMMIT")
"""


@pytest.mark.slow
def test_a_sweep_job_waits_for_another_jobs_write_to_the_shared_store(tmp_path, caplog):
    sweep_dir = tmp_path / "sweep"
    uri = make_store(sweep_dir)
    holders = []

    def another_job_writes(trainer):
        if trainer.iter == 1:  # after this job opened its run, before it logs its first metrics
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLD_STORE, str(sweep_dir / "mlflow.db"), "22"], stdout=subprocess.PIPE
            )
            assert holder.stdout.readline() == b"holding\n"
            holders.append(holder)

    run_dir = make_run_dir(sweep_dir / "1")
    tracker = MLflowTracker(str(run_dir), period=2, tracking_uri=uri)
    hook = CallbackHook(after_step=another_job_writes)
    with caplog.at_level(logging.INFO, logger=TRACKER_LOGS):
        train_toy(run_dir, tracker, max_iter=4, extra_hooks={"other_job": hook}, before_tracker=True)
    assert holders[0].wait(60) == 0
    assert warnings_of(caplog) == []  # it waited for the lock: no "database is locked", nothing to retry
    history = mlflow_history(mlflow.MlflowClient(uri), tracker.run_id)
    assert sorted(history) == sorted(metric_lines(run_dir)) == [1, 3, 4] and tracker.is_complete


def test_calls_are_made_in_a_worker_thread(tmp_path):
    threads = set()

    class ThreadRecorder(RecordingTracker):
        def log_metrics(self, metrics, step):
            threads.add(threading.current_thread().name)

    train_toy(tmp_path / "run", ThreadRecorder(str(make_run_dir(tmp_path / "run"))), max_iter=2)
    assert threads == {"ThreadRecorder call"}
