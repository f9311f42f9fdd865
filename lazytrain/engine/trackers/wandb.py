"""`WandbTracker`: a run's config, metrics and files in Weights & Biases, written offline into the run
directory when this machine has no W&B credentials."""

from __future__ import annotations

import logging
import netrc
import os
import shutil
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from lazytrain.engine.trackers.base import DEFAULT_ARTIFACTS, Tracker
from lazytrain.engine.trackers.delivery import TrackingLost
from lazytrain.engine.trackers.run_info import get_run_name, get_sweep_name
from lazytrain.utils.optional_imports import check_optional, import_optional
from lazytrain.utils.run_dirs import read_hydra_job

__all__ = ["WANDB_MODES", "WandbTracker", "has_wandb_login"]

logger = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")


def has_wandb_login() -> bool:
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
    run is written offline there; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later (the end of the
    run names the folder, or says that it was deleted during the run). The project is named after the config
    (``rfs_maskrcnn_demo``); a sweep's jobs form one W&B group named after the sweep directory; runs are named
    after their directory and overrides. A resumed run continues the same W&B run (``resume="allow"`` with its
    id; offline, the resumed part is a second local folder with the same id, and ``wandb sync`` appends it).

    W&B keeps one increasing step per run: online, a resumed run cannot add to a step the run already has, so
    the values of such a step (the evaluation a stopped run left pending) go to the run's summary, with a line
    saying so.

    Args:
        output_dir: the run directory (``${train.output_dir}``).
        period: log metrics every this many iterations, and at the end.
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; None: ``WANDB_MODE`` if set, else online when
            W&B has credentials here and offline otherwise.
        project: None: the config's name. entity: the W&B team or user (None: your default).
        group: None: the sweep directory for a sweep's jobs, no group otherwise.
        name: None: the run directory's name and the job's overrides.
        artifacts: glob patterns, relative to `output_dir`, of the files saved with the run at the end.
        timeout: seconds rank 0 waits for one batch of W&B calls (`Tracker`).
        retry_for: seconds of failures after which the tracker gives up (`Tracker`).
    """

    library_loggers = ("wandb",)

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
        timeout: float = 30.0,
        retry_for: float = 600.0,
    ) -> None:
        super().__init__(output_dir, period=period, artifacts=artifacts, timeout=timeout, retry_for=retry_for)
        if mode is not None and mode not in WANDB_MODES:
            raise ValueError(
                f"WandbTracker(mode=) must be one of {', '.join(map(repr, WANDB_MODES))} or None (WANDB_MODE, "
                f"else online with credentials and offline without); got {mode!r}"
            )
        check_optional("WandbTracker", ("wandb",), "wandb")
        self.mode = mode
        self.project = project
        self.entity = entity
        self.group = group
        self.name = name
        self._run = None
        self._run_folder = ""  # the run's local folder (offline: what `wandb sync` uploads)
        self._offline = False
        self._told_summary = False

    def get_mode(self) -> str | None:
        """The mode passed to ``wandb.init`` (None: wandb reads ``WANDB_MODE``)."""
        if self.mode is not None:
            return self.mode
        if os.environ.get("WANDB_MODE"):
            return None
        if has_wandb_login():
            return "online"
        logger.info(
            "WandbTracker: no W&B credentials (WANDB_API_KEY, wandb login): writing the run offline under "
            "%s; upload it with `wandb sync %s`.",
            os.path.join(self.output_dir, "wandb"),
            os.path.join(self.output_dir, "wandb", "offline-run-*"),
        )
        return "offline"

    def prepare(self) -> None:
        import_optional("wandb", component="WandbTracker", extra="wandb")

    def open_run(self, run_id: str | None) -> tuple[str, Mapping[str, int]]:
        import wandb

        job = read_hydra_job(self.output_dir)
        group = self.group or (get_sweep_name(job.sweep_dir) if job is not None and job.sweep_dir else None)
        self._run = wandb.init(
            project=self.project or (job.name if job is not None else "lazytrain"),
            entity=self.entity,
            group=group,
            name=self.name or get_run_name(self.output_dir),
            dir=self.output_dir,
            mode=self.get_mode(),
            id=run_id,
            resume="allow" if run_id is not None else None,
        )
        self._run_folder = os.path.dirname(self._run.dir)
        self._offline = bool(self._run.offline)
        # W&B itself refuses steps it already has (online) and starts a resumed offline part at 0: nothing to
        # leave out here.
        return self._run.id, {}

    def log_params(self, params: Mapping[str, Any], *, resumed: bool) -> None:
        self._run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._check_run_folder()
        if step >= self._run.step:
            self._run.log(dict(metrics), step=step)
            return
        self._run.summary.update(dict(metrics))
        if not self._told_summary:
            self._told_summary = True
            logger.info(
                "WandbTracker: W&B takes no step below the run's current step %d: the values of iteration %d "
                "(%s) went to the run's summary.",
                self._run.step,
                step,
                ", ".join(sorted(metrics)),
            )

    def _silence_footer(self) -> None:
        """W&B ends a run by printing its history and the `wandb sync` command for its folder: not when the
        folder is gone (this tracker has said so). W&B reads the run's settings when it prints; there is no
        public way to change them after ``wandb.init``."""
        try:
            self._run._settings.silent = True
        except Exception:  # another W&B version: its lines are printed, nothing worse
            logger.debug("WandbTracker: could not silence W&B's closing lines", exc_info=True)

    def _check_run_folder(self) -> None:
        """An offline run whose folder was deleted keeps nothing: say so instead of writing into nowhere."""
        if self._offline and not os.path.isdir(self._run_folder):
            raise TrackingLost(f"the offline run folder {self._run_folder} was deleted during the run")

    def log_files(self, paths: Sequence[str]) -> None:
        self._check_run_folder()
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
        if self._offline and not os.path.isdir(self._run_folder):
            self._silence_footer()
        if status == "KILLED":
            self._run.mark_preempting()
        self._run.finish(exit_code=0 if status == "FINISHED" else 1)
        self._run = None
        if wandb.run is None:  # no other run in this process: stop wandb's service process now
            wandb.teardown()
        self._check_run_folder()

    def describe_run(self) -> str:
        if self._offline and not os.path.isdir(self._run_folder):
            return f"offline run {self.run_id}, whose folder {self._run_folder} was deleted during the run"
        if self._offline:
            return (
                f"offline run {self.run_id} in {self._run_folder} (upload it: wandb sync {self._run_folder})"
            )
        return f"run {self.run_id}"

    def get_local_files(self) -> list[tuple[str, str]]:
        folder = os.path.join(self.output_dir, "wandb")
        if not os.path.isdir(folder):
            return []
        if self._offline and not os.path.isdir(self._run_folder):
            return [
                ("wandb/", "W&B's local files; this run's offline folder was deleted (see Tracking above)")
            ]
        if self._offline:
            relative = os.path.relpath(self._run_folder, self.output_dir)
            return [
                ("wandb/", f"W&B's offline run ({relative}): upload it with wandb sync {self._run_folder}")
            ]
        return [("wandb/", "W&B's local files (logs, the run's files)")]
