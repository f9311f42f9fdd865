"""A new run must not land on an earlier one: checked before Hydra creates or writes any directory.

Training in a directory that holds a run would overwrite its weights, ``config.yaml`` and ``last_checkpoint``
and append to its ``metrics.json``. Continuing it is ``train.resume=true``; a job its launcher started again (a
requeued SLURM job, restarted torchrun workers) resumes by itself (`lazytrain.program.job_config`). Evaluating
there (``train.eval_only``) would replace its ``config.yaml`` and mix its ``metrics.json``: an evaluation goes
into a folder of the run's ``eval/``.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from lazytrain.launch.environment import get_restart_count
from lazytrain.program.run_report import EVAL_FOLDER

__all__ = ["find_existing_run_problems"]

# Files every training run writes early; any of them means a run was there.
RUN_FILES = ("last_checkpoint", "metrics.json", "model_final.pth")
TRAINED_RUN_FILES = ("last_checkpoint", "model_final.pth")  # not in an evaluation's folder


def find_existing_run_problems(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """A line when ``hydra.run.dir`` (or a job folder of ``hydra.sweep.dir``) on the command line holds an
    earlier run and this one would train there from scratch, or evaluate there (``train.eval_only``) over a
    trained run's files (none otherwise).

    Args:
        cfg: the config with the command line's plain overrides applied.
        overrides: the command line after CONFIG.
    """
    train = cfg.get("train") or {}
    if train.get("resume", False) or get_restart_count() is not None:
        return []
    given = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides if "=" in o}
    sweep = bool({"-m", "--multirun"}.intersection(overrides))
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    value = given.get(key)
    if value is None or "${" in value or not os.path.isdir(value):
        return []  # Hydra's default folders are new for every run (named by the time)
    if train.get("eval_only", False):
        # An earlier evaluation's folder (metrics.json only) may take another; a training's may not.
        found = _find_run_file(value, sweep, TRAINED_RUN_FILES)
        return [_describe_evaluation_over_run(key, value, found, sweep)] if found else []
    found = _find_run_file(value, sweep, RUN_FILES)
    if found is None:
        return []
    what = "the jobs of an earlier sweep" if sweep else "an earlier run"
    return [
        f"{key}={value}: holds {what} ({found}); training there from scratch would overwrite its weights "
        f"and mix its metrics. Continue it with train.resume=true, or choose another {key} (or delete the "
        "folder to start over)."
    ]


def _find_run_file(folder: str, sweep: bool, names: tuple[str, ...]) -> str | None:
    folders = [folder]
    if sweep:
        folders = [os.path.join(folder, name) for name in sorted(os.listdir(folder)) if name.isdigit()]
    for run in folders:
        for name in names:
            if os.path.exists(os.path.join(run, name)):
                return os.path.join(run, name)
    return None


def _describe_evaluation_over_run(key: str, value: str, found: str, sweep: bool) -> str:
    """The line for ``train.eval_only`` into a folder that holds a run: its ``config.yaml`` would be replaced by
    the evaluation's and its ``metrics.json`` mixed with it."""
    where = os.path.join(os.path.dirname(found) if sweep else value, EVAL_FOLDER, "${now:%Y-%m-%d_%H-%M-%S}")
    return (
        f"{key}={value}: holds a run ({found}); an evaluation there would replace its config.yaml and mix its "
        f"metrics.json. Evaluate into a folder of its own: 'hydra.run.dir={where}' (what the run's closing block "
        "prints)."
    )
