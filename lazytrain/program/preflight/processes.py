"""The ``launch.*`` values that decide how many processes a job starts and the program they run
(``launch.main``): checked before anything is spawned, so that a bad count or a program that does not import
ends in one line naming the key (the count itself is the job's plan: `lazytrain.program.job_plan`)."""

from __future__ import annotations

import difflib

from omegaconf import DictConfig

from lazytrain.config import locate
from lazytrain.launch.launch import parse_timeout
from lazytrain.program.primary_config import DEFAULT_MAIN, LAUNCH_DEFAULTS

__all__ = ["find_launch_problems"]


def find_launch_problems(launch_cfg: DictConfig) -> list[str]:
    """The per-rank program must import, and process counts, the machine rank and the timeout be usable (one
    message per bad key); ``launch`` holds no key but those of `LAUNCH_DEFAULTS` (a misspelled one added with
    ``+`` would otherwise be ignored)."""
    problems = [_unknown_key_problem(key) for key in launch_cfg if key not in LAUNCH_DEFAULTS]
    main = launch_cfg.get("main")
    try:
        locate(main)
    except ImportError as e:
        problems.append(
            f"launch.main={main}: {e}. It names the function each rank runs (default: {DEFAULT_MAIN})."
        )
    for key in ("num_processes", "num_machines"):
        value = launch_cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"launch.{key}={value}: must be an integer >= 1.")
    try:
        if launch_cfg.get("timeout") is not None:
            parse_timeout(launch_cfg.timeout)
    except ValueError as e:
        problems.append(str(e))
    rank, machines = launch_cfg.get("machine_rank"), launch_cfg.get("num_machines")
    if any(p.startswith("launch.num_machines") for p in problems):
        return problems  # the rank's range is unknown
    if not isinstance(rank, int) or not 0 <= rank < machines:
        problems.append(
            f"launch.machine_rank={rank}: must be in [0, launch.num_machines - 1] = [0, {machines - 1}]."
        )
    return problems


def _unknown_key_problem(key: str) -> str:
    close = difflib.get_close_matches(str(key), list(LAUNCH_DEFAULTS), n=1)
    hint = f"Did you mean launch.{close[0]}? " if close else ""
    return f"launch.{key}: not a launch key, so it would change nothing. {hint}launch takes {', '.join(LAUNCH_DEFAULTS)}."
