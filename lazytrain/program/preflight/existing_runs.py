"""A new run must not land on an earlier one: checked before Hydra creates or writes any directory.

Training in a directory that holds a run would overwrite its weights, ``config.yaml`` and ``last_checkpoint``
(its ``metrics.json`` would be set aside as ``metrics.earlier-N.json``). Continuing it is
``train.resume=true``; a job its launcher started again (a requeued SLURM job, restarted torchrun workers)
resumes by itself (`lazytrain.program.job_config`). Evaluating
(``train.eval_only``) into a folder that holds a run or an earlier evaluation would replace its ``config.yaml``
and append to its ``metrics.json``, whatever ``train.resume`` says (a resumed run's ``config.yaml`` holds
``resume: true``): an evaluation goes into a new folder of the run's ``eval/``. An evaluation started from a
trained run's ``config.yaml`` must name the weights it evaluates: the saved ``train.init_checkpoint`` is where
the training started (ImageNet, random), not what it trained.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from lazytrain.launch.environment import get_restart_count
from lazytrain.program.run_report import EVAL_FOLDER, EVAL_FOLDER_NAME

__all__ = ["find_existing_run_problems", "find_unnamed_run_weights_problems"]

# Files every training run writes early; any of them means a run was there.
RUN_FILES = ("last_checkpoint", "metrics.json", "model_final.pth")
TRAINED_RUN_FILES = ("last_checkpoint", "model_final.pth")  # not in an evaluation's folder


def find_existing_run_problems(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """A line when ``hydra.run.dir`` (or a job folder of ``hydra.sweep.dir``) on the command line holds an
    earlier run and this one would train there from scratch; for an evaluation (``train.eval_only``), a line
    for each of its folders (``hydra.run.dir``, a fixed ``train.output_dir``) that holds a run or an earlier
    evaluation. None otherwise.

    Args:
        cfg: the config with the command line's plain overrides applied.
        overrides: the command line after CONFIG.
    """
    train = cfg.get("train") or {}
    given = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides if "=" in o}
    sweep = bool({"-m", "--multirun"}.intersection(overrides))
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    if get_restart_count() is not None:
        return []  # the job itself, started again into its own folder
    if train.get("eval_only", False):  # before resume: a resumed run's config.yaml says resume: true
        return _find_evaluation_folder_problems(train, given, key, sweep)
    if train.get("resume", False):
        return []
    value = given.get(key)
    if value is None or "${" in value or not os.path.isdir(value):
        return []  # Hydra's default folders are new for every run (named by the time)
    found = _find_run_file(value, sweep, RUN_FILES)
    if found is None:
        return []
    what = "the jobs of an earlier sweep" if sweep else "an earlier run"
    return [
        f"{key}={value}: holds {what} ({found}); training there from scratch would overwrite its weights "
        f"and checkpoints. Continue it with train.resume=true, or choose another {key} (or delete the "
        "folder to start over)."
    ]


def _find_evaluation_folder_problems(
    train: DictConfig, given: dict[str, str], key: str, sweep: bool
) -> list[str]:
    folders = {key: given.get(key)}
    # A fixed train.output_dir (on the command line or in the file) is where the evaluation writes.
    output_dir = (
        OmegaConf.to_container(train, resolve=False).get("output_dir")
        if isinstance(train, DictConfig)
        else None
    )
    if isinstance(output_dir, str) and "${" not in output_dir and output_dir not in ("", "./output"):
        folders["train.output_dir"] = output_dir
    problems = []
    for name, value in folders.items():
        if value is None or "${" in value or not os.path.isdir(value):
            continue
        found = _find_run_file(value, sweep and name == key, RUN_FILES)
        if found is not None:
            problems.append(_describe_evaluation_over_run(name, value, found, sweep and name == key))
    return problems


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
    """The line for ``train.eval_only`` into a folder that holds a run or an earlier evaluation: its
    ``config.yaml`` would be replaced by the evaluation's and its ``metrics.json`` appended to."""
    if os.path.basename(found) == "metrics.json" and not any(
        os.path.exists(os.path.join(os.path.dirname(found), name)) for name in TRAINED_RUN_FILES
    ):
        return (
            f"{key}={value}: holds an earlier evaluation ({found}); another there would replace its config.yaml "
            f"and append to its metrics.json. Choose another hydra.run.dir (a new folder) for this evaluation."
        )
    run = os.path.dirname(found) if sweep else value
    where = os.path.join(run, EVAL_FOLDER, EVAL_FOLDER_NAME)
    fix = f"'hydra.run.dir={where}' (what the run's closing block prints)"
    if key == "train.output_dir":  # the config's train.output_dir wins over hydra.run.dir
        fix += " and 'train.output_dir=${hydra:runtime.output_dir}'"
    return (
        f"{key}={value}: holds a run ({found}); an evaluation there would replace its config.yaml and mix its "
        f"metrics.json. Evaluate into a folder of its own: {fix}."
    )


def find_unnamed_run_weights_problems(
    cfg: DictConfig, overrides: list[str], config_file: str | None
) -> list[str]:
    """A line when an evaluation (``train.eval_only``) starts from a trained run's ``config.yaml`` (its folder
    holds ``model_final.pth`` or ``last_checkpoint``) and ``train.init_checkpoint`` is neither given on the
    command line nor a file of that run: it would evaluate the weights the training started from.

    Args:
        cfg: the config with the command line's plain overrides applied.
        overrides: the command line after CONFIG.
        config_file: the CONFIG file (None: not known).
    """
    train = cfg.get("train") or {}
    if config_file is None or not train.get("eval_only", False):
        return []
    if any(o.lstrip("+").split("=", 1)[0] == "train.init_checkpoint" for o in overrides if "=" in o):
        return []  # the user named the weights
    run = os.path.dirname(os.path.abspath(config_file))
    trained = [
        name for name in ("model_final.pth", "last_checkpoint") if os.path.isfile(os.path.join(run, name))
    ]
    if not trained:
        return []
    weights = str(OmegaConf.to_container(train, resolve=False).get("init_checkpoint") or "")
    if weights and "${" not in weights and os.path.abspath(weights).startswith(run + os.sep):
        return []
    evaluated = weights or "no weights (random initialisation)"
    folder = os.path.dirname(config_file)
    name = "model_final.pth" if trained[0] == "model_final.pth" else _read_last_checkpoint(run)
    return [
        f"train.eval_only=true with {config_file}, the config of the trained run in {run} ({trained[0]}): "
        f"its train.init_checkpoint is where the training started ({evaluated}), not what it trained. Name the "
        f"weights to evaluate: train.init_checkpoint={os.path.join(folder, name)}."
    ]


def _read_last_checkpoint(run: str) -> str:
    """The checkpoint file ``last_checkpoint`` names (``model_final.pth`` when it cannot be read)."""
    try:
        with open(os.path.join(run, "last_checkpoint"), encoding="utf-8") as f:
            return f.read().strip() or "model_final.pth"
    except OSError:
        return "model_final.pth"
