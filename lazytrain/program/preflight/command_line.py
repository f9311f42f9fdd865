"""Checks of the command line itself, run before Hydra starts (so before it creates any directory): the keys
the overrides name, the run and sweep directories, and the values a grid sweep gives each swept key."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.config.overrides import parse_override, suggest_keys
from lazytrain.errors import ConfigError

__all__ = [
    "apply_plain_overrides",
    "find_output_dir_problems",
    "iter_config_overrides",
    "iter_sweep_overrides",
    "iter_swept_values",
]

_MISSING = object()


def iter_config_overrides(overrides: list[str]) -> Iterator[tuple[str, Override]]:
    """(text, parsed override) of each override that sets a config key (not a flag, a Hydra key or a group).

    Raises:
        ConfigError: an override Hydra's grammar cannot read, in one line (`parse_override`).
    """
    for line in overrides:
        if line.startswith("-") or "=" not in line and not line.startswith("~"):
            continue
        override = parse_override(line)
        key = override.key_or_group
        if not key.startswith("hydra") and "/" not in key:
            yield line, override


def apply_plain_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of `cfg` with the command line's plain (non-sweep) overrides applied.

    Unknown keys fail here with did-you-mean suggestions (Hydra's own message has none); a swept key must
    exist too, as must the key of a plain override (`LazyConfig.apply_overrides` reports those).
    """
    plain = []
    for line, override in iter_config_overrides(overrides):
        if not override.is_sweep_override():
            plain.append(line)
            continue
        key = override.key_or_group
        if not (override.is_add() or override.is_force_add()) and _select(cfg, key) is _MISSING:
            suggestions = suggest_keys(cfg, key)
            hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
            raise ConfigError(f"override '{line}': key '{key}' is not in the config.{hint}")
    return LazyConfig.apply_overrides(cfg.copy(), plain)


def iter_sweep_overrides(overrides: list[str]) -> Iterator[tuple[str, Override]]:
    """(key, parsed override) of each override that sweeps a config key: lists, ranges, search spaces, globs."""
    for _, override in iter_config_overrides(overrides):
        if override.is_sweep_override():
            yield override.key_or_group, override


def iter_swept_values(overrides: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(key, values) of each grid-sweep override whose values can be listed (``key=a,b``, ``range(...)``);
    search spaces (``interval(...)``) and globs are left out."""
    for key, override in iter_sweep_overrides(overrides):
        if override.is_choice_sweep() or override.is_range_sweep():
            yield key, list(override.sweep_string_iterator())


def _select(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False)
    if value is _MISSING:  # a mandatory value (???) is a key too: -m data.train.json=a.json,b.json
        parent, _, last = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
        if isinstance(node, DictConfig) and last in node.keys():
            return None
    return value


def find_output_dir_problems(overrides: list[str]) -> list[str]:
    """A line for the run or sweep directory when it cannot be created (Hydra would fail with a traceback).

    A value with interpolations (Hydra's default ``outputs/${now:...}``) is checked up to its fixed prefix.
    """
    given = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides if "=" in o}
    problems = []
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
            problems.append(
                f"{key}={value}: cannot create a directory under {ancestor} ({reason}); choose a writable place, "
                f"e.g. {key}=./outputs/my_run."
            )
    return problems
