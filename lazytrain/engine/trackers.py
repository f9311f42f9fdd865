"""Experiment trackers as hooks: `MLflowTracker` and `WandbTracker` send a run's config, its metrics and its
plots to MLflow or Weights & Biases. Each is a hook like the others, added to ``train.hooks``::

    python -m lazytrain conf/rfs_maskrcnn_demo.py \\
        '+train.hooks.mlflow={_target_: lazytrain.engine.trackers.MLflowTracker, output_dir: ${train.output_dir}}'

or, in a config file, ``train.hooks.mlflow = L(MLflowTracker)(output_dir="${train.output_dir}")``. Place a
tracker after the writer and plot hooks (the end of the mapping, where ``+`` puts it), so that it logs the final
evaluation and uploads the finished plots.

What a tracker logs (the same for both):

- params: the run's ``config.yaml``, flattened to ``model.backbone.depth``-style keys, with values resolved;
- metrics: every `period` iterations and at the end, the values ``metrics.json`` gets (windowed medians of
  losses, the LR, evaluation results at the iteration they belong to), with the iteration as the step;
- files at the end of training: the run directory's plots, per-category CSV, ``metrics.json`` and
  ``config.yaml`` (`artifacts`).

Rank 0 only, and never a reason for a run to fail: the first error of a tracker (a server down, a full disk,
a bug in the library) is logged once as an error and the tracker stops itself; training goes on. Only a missing
package is an error, at construction, before training starts. ``train.resume=true`` continues the same tracker
run: its id is hook state, saved in every checkpoint (steps the tracker already has are not sent again).

The libraries are optional (``pip install "lazytrain[mlflow]"``, ``"lazytrain[wandb]"``) and imported by the
main process when training starts, so ``import lazytrain`` stays lean. Another tracker subclasses `Tracker`
and implements its five methods.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import logging
import netrc
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig

from lazytrain.config import LazyConfig, tree
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm
from lazytrain.utils.events import get_scalars_by_iteration
from lazytrain.utils.run_dirs import HydraJob, read_hydra_job, read_overrides

__all__ = [
    "DEFAULT_ARTIFACTS",
    "MLflowTracker",
    "Tracker",
    "WandbTracker",
    "get_flat_config",
]

logger = logging.getLogger(__name__)

# Files of the run directory uploaded at the end of training (glob patterns relative to it).
DEFAULT_ARTIFACTS = ("*.png", "*.csv", "metrics.json", "config.yaml")
_WINDOW = 20  # the smoothing window of metrics.json (`JSONWriter`'s default)
_RUN_NAME_LENGTH = 200


def _require_modules(component: str, extra: str, modules: Sequence[str]) -> None:
    """Fail at construction (before training) when a package the tracker needs is not installed; checked with
    `importlib.util.find_spec`, which imports nothing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"{component} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            f'installed. Install the extra: pip install "lazytrain[{extra}]" (or remove the hook from '
            "train.hooks)."
        )


def get_flat_config(output_dir: str) -> dict[str, Any]:
    """The run's ``config.yaml`` (written by the main process before training) as ``{"a.b.0.c": value}``.

    Values are resolved (``train.output_dir`` is `output_dir` again, not the saved file's ``./output``); an
    interpolation of a whole node (``dataset_dicts: ${..dataset}``) or one that does not resolve stays as its
    ``${...}`` text. Returns ``{}`` when the run directory has no ``config.yaml``.
    """
    path = os.path.join(output_dir, "config.yaml")
    if not os.path.isfile(path):
        logger.debug("No %s: no config to log as params.", path)
        return {}
    cfg = LazyConfig.load(path)
    if isinstance(cfg.get("train"), DictConfig):
        cfg.train.output_dir = output_dir
    flat = {}
    for entry in tree.walk(cfg, join=tree.dotted_path):
        if tree.has_children(entry.node):
            continue
        flat[entry.path] = _get_leaf_value(entry)
    return flat


def _get_leaf_value(entry: tree.Entry) -> Any:
    raw = tree.raw_value(entry.node)
    if not tree.is_interpolation(entry.node):
        return raw
    try:
        return raw if tree.points_at_container(entry.node) else entry.parent[entry.key]
    except Exception:  # a resolver only the Hydra process has, a key removed since: keep the text
        return raw


def _get_run_name(output_dir: str) -> str:
    """The run directory's name and its Hydra overrides: ``"1 dataloader.train.sampler.repeat_thresh=0.3"``.

    Overrides of ``train.hooks`` are left out: they add or tune hooks (this tracker among them), they do not
    tell runs apart."""
    overrides = [o for o in read_overrides(output_dir) if not o.lstrip("+~").startswith("train.hooks.")]
    name = " ".join([os.path.basename(os.path.normpath(output_dir)), *overrides])
    return name[:_RUN_NAME_LENGTH]


def _get_sweep_name(sweep_dir: str) -> str:
    """A sweep directory as the user named it: relative to the working directory when it is below it."""
    relative = os.path.relpath(sweep_dir)
    return sweep_dir if relative.startswith("..") else relative


class Tracker(HookBase):
    """Base of the experiment-tracker hooks: when to log what, on the main process only, and errors contained.

    A subclass implements `open_run`, `log_params`, `log_metrics`, `log_files` and `close_run`. The first
    exception any of them raises is logged once (the traceback at DEBUG level, in ``log.txt``); the tracker
    then does nothing more, except a last, silent `close_run`. The run goes on.

    Args:
        output_dir: the run directory (``${train.output_dir}``): its ``config.yaml`` becomes params, its
            plots are uploaded, and trackers keep their local files there.
        period: log metrics every this many iterations (``${train.log_period}`` logs what
            ``metrics.json`` gets, line for line), and at the end.
        artifacts: glob patterns, relative to `output_dir`, of the files uploaded at the end of training.
    """

    def __init__(
        self, output_dir: str, *, period: int = 20, artifacts: Sequence[str] = DEFAULT_ARTIFACTS
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
        self.output_dir = output_dir
        self.period = period
        self.artifacts = list(artifacts)
        self.run_id: str | None = None  # the tracker's id of this run, saved in checkpoints
        self._resume_id: str | None = None
        self._active = False
        self._logged_until = -1  # the last iteration whose metrics the tracker has

    # What a subclass implements.

    def open_run(self, run_id: str | None) -> tuple[str, int]:
        """Start a tracker run, or reopen the run `run_id` (a resumed training run).

        Returns:
            The run's id and the last step it already holds metrics for (-1 for none).
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

    # The hook's moments.

    def before_train(self) -> None:
        if not comm.is_main_process():
            return
        self._active = True
        self._call("starting the run", self._start)

    def after_step(self) -> None:
        if not self._active:
            return
        next_iter = self.trainer.iter + 1
        if next_iter % self.period == 0 or next_iter >= self.trainer.max_iter:
            self._call("logging metrics", self._log_new_metrics)

    def after_train(self) -> None:
        if not comm.is_main_process():
            return
        self._call("logging metrics", self._log_new_metrics)
        self._call("uploading files", lambda: self.log_files(self._get_artifact_paths()))
        if self.run_id is not None:
            self._close(self._get_status())

    def state_dict(self) -> dict:
        return {"run_id": self.run_id} if self.run_id is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self._resume_id = state.get("run_id")

    # Internals.

    def _start(self) -> None:
        self.run_id, last_step = self.open_run(self._resume_id)
        self._logged_until = max(self._logged_until, last_step)
        self.log_params(get_flat_config(self.output_dir), resumed=self._resume_id == self.run_id)

    def _log_new_metrics(self) -> None:
        by_iter = get_scalars_by_iteration(self.trainer.storage, _WINDOW, after=self._logged_until)
        for iteration, metrics in by_iter.items():
            self.log_metrics(metrics, iteration)
            self._logged_until = iteration

    def _get_artifact_paths(self) -> list[str]:
        paths = set()
        for pattern in self.artifacts:
            paths.update(p for p in glob.glob(os.path.join(self.output_dir, pattern)) if os.path.isfile(p))
        return sorted(paths)

    def _get_status(self) -> str:
        if self.trainer.stop_signal:
            return "KILLED"
        return "FINISHED" if self.trainer.iter >= self.trainer.max_iter else "FAILED"

    def _call(self, action: str, function: Callable[[], Any]) -> None:
        """Run `function` unless the tracker is off; its first exception turns the tracker off."""
        if not self._active:
            return
        try:
            function()
        except Exception as e:
            self._active = False
            logger.error(
                "%s: %s failed (%s: %s); tracking is off for the rest of this run, training goes on.",
                type(self).__name__,
                action,
                type(e).__name__,
                e,
            )
            logger.debug("%s: the error's traceback", type(self).__name__, exc_info=True)

    def _close(self, status: str) -> None:
        if self._active:
            self._call("closing the run", lambda: self.close_run(status))
            return
        try:  # after an error: free what the library holds (a service process), quietly
            self.close_run("FAILED")
        except Exception:
            logger.debug("%s: closing the run after an error failed too", type(self).__name__, exc_info=True)
        self._active = False


_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # the tracking URIs of MLflow's SQL store
_MLFLOW_NAME = re.compile(r"[^\w\-. /]")  # MLflow keys: alphanumerics, _ - . space /


def _get_mlflow_key(name: str) -> str:
    return _MLFLOW_NAME.sub("_", name)[:250]


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path + ".lock"``: the jobs of a sweep sharing one SQLite file create its
    tables and the experiment one at a time (MLflow's first-use migration is not safe to race)."""
    import fcntl

    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class MLflowTracker(Tracker):
    """Log the run to MLflow: params, metrics (step = iteration), plots and CSV as artifacts at the end.

    With no `tracking_uri` and no ``MLFLOW_TRACKING_URI``, the store is a SQLite file needing no server:
    ``RUN_DIR/mlflow.db``, or ``SWEEP_DIR/mlflow.db`` shared by the jobs of a sweep; browse it with ``mlflow ui
    --backend-store-uri sqlite:///RUN_DIR/mlflow.db``. Artifacts of a SQLite store go beside it, in ``mlruns/``
    (MLflow's own default is the working directory). The
    experiment is named after the config (``rfs_maskrcnn_demo``) or, for a sweep's jobs, after the sweep
    directory; runs are named after their directory and overrides (``1 train.seed=1``) and tagged
    ``lazytrain.output_dir``. A resumed run reopens the same MLflow run; its params keep the values they
    started with (MLflow params cannot change).

    Args:
        output_dir: the run directory (``${train.output_dir}``).
        period: log metrics every this many iterations, and at the end.
        tracking_uri: e.g. ``http://mlflow.example:5000``, ``sqlite:///path/mlflow.db``, ``databricks``;
            None: ``MLFLOW_TRACKING_URI`` if set, else the SQLite file above. MLflow (>= 3.13) refuses
            ``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``.
        experiment_name: None: the config's name, or the sweep directory for a sweep's jobs.
        run_name: None: the run directory's name and the job's overrides.
        artifacts: glob patterns, relative to `output_dir`, of the files logged at the end.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        period: int = 20,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        run_name: str | None = None,
        artifacts: Sequence[str] = DEFAULT_ARTIFACTS,
    ) -> None:
        super().__init__(output_dir, period=period, artifacts=artifacts)
        modules = ["mlflow"]
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:"
        if uri.split(":")[0].split("+")[0] in _DATABASES:  # mlflow-skinny leaves out its SQL store's packages
            modules += ["sqlalchemy", "alembic"]
        _require_modules("MLflowTracker", "mlflow", modules)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self._client = None

    def _get_store(self, job: HydraJob | None) -> tuple[str, str | None]:
        """(tracking URI, artifact location for a new experiment: None leaves it to MLflow or its server)."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            store_dir = os.path.abspath(job.sweep_dir if job and job.sweep_dir else self.output_dir)
            os.makedirs(store_dir, exist_ok=True)
            uri = "sqlite:///" + os.path.join(store_dir, "mlflow.db")
        if not uri.startswith("sqlite:///"):
            return uri, None
        # MLflow would put a SQLite store's artifacts in ./mlruns of the working directory: keep them beside it.
        store_dir = os.path.dirname(os.path.abspath(uri[len("sqlite:///") :]))
        return uri, "file://" + os.path.join(store_dir, "mlruns")

    def _get_experiment_name(self, job: HydraJob | None) -> str:
        if self.experiment_name:
            return self.experiment_name
        if job is not None and job.sweep_dir:
            return _get_sweep_name(job.sweep_dir)
        return job.name if job is not None else "lazytrain"

    def open_run(self, run_id: str | None) -> tuple[str, int]:
        from mlflow import MlflowClient

        job = read_hydra_job(self.output_dir)
        uri, artifact_location = self._get_store(job)
        local_file = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None
        with _exclusive(local_file) if local_file else contextlib.nullcontext():
            self._client = client = MlflowClient(tracking_uri=uri)
            if run_id is not None and self._has_run(run_id):
                client.update_run(run_id, status="RUNNING")
                logger.info("MLflowTracker: continuing run %s (%s)", run_id, uri)
                return run_id, self._get_last_step(run_id)
            name = self._get_experiment_name(job)
            experiment = client.get_experiment_by_name(name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                experiment_id = client.create_experiment(name, artifact_location=artifact_location)
            tags = {"lazytrain.output_dir": os.path.abspath(self.output_dir)}
            run = client.create_run(
                experiment_id, run_name=self.run_name or _get_run_name(self.output_dir), tags=tags
            )
        logger.info("MLflowTracker: run %s in experiment '%s' (%s)", run.info.run_id, name, uri)
        return run.info.run_id, -1

    def _has_run(self, run_id: str) -> bool:
        try:
            self._client.get_run(run_id)
        except Exception as e:  # MlflowException(RESOURCE_DOES_NOT_EXIST), or another store
            logger.warning("MLflowTracker: cannot reopen run %s (%s); starting a new run.", run_id, e)
            return False
        return True

    def _get_last_step(self, run_id: str) -> int:
        keys = self._client.get_run(run_id).data.metrics
        steps = (metric.step for key in keys for metric in self._client.get_metric_history(run_id, key))
        return max(steps, default=-1)

    def log_params(self, params: Mapping[str, Any], *, resumed: bool) -> None:
        from mlflow.entities import Param

        existing = self._client.get_run(self.run_id).data.params if resumed else {}
        values = {_get_mlflow_key(key): str(value)[:6000] for key, value in params.items()}
        new = [Param(key, value) for key, value in values.items() if key not in existing]
        if new:
            self._client.log_batch(self.run_id, params=new)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(_get_mlflow_key(key), value, now, step) for key, value in metrics.items()]
        self._client.log_batch(self.run_id, metrics=entries)

    def log_files(self, paths: Sequence[str]) -> None:
        for path in paths:
            relative = os.path.dirname(os.path.relpath(path, self.output_dir))
            self._client.log_artifact(self.run_id, path, artifact_path=relative or None)

    def close_run(self, status: str) -> None:
        if self._client is not None:
            self._client.set_terminated(self.run_id, status=status)


_WANDB_MODES = ("online", "offline", "disabled")


def _has_wandb_login() -> bool:
    """Whether W&B has credentials here: ``WANDB_API_KEY``, an identity token file, or a ``wandb login``
    entry in the netrc file for the W&B host (``WANDB_BASE_URL``)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return bool(host) and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker(Tracker):
    """Log the run to Weights & Biases: the flattened config, metrics (step = iteration), plots and CSV.

    Local files go to ``RUN_DIR/wandb/``. Without credentials (no ``WANDB_API_KEY``, no ``wandb login``) the
    run is written offline there; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later. The project
    is named after the config (``rfs_maskrcnn_demo``); a sweep's jobs form one W&B group named after the sweep
    directory; runs are named after their directory and overrides. A resumed run continues the same W&B run
    (``resume="allow"`` with its id; offline, the resumed part is a second local folder with the same id, and
    ``wandb sync`` appends it).

    Args:
        output_dir: the run directory (``${train.output_dir}``).
        period: log metrics every this many iterations, and at the end.
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; None: ``WANDB_MODE`` if set, else online when
            W&B has credentials here and offline otherwise.
        project: None: the config's name. entity: the W&B team or user (None: your default).
        group: None: the sweep directory for a sweep's jobs, no group otherwise.
        name: None: the run directory's name and the job's overrides.
        artifacts: glob patterns, relative to `output_dir`, of the files saved with the run at the end.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        period: int = 20,
        mode: str | None = None,
        project: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        name: str | None = None,
        artifacts: Sequence[str] = DEFAULT_ARTIFACTS,
    ) -> None:
        super().__init__(output_dir, period=period, artifacts=artifacts)
        if mode is not None and mode not in _WANDB_MODES:
            raise ValueError(
                f"WandbTracker(mode=) must be one of {', '.join(map(repr, _WANDB_MODES))} or None (WANDB_MODE, "
                f"else online with credentials and offline without); got {mode!r}"
            )
        _require_modules("WandbTracker", "wandb", ["wandb"])
        self.mode = mode
        self.project = project
        self.entity = entity
        self.group = group
        self.name = name
        self._run = None

    def get_mode(self) -> str | None:
        """The mode passed to ``wandb.init`` (None: wandb reads ``WANDB_MODE``)."""
        if self.mode is not None:
            return self.mode
        if os.environ.get("WANDB_MODE"):
            return None
        if _has_wandb_login():
            return "online"
        logger.info(
            "WandbTracker: no W&B credentials (WANDB_API_KEY, wandb login): writing the run offline under "
            "%s; upload it with `wandb sync %s`.",
            os.path.join(self.output_dir, "wandb"),
            os.path.join(self.output_dir, "wandb", "offline-run-*"),
        )
        return "offline"

    def open_run(self, run_id: str | None) -> tuple[str, int]:
        import wandb

        job = read_hydra_job(self.output_dir)
        group = self.group or (_get_sweep_name(job.sweep_dir) if job is not None and job.sweep_dir else None)
        self._run = wandb.init(
            project=self.project or (job.name if job is not None else "lazytrain"),
            entity=self.entity,
            group=group,
            name=self.name or _get_run_name(self.output_dir),
            dir=self.output_dir,
            mode=self.get_mode(),
            id=run_id,
            resume="allow" if run_id is not None else None,
        )
        # A resumed online run knows the next step; offline it starts at 0.
        return self._run.id, self._run.step - 1

    def log_params(self, params: Mapping[str, Any], *, resumed: bool) -> None:
        self._run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_files(self, paths: Sequence[str]) -> None:
        # Copied into the W&B run's folder, then saved from there: an offline run folder is complete on its
        # own, and saving files already in place prints no link warning per file.
        for path in paths:
            target = os.path.join(self._run.dir, os.path.relpath(path, self.output_dir))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(path, target)
            self._run.save(target, base_path=self._run.dir, policy="end")

    def close_run(self, status: str) -> None:
        import wandb

        if self._run is None:
            return
        if status == "KILLED":
            self._run.mark_preempting()
        self._run.finish(exit_code=0 if status == "FINISHED" else 1)
        self._run = None
        if wandb.run is None:  # no other run in this process: stop wandb's service process now
            wandb.teardown()
