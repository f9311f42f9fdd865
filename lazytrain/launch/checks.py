"""Checks the command line runs before Hydra and before any rank starts, so that bad input ends in one line
naming the culprit (a `ConfigError`) instead of a traceback from deep inside, and nothing is written."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator

from omegaconf import DictConfig, ListConfig
from omegaconf.errors import InterpolationResolutionError

from lazytrain.errors import ConfigError

__all__ = ["check_launch_values", "check_output_dirs", "resolve_values", "resume_if_requeued"]

logger = logging.getLogger("lazytrain.launch")


def check_output_dirs(overrides: list[str]) -> None:
    """Fail before Hydra does (with a traceback) when the run or sweep directory cannot be created.

    A value with interpolations (Hydra's default ``outputs/${now:...}``) is checked up to its fixed prefix.
    """
    given = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides if "=" in o}
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        value = given.get(key, "outputs/" if key == "hydra.run.dir" else "multirun/")
        path = os.path.abspath(value.split("${", 1)[0] or ".")
        ancestor = path
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        try:
            if not os.path.isdir(ancestor):
                raise NotADirectoryError(f"{ancestor} is a file")
            os.rmdir(tempfile.mkdtemp(prefix=".lazytrain-check-", dir=ancestor))
        except OSError as e:
            reason = e.strerror or str(e)
            raise ConfigError(
                f"{key}={value}: cannot create a directory under {ancestor} ({reason}); choose a writable place, "
                f"e.g. {key}=./outputs/my_run."
            ) from None


def resolve_values(cfg: DictConfig) -> None:
    """Resolve interpolations of values in place (ranks cannot: ``${hydra:...}``, ``${now:...}``); a broken one
    is a config error naming the key and the target."""
    try:
        _resolve_in_place(cfg)
    except InterpolationResolutionError as e:
        reason = str(e).splitlines()[0]
        failing = list(_unresolvable(cfg))
        # Keys interpolating a broken key fail too: name the one whose own text holds the missing target.
        target = reason.split("'")[1] if reason.count("'") >= 2 else None
        direct = [item for item in failing if target and "${" + target in item[1]]
        key, raw = (direct or failing or [("a config value", "")])[0]
        raise ConfigError(
            f"{key}={raw}: cannot resolve the interpolation: {reason}. Point it at an existing key (e.g. "
            "${train.output_dir}) or give a plain value."
        ) from None


def _resolve_in_place(node: DictConfig | ListConfig) -> None:
    """Replace every interpolation under `node` by its value, except those referring to a whole config node
    (``sampler.dataset_dicts: ${..dataset}``): `instantiate` builds such a node once and shares it, and a
    resolved copy would be built twice (the train annotations loaded twice)."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in list(keys):
        child = node._get_node(key)
        if child._is_interpolation():
            if not isinstance(child._dereference_node(), (DictConfig, ListConfig)):
                node[key] = node[key]
        elif isinstance(child, (DictConfig, ListConfig)):
            _resolve_in_place(child)


def _unresolvable(node: DictConfig | ListConfig, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key path, raw value) of every interpolation under `node` that does not resolve."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        child = node._get_node(key)
        path = f"{prefix}{key}"
        if child._is_interpolation():
            try:
                node[key]
            except Exception:
                yield path, str(child._value())
        elif isinstance(child, (DictConfig, ListConfig)):
            yield from _unresolvable(child, path + ".")


def check_launch_values(launch_cfg: DictConfig) -> None:
    """Process counts and the machine rank must be usable before anything is spawned."""
    for key in ("num_processes", "num_machines"):
        value = launch_cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"launch.{key}={value}: must be an integer >= 1.")
    from lazytrain.launch.launch import parse_timeout

    try:
        if launch_cfg.get("timeout") is not None:
            parse_timeout(launch_cfg.timeout)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rank, machines = launch_cfg.get("machine_rank"), launch_cfg.num_machines
    if not isinstance(rank, int) or not 0 <= rank < machines:
        raise ConfigError(
            f"launch.machine_rank={rank}: must be in [0, launch.num_machines - 1] = [0, {machines - 1}]."
        )


def resume_if_requeued(cfg: DictConfig) -> None:
    """A requeued SLURM job (SLURM_RESTART_COUNT >= 1) runs its command again: it must continue from its last
    checkpoint, not start over and overwrite it."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    train = cfg.get("train")
    if restarts not in ("", "0") and train is not None and not train.get("resume", False):
        logger.warning(
            "Requeued SLURM job (SLURM_RESTART_COUNT=%s): resuming from the last checkpoint (train.resume=true).",
            restarts,
        )
        train.resume = True
