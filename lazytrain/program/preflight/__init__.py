"""Every check that runs before a run starts, so that bad input ends in one paragraph naming the key, the file
and the fix (a `ConfigError`) instead of a traceback from deep inside, and nothing is written or spawned.

Two entry points, one per moment:

- `check_command_line(cfg, overrides)`: before Hydra starts (so before it creates a directory): unknown keys
  in the overrides, what a search sweeper needs, the run and sweep directories, and the json data sets with
  every value the command line gives them (each value of a grid sweep too).
- `preflight(cfg)`: in each Hydra job, on its resolved config, before any process starts: the config's
  structure (`lazytrain.config.validate`), the ``launch.*`` values and GPU count, the batch settings (gradient
  accumulation, LR scaling), the torch backend settings, the built-in data sets on disk, and the checkpoint the run starts from. Returns
  every problem at once.

Modules: `command_line` (overrides, output directories), `json_data` (a user's COCO/LVIS json), `builtin_data`
(``coco_2017_*``, ``lvis_v1_*``), `checkpoints`, `processes` (``launch.*``), `batch` (``train.images_per_forward``,
``train.auto_scale_lr``), `backends` (``train.cudnn_benchmark``, ``train.float32_matmul_precision``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from lazytrain.config import validate
from lazytrain.errors import ConfigError
from lazytrain.program.job_plan import get_processes_per_machine
from lazytrain.program.objective import check_search, get_search_sweeper
from lazytrain.program.preflight.backends import find_backend_problems
from lazytrain.program.preflight.batch import find_batch_problems
from lazytrain.program.preflight.builtin_data import find_missing_data
from lazytrain.program.preflight.checkpoints import find_checkpoint_problems
from lazytrain.program.preflight.command_line import (
    apply_plain_overrides,
    check_output_dirs,
    iter_swept_values,
)
from lazytrain.program.preflight.json_data import find_swept_json_dataset_problems
from lazytrain.program.preflight.processes import find_launch_problems

__all__ = ["INFO_FLAGS", "check_command_line", "preflight", "raise_problems"]

# Flags that make Hydra print something and exit without running a job: the data need not exist.
INFO_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion"}


def check_command_line(cfg: DictConfig, overrides: list[str], default_main: str) -> None:
    """Check the command line before Hydra starts (what it adds for a search sweeper is planned by the entry
    point: `lazytrain.program.objective.get_search_overrides`).

    Args:
        cfg: the primary config (the loaded CONFIG file with the launch defaults, without Hydra's node).
        overrides: the command line after CONFIG (Hydra overrides and flags).
        default_main: the default per-rank program (the only one whose hooks are checked for an EvalHook).

    Raises:
        ConfigError: naming every problem found.
    """
    overridden = apply_plain_overrides(cfg, overrides)
    check_search(overridden, overrides, default_main)
    check_output_dirs(overrides)
    if not INFO_FLAGS.intersection(overrides):
        raise_problems(_find_command_line_json_problems(overridden, overrides))


def _find_command_line_json_problems(cfg: DictConfig, overrides: list[str]) -> list[str]:
    multirun = bool({"-m", "--multirun"}.intersection(overrides))
    # A search sweeper, or a sweep declared in hydra.sweeper.params, may set a data set's path per trial.
    set_per_trial = get_search_sweeper(overrides) is not None or any(
        o.lstrip("+").startswith("hydra.sweeper.params") for o in overrides
    )
    swept = list(iter_swept_values(overrides)) if multirun else []
    problems = find_swept_json_dataset_problems(cfg, swept, skip_unset=multirun and set_per_trial)
    if not problems:
        return []
    return ["the data set files have problems:\n  " + "\n  ".join(problems)]


def preflight(cfg: DictConfig, injected: dict[str, tuple[str, ...]]) -> list[str]:
    """Every problem of a job's resolved config, one paragraph each (none: the run may start).

    Args:
        cfg: the job's config, resolved (`lazytrain.program.job_config.prepare_job_config`).
        injected: arguments the program passes at instantiation time (not missing from the config).
    """
    problems = _problems_raised_by(validate, cfg, injected)
    launch_problems = find_launch_problems(cfg.launch)
    # The process count needs valid launch values, and the batch check needs the process count.
    count_problems = launch_problems or _problems_raised_by(get_processes_per_machine, cfg)
    problems += count_problems or find_batch_problems(cfg)
    problems += find_backend_problems(cfg)
    missing = find_missing_data(cfg)
    if missing:
        problems.append("\n".join(missing))
    return problems + find_checkpoint_problems(cfg)


def _problems_raised_by(check: Callable[..., Any], *args: Any) -> list[str]:
    """The message of the `ConfigError` `check` raises (a check that also computes a value), or none."""
    try:
        check(*args)
    except ConfigError as e:
        return [str(e)]
    return []


def raise_problems(problems: list[str]) -> None:
    """Raise one `ConfigError` holding every problem (a paragraph each), if there is any."""
    if problems:
        raise ConfigError("\n".join(problems))
