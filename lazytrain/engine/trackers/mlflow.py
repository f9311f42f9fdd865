"""`MLflowTracker`: a run's config, metrics and files in MLflow, by default in a SQLite file that needs no
server. The jobs of a sweep share one SQLite file, and every call to it holds a file lock beside it, so that
parallel jobs write one at a time instead of meeting SQLite's "database is locked"."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from filelock import FileLock

from lazytrain.engine.trackers.base import DEFAULT_ARTIFACTS, Tracker
from lazytrain.engine.trackers.delivery import TrackingLost
from lazytrain.engine.trackers.run_info import get_run_name, get_sweep_name
from lazytrain.utils.optional_imports import check_optional, import_optional
from lazytrain.utils.run_dirs import HydraJob, read_hydra_job

__all__ = ["MLflowTracker"]

logger = logging.getLogger(__name__)

_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # the tracking URIs of MLflow's SQL store
_MLFLOW_NAME = re.compile(r"[^\w\-. /]")  # MLflow keys: alphanumerics, _ - . space /
_SQLITE = "sqlite:///"


def _get_mlflow_key(name: str) -> str:
    return _MLFLOW_NAME.sub("_", name)[:250]


class MLflowTracker(Tracker):
    """Log the run to MLflow: params, metrics (step = iteration), plots and CSV as artifacts at the end.

    With no `tracking_uri` and no ``MLFLOW_TRACKING_URI``, the store is a SQLite file needing no server:
    ``RUN_DIR/mlflow.db``, or ``SWEEP_DIR/mlflow.db`` shared by the jobs of a sweep (each call holds
    ``mlflow.db.lock``, so parallel jobs take turns); browse it with ``mlflow ui --backend-store-uri
    sqlite:///RUN_DIR/mlflow.db``. Artifacts of a SQLite store go beside it, in ``mlruns/`` (MLflow's own
    default is the working directory). The experiment is named after the config (``rfs_maskrcnn_demo``) or,
    for a sweep's jobs, after the sweep directory; runs are named after their directory and overrides
    (``1 train.seed=1``) and tagged ``lazytrain.output_dir``. A resumed run reopens the same MLflow run; its
    params keep the values they started with (MLflow params cannot change). MLflow's own log records (its SQL
    store logs whole tracebacks) go to ``log.txt`` only.

    Args:
        output_dir: the run directory (``${train.output_dir}``).
        period: log metrics every this many iterations, and at the end.
        tracking_uri: e.g. ``http://mlflow.example:5000``, ``sqlite:///path/mlflow.db``, ``databricks``;
            None: ``MLFLOW_TRACKING_URI`` if set, else the SQLite file above. MLflow (>= 3.13) refuses
            ``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``.
        experiment_name: None: the config's name, or the sweep directory for a sweep's jobs.
        run_name: None: the run directory's name and the job's overrides.
        artifacts: glob patterns, relative to `output_dir`, of the files logged at the end.
        timeout: seconds rank 0 waits for one batch of MLflow calls (`Tracker`).
        retry_for: seconds of failures after which the tracker gives up (`Tracker`).
    """

    library_loggers = ("mlflow", "alembic")

    def __init__(
        self,
        output_dir: str,
        *,
        period: int = 20,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        run_name: str | None = None,
        artifacts: Sequence[str] = DEFAULT_ARTIFACTS,
        timeout: float = 30.0,
        retry_for: float = 600.0,
    ) -> None:
        super().__init__(output_dir, period=period, artifacts=artifacts, timeout=timeout, retry_for=retry_for)
        modules: tuple[str, ...] = ("mlflow",)
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:"
        if uri.split(":")[0].split("+")[0] in _DATABASES:  # mlflow-skinny leaves out its SQL store's packages
            modules += ("sqlalchemy", "alembic")
        check_optional("MLflowTracker", modules, "mlflow")
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self._uri = ""
        self._artifact_location: str | None = None
        self._experiment = ""
        self._client = None
        self._store_lock: FileLock | None = None

    def prepare(self) -> None:
        import_optional("mlflow", component="MLflowTracker", extra="mlflow")
        job = read_hydra_job(self.output_dir)
        self._uri, self._artifact_location = self._get_store(job)
        self._experiment = self._get_experiment_name(job)
        if self._uri.startswith(_SQLITE):
            self._store_lock = FileLock(self._get_store_file() + ".lock", timeout=self.timeout)

    def _get_store(self, job: HydraJob | None) -> tuple[str, str | None]:
        """(tracking URI, artifact location for a new experiment: None leaves it to MLflow or its server)."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            store_dir = os.path.abspath(job.sweep_dir if job and job.sweep_dir else self.output_dir)
            os.makedirs(store_dir, exist_ok=True)
            uri = _SQLITE + os.path.join(store_dir, "mlflow.db")
        if not uri.startswith(_SQLITE):
            return uri, None
        # MLflow would put a SQLite store's artifacts in ./mlruns of the working directory: keep them beside it.
        store_dir = os.path.dirname(os.path.abspath(uri[len(_SQLITE) :]))
        return uri, "file://" + os.path.join(store_dir, "mlruns")

    def _get_store_file(self) -> str:
        return os.path.abspath(self._uri[len(_SQLITE) :])

    def _get_experiment_name(self, job: HydraJob | None) -> str:
        if self.experiment_name:
            return self.experiment_name
        if job is not None and job.sweep_dir:
            return get_sweep_name(job.sweep_dir)
        return job.name if job is not None else "lazytrain"

    @contextlib.contextmanager
    def _holding_store(self) -> Iterator[None]:
        """The store's file lock around a call (SQLite stores): the jobs of a sweep write one at a time.

        Raises:
            TrackingLost: the SQLite file this run was opened in is gone (SQLite would quietly start an empty
                one in its place, and the lock would make its folder again).
        """
        if self._store_lock is None:
            yield
            return
        if self.run_id is not None and not os.path.exists(self._get_store_file()):
            raise TrackingLost(f"the store {self._uri} was deleted during the run")
        with self._store_lock:
            yield

    def open_run(self, run_id: str | None) -> tuple[str, Mapping[str, int]]:
        from mlflow import MlflowClient

        with self._holding_store():
            client = self._client = self._client or MlflowClient(tracking_uri=self._uri)
            if run_id is not None and self._has_run(run_id):
                client.update_run(run_id, status="RUNNING")
                logger.info("MLflowTracker: continuing run %s (%s)", run_id, self._uri)
                return run_id, self._get_logged_steps(run_id)
            experiment = client.get_experiment_by_name(self._experiment)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                experiment_id = client.create_experiment(
                    self._experiment, artifact_location=self._artifact_location
                )
            tags = {"lazytrain.output_dir": os.path.abspath(self.output_dir)}
            run = client.create_run(
                experiment_id, run_name=self.run_name or get_run_name(self.output_dir), tags=tags
            )
        logger.info(
            "MLflowTracker: run %s in experiment '%s' (%s)", run.info.run_id, self._experiment, self._uri
        )
        return run.info.run_id, {}

    def _has_run(self, run_id: str) -> bool:
        """Whether the store holds `run_id`; an error other than "no such run" (the store is down) raises, so
        that the run is reopened when the store is back rather than replaced by a new one."""
        from mlflow.exceptions import MlflowException

        try:
            self._client.get_run(run_id)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            logger.warning("MLflowTracker: run %s is not in %s; starting a new run.", run_id, self._uri)
            return False
        return True

    def _get_logged_steps(self, run_id: str) -> dict[str, int]:
        """The last step of each metric the run holds."""
        keys = self._client.get_run(run_id).data.metrics
        steps = {
            key: [metric.step for metric in self._client.get_metric_history(run_id, key)] for key in keys
        }
        return {key: max(values) for key, values in steps.items() if values}

    def log_params(self, params: Mapping[str, Any], *, resumed: bool) -> None:
        from mlflow.entities import Param

        with self._holding_store():
            existing = self._client.get_run(self.run_id).data.params if resumed else {}
            values = {_get_mlflow_key(key): str(value)[:6000] for key, value in params.items()}
            new = [Param(key, value) for key, value in values.items() if key not in existing]
            if new:
                self._client.log_batch(self.run_id, params=new)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(_get_mlflow_key(key), value, now, step) for key, value in metrics.items()]
        with self._holding_store():
            self._client.log_batch(self.run_id, metrics=entries)

    def log_files(self, paths: Sequence[str]) -> None:
        for path in paths:
            relative = os.path.dirname(os.path.relpath(path, self.output_dir))
            with self._holding_store():
                self._client.log_artifact(self.run_id, path, artifact_path=relative or None)

    def close_run(self, status: str) -> None:
        if self._client is not None and self.run_id is not None:
            with self._holding_store():
                self._client.set_terminated(self.run_id, status=status)

    def describe_run(self) -> str:
        return f"run {self.run_id} in experiment '{self._experiment}' ({self._uri})"

    def get_local_files(self) -> list[tuple[str, str]]:
        if not self._uri.startswith(_SQLITE):
            return []
        store = self._get_store_file()
        if os.path.dirname(store) != os.path.abspath(self.output_dir) or not os.path.isfile(store):
            return []
        if self.is_complete:
            return [
                (os.path.basename(store), f"MLflowTracker's runs: mlflow ui --backend-store-uri {self._uri}")
            ]
        return [
            (
                os.path.basename(store),
                "MLflowTracker's store: this run is INCOMPLETE in it (see Tracking above)",
            )
        ]
