"""Every check that runs before a run starts, so that bad input ends in one paragraph naming the key, the file
and the fix (a `ConfigError`) instead of a traceback from deep inside, and nothing is written or spawned.

Two entry points, one per moment:

- `check_command_line(cfg, overrides, ...)`: before Hydra starts (so before it creates the run or sweep
  directory): unknown keys in the overrides, what a search sweeper needs, the run and sweep directories, the
  json data sets with every value the command line gives them, and `preflight` of the config as the command
  line makes it (for a sweep, with each value a grid sweep gives each key); first, a plain value given to a
  key whose node builds an object (``copy_paste=rare`` for ``copy_paste.mode=rare``). A check that needs a
  value only the Hydra job knows (``${hydra:...}``: the run directory a resumed run reads) is left to the job.
- `preflight(cfg)`: in each Hydra job, on its resolved config, before any process starts: the config's
  structure (`lazytrain.config.find_problems`, a line each), values its components would refuse (`components`), the
  ``launch.*`` values and GPU count, the batch settings (gradient accumulation, LR scaling), the torch backend
  settings, the built-in data sets on disk, ``model.num_classes`` against the train data's categories where
  they are known unloaded, and the checkpoint the run starts from. Returns every problem at
  once.

Modules: `command_line` (overrides, output directories), `json_data` (a user's COCO/LVIS json), `builtin_data`
(``coco_2017_*``, ``lvis_v1_*``), `num_classes` (``model.num_classes`` against the train data), `checkpoints`, `processes` (``launch.*``), `batch` (``train.images_per_forward``,
``train.auto_scale_lr``, a `MixtureTrainingSampler`'s ratios and batch), `backends` (``train.cudnn_benchmark``,
``train.float32_matmul_precision``), `components` (``train.ema``, a W&B tracker's mode, a timm backbone's model
name).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import InterpolationResolutionError

from lazytrain.config import LazyConfig, find_problems
from lazytrain.errors import ConfigError
from lazytrain.program.job_plan import get_processes_per_machine
from lazytrain.program.objective import check_search, get_search_sweeper
from lazytrain.program.preflight.backends import find_backend_problems
from lazytrain.program.preflight.batch import find_batch_problems
from lazytrain.program.preflight.builtin_data import find_missing_data
from lazytrain.program.preflight.checkpoints import find_checkpoint_problems
from lazytrain.program.preflight.command_line import (
    apply_plain_overrides,
    find_node_replaced_by_value_problems,
    find_output_dir_problems,
    iter_sweep_overrides,
    iter_swept_values,
)
from lazytrain.program.preflight.components import find_component_problems
from lazytrain.program.preflight.existing_runs import (
    find_existing_run_problems,
    find_unnamed_run_weights_problems,
)
from lazytrain.program.preflight.json_data import find_swept_json_dataset_problems
from lazytrain.program.preflight.num_classes import find_num_classes_problems
from lazytrain.program.preflight.processes import find_launch_problems

__all__ = ["INFO_FLAGS", "check_command_line", "find_swept_job_problems", "preflight", "raise_problems"]

# Flags that make Hydra print something and exit without running a job: the data need not exist.
INFO_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion"}


def check_command_line(
    cfg: DictConfig,
    overrides: list[str],
    default_main: str,
    injected: Mapping[str, tuple[str, ...]],
    config_file: str | None = None,
) -> None:
    """Check the command line before Hydra starts (what it adds for a search sweeper is planned by the entry
    point: `lazytrain.program.objective.get_search_overrides`).

    Args:
        cfg: the primary config (the loaded CONFIG file with the launch defaults, without Hydra's node).
        overrides: the command line after CONFIG (Hydra overrides and flags).
        default_main: the default per-rank program (the only one whose hooks are checked for an EvalHook).
        injected: arguments the program passes at instantiation time (as `preflight`'s).
        config_file: the CONFIG file, when known: an evaluation from a trained run's ``config.yaml`` must name
            the weights it evaluates.

    Raises:
        ConfigError: naming every problem found, a line each: the values' first, then the run folders'.
    """
    overridden = apply_plain_overrides(cfg, overrides)
    # First and alone: the other checks would read the value where they expect the node's arguments.
    raise_problems(find_node_replaced_by_value_problems(cfg, overrides))
    check_search(overridden, overrides, default_main)
    # Reported with the values' problems, after them: a user who follows a folder's advice (train.resume=true,
    # another folder) must not meet a bad value only then.
    folders = find_output_dir_problems(overrides) + find_existing_run_problems(overridden, overrides)
    folders += find_unnamed_run_weights_problems(overridden, overrides, config_file)
    if INFO_FLAGS.intersection(overrides):
        raise_problems(folders)
        return
    problems = _find_command_line_json_problems(overridden, overrides)
    problems += find_swept_job_problems(overridden, overrides, injected)
    raise_problems(list(dict.fromkeys(problems + folders)))


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


def preflight(
    cfg: DictConfig, injected: Mapping[str, tuple[str, ...]], *, before_hydra: bool = False
) -> list[str]:
    """Every problem of a job's config, one paragraph each (none: the run may start).

    Args:
        cfg: the job's config, resolved (`lazytrain.program.job_config.prepare_job_config`), or as the command
            line makes it (`before_hydra`).
        injected: arguments the program passes at instantiation time (not missing from the config).
        before_hydra: `cfg` is not resolved yet: a check that needs a value only the Hydra job knows
            (``${hydra:...}``) finds nothing; the job's preflight runs it.
    """
    run = functools.partial(_run_check, before_hydra=before_hydra)
    problems = run(find_problems, cfg, injected) + run(find_component_problems, cfg)
    launch_problems = run(find_launch_problems, cfg.launch)
    # The process count needs valid launch values, and the batch check needs the process count.
    count_problems = launch_problems or run(_problems_raised_by, get_processes_per_machine, cfg)
    problems += count_problems or run(find_batch_problems, cfg)
    problems += run(find_backend_problems, cfg)
    missing = run(find_missing_data, cfg)
    if missing:
        problems.append("\n".join(missing))
    problems += run(find_num_classes_problems, cfg)
    return problems + run(find_checkpoint_problems, cfg)


def _run_check(check: Callable[..., list[str]], *args: Any, before_hydra: bool) -> list[str]:
    try:
        return check(*args)
    except InterpolationResolutionError:
        if before_hydra:  # a value only the Hydra job resolves (a broken reference is validate's problem)
            return []
        raise


def _problems_raised_by(check: Callable[..., Any], *args: Any) -> list[str]:
    """The message of the `ConfigError` `check` raises (a check that also computes a value), or none."""
    try:
        check(*args)
    except ConfigError as e:
        return [str(e)]
    return []


def find_swept_job_problems(
    cfg: DictConfig, overrides: list[str], injected: Mapping[str, tuple[str, ...]]
) -> list[str]:
    """`preflight` before Hydra, of the config each job of the command line would get: the config itself for
    a single run; for a sweep, the config with each value of each listable swept key (the other swept keys at
    their first value). Problems of keys a search sweeper sets per trial are left to the jobs.

    Args:
        cfg: the config with the command line's plain overrides applied.
        overrides: the command line after CONFIG.
        injected: as `preflight`'s.
    """
    if not {"-m", "--multirun"}.intersection(overrides):
        return preflight(cfg, injected, before_hydra=True)
    if any(o.lstrip("+").startswith("hydra.sweeper.params") for o in overrides):
        return []  # the swept keys are in the sweeper's own config: the jobs check them
    swept, unlisted = {}, set()
    for key, override in iter_sweep_overrides(overrides):
        if override.is_choice_sweep() or override.is_range_sweep():
            prefix = "++" if override.is_force_add() else "+" if override.is_add() else ""
            swept[prefix + key] = list(override.sweep_string_iterator())
        else:
            unlisted.add(key)  # a search space: the sweeper draws its values
    first = {key: values[0] for key, values in swept.items() if values}
    # Each later value replaces its key's first one (a `+key` may be added once only).
    choices = [first] + [{**first, key: value} for key, values in swept.items() for value in values[1:]]
    variants = [[f"{key}={value}" for key, value in choice.items()] for choice in choices]
    problems: list[str] = []
    for variant in variants:
        config = LazyConfig.apply_overrides(cfg.copy(), variant) if variant else cfg
        problems += preflight(config, injected, before_hydra=True)
    return [p for p in dict.fromkeys(problems) if not _is_about(p, unlisted)]


def _is_about(problem: str, keys: set[str]) -> bool:
    """Whether `problem` (a line starting with its key path) is about one of `keys` or a key under them."""
    return any(re.match(rf"(  - )?{re.escape(key)}([.=:\[]|$)", problem) for key in keys)


def raise_problems(problems: list[str]) -> None:
    """Raise one `ConfigError` holding every problem (a paragraph each), if there is any."""
    if problems:
        raise ConfigError("\n".join(problems))
