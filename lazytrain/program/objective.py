"""What a sweep optimises: the config's ``objective`` node and the one number a Hydra job returns.

A config declares ``objective = dict(metric="segm/APr", direction="maximize")``: ``metric`` is a key of the
flattened final evaluation results (``task/name`` as in ``metrics.json``), ``direction`` is ``maximize`` or
``minimize``. Override it like any value (``objective.metric=bbox/AP``). Each job returns that metric as a
float, which is what Hydra's search sweepers (Optuna, Nevergrad, Ax) read; the grid sweeper ignores it.

A failed or diverged job returns the worst value for the direction (``-inf`` when maximising, ``+inf`` when
minimising) as a `FailedJobValue`: a sweeper records a bad trial and goes on searching. Not NaN: the Optuna
sweeper (hydra-optuna-sweeper 1.3 with optuna 2.x) stops the whole search on a NaN return.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from lazytrain.errors import ConfigError

__all__ = [
    "DIRECTIONS",
    "FailedJobValue",
    "check_objective",
    "get_job_value",
    "get_objective_value",
    "get_sweeper_direction_overrides",
    "is_sweep_job",
    "worst_value",
]

logger = logging.getLogger(__name__)

DIRECTIONS = ("maximize", "minimize")

# How each search sweeper is told the direction (each defaults to minimising). Keyed by the name given in
# ``hydra/sweeper=NAME``; a sweeper not listed here gets no override (pass its direction flag yourself).
_DIRECTION_OVERRIDES = {
    "optuna": lambda maximize: [f"hydra.sweeper.direction={'maximize' if maximize else 'minimize'}"],
    "nevergrad": lambda maximize: [f"hydra.sweeper.optim.maximize={str(maximize).lower()}"],
    "ax": lambda maximize: [f"hydra.sweeper.ax_config.experiment.minimize={str(not maximize).lower()}"],
}


class FailedJobValue(float):
    """The return value of a failed job: the worst objective value (a float), with the failure's reason.

    Args:
        value: the worst value for the objective's direction (NaN when the config has no objective).
        reason: one line saying why the job failed (shown in the sweep summary's log).
    """

    reason: str

    def __new__(cls, value: float, reason: str) -> FailedJobValue:
        instance = super().__new__(cls, value)
        instance.reason = reason
        return instance

    def __reduce__(self) -> tuple:
        # Launchers (joblib, submitit) pickle job returns; keep the reason across processes.
        return (FailedJobValue, (float(self), self.reason))

    def __repr__(self) -> str:
        return f"FailedJobValue({float(self)!r}, {self.reason!r})"


def check_objective(objective: Any) -> dict[str, str]:
    """Validate an ``objective`` config node and return it as ``{"metric": ..., "direction": ...}``.

    Raises:
        ConfigError: naming ``objective.metric`` / ``objective.direction``, what was expected and what was given.
    """
    if not isinstance(objective, Mapping):
        raise ConfigError(
            f"objective must be a mapping like dict(metric='segm/AP', direction='maximize'); got {objective!r}"
        )
    metric, direction = objective.get("metric"), objective.get("direction", "maximize")
    if not isinstance(metric, str) or "/" not in metric:
        raise ConfigError(
            f"objective.metric must name a final evaluation metric as task/name (e.g. segm/APr, bbox/AP); "
            f"got {metric!r}"
        )
    if direction not in DIRECTIONS:
        raise ConfigError(f"objective.direction must be one of {', '.join(DIRECTIONS)}; got {direction!r}")
    return {"metric": metric, "direction": direction}


def worst_value(direction: str) -> float:
    """``-inf`` for ``maximize``, ``+inf`` for ``minimize``."""
    return -math.inf if direction == "maximize" else math.inf


def get_objective_value(results: Mapping | None, metric: str) -> float | None:
    """The value of `metric` (``task/name``) in nested evaluation results, or None when it is absent or NaN."""
    node: Any = results
    for part in metric.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    try:
        value = float(node)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value  # e.g. APl without large objects: no value to compare


def list_metrics(results: Mapping | None, prefix: str = "") -> list[str]:
    """Every ``task/name`` key of nested results (to say which metrics a job did produce)."""
    names: list[str] = []
    for key, value in (results or {}).items():
        if isinstance(value, Mapping):
            names += list_metrics(value, f"{prefix}{key}/")
        else:
            names.append(f"{prefix}{key}")
    return names


def get_sweeper_direction_overrides(overrides: Sequence[str], direction: str) -> list[str]:
    """The overrides telling the sweeper chosen in `overrides` (``hydra/sweeper=NAME``) the objective's
    direction; none when no search sweeper is chosen or its direction is already given."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("hydra/sweeper=")]
    if not chosen or chosen[-1] not in _DIRECTION_OVERRIDES:
        return []
    extra = _DIRECTION_OVERRIDES[chosen[-1]](direction == "maximize")
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    return [o for o in extra if o.split("=", 1)[0] not in given]


def get_search_sweeper(overrides: Sequence[str]) -> str | None:
    """The sweeper named by ``hydra/sweeper=NAME`` in `overrides`, unless it is Hydra's grid sweeper."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("hydra/sweeper=")]
    return chosen[-1] if chosen and chosen[-1] != "basic" else None


def check_search(cfg: Any, overrides: Sequence[str], default_main: str) -> None:
    """Before a search sweep starts: the config must have an objective its jobs can produce.

    Args:
        cfg: the config with the command line's plain overrides applied.
        overrides: the command line (Hydra overrides and flags).
        default_main: the default per-rank program (the only one whose hooks are checked for an EvalHook).

    Raises:
        ConfigError: no ``objective`` node, an invalid one, or (default program) no evaluation hook.
    """
    objective = check_objective(cfg.objective) if cfg.get("objective") is not None else None
    sweeper = get_search_sweeper(overrides)
    if sweeper is None:
        return
    if objective is None:
        raise ConfigError(
            f"hydra/sweeper={sweeper} searches for the best value of the config's objective, and this config has "
            "none. Add objective = dict(metric='segm/AP', direction='maximize') to the config, or pass "
            "+objective.metric=segm/AP +objective.direction=maximize."
        )
    launch = cfg.get("launch") or {}
    train = cfg.get("train") or {}
    default_training = launch.get("main", default_main) == default_main and not train.get("eval_only", False)
    if default_training and not _has_eval_hook(train.get("hooks") or {}):
        raise ConfigError(
            f"objective.metric={objective['metric']} comes from the final evaluation, but train.hooks has no "
            f"EvalHook (removed with ~train.hooks.eval?): hydra/sweeper={sweeper} needs it to score each "
            "trial. Keep the eval hook (train.eval_period=0 evaluates once, after training)."
        )


def get_search_overrides(cfg: Any, overrides: Sequence[str]) -> list[str]:
    """The overrides that tell a search sweeper chosen in `overrides` the direction of the config's objective
    (see `get_sweeper_direction_overrides`); none for a grid sweep or a config without an objective.

    Args:
        cfg: the config with the command line's plain overrides applied (checked by `check_search`).
        overrides: the command line (Hydra overrides and flags).
    """
    if get_search_sweeper(overrides) is None or cfg.get("objective") is None:
        return []
    return get_sweeper_direction_overrides(overrides, check_objective(cfg.objective)["direction"])


def _has_eval_hook(hooks: Mapping) -> bool:
    from lazytrain.config import locate
    from lazytrain.engine.hooks import EvalHook

    for hook in hooks.values():
        target = hook.get("_target_") if isinstance(hook, Mapping) else None
        try:
            located = locate(str(target)) if target else None
        except Exception:  # an unimportable target is reported by validation, with its key path
            continue
        if isinstance(located, type) and issubclass(located, EvalHook):
            return True
    return False


def is_sweep_job() -> bool:
    """Whether this process runs a job of a Hydra sweep (``-m``), whose value a sweeper may read."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def get_job_value(results: Any, objective: dict | None, *, in_sweep: bool | None = None) -> Any:
    """The objective metric of a finished job's results; the results themselves when the config has no
    objective.

    Results that lack the metric give its worst value. In a sweep that is a warning (the sweeper scores the job
    with it); a single run only says so quietly, since nothing reads the value: one line when the results hold
    other metrics (a misspelled ``objective.metric``), nothing on the console when there was no evaluation.

    Args:
        results: the job's final evaluation results (nested ``{task: {name: value}}``).
        objective: the checked ``objective`` node (`check_objective`), or None.
        in_sweep: whether the job is part of a sweep; None: asks Hydra (`is_sweep_job`).
    """
    if objective is None:
        return results
    value = get_objective_value(results, objective["metric"])
    if value is not None:
        return value
    worst = worst_value(objective["direction"])
    metric, produced = objective["metric"], ", ".join(list_metrics(results))
    if is_sweep_job() if in_sweep is None else in_sweep:
        logger.warning(
            "objective.metric=%s is not in the job's final results (it has: %s); the job returns %s.",
            metric,
            produced or "none, was there an evaluation?",
            worst,
        )
    elif produced:
        logger.info(
            "objective.metric=%s is not in the final results (they have: %s); a sweep would score this run %s.",
            metric,
            produced,
            worst,
        )
    else:
        logger.debug("No final results: objective.metric=%s has no value (only a sweep reads it).", metric)
    return worst
