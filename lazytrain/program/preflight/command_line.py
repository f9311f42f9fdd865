"""Checks of the command line itself, run before Hydra starts (so before it creates any directory): the keys
the overrides name, the run and sweep directories, and the values a grid sweep gives each swept key."""

from __future__ import annotations

import inspect
import os
import re
import tempfile
import types
import typing
from collections.abc import Iterator
from typing import Any

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import LazyConfig, locate, tree
from lazytrain.config.overrides import parse_override, suggest_keys
from lazytrain.errors import ConfigError

__all__ = [
    "apply_plain_overrides",
    "find_node_replaced_by_value_problems",
    "find_output_dir_problems",
    "iter_config_overrides",
    "iter_sweep_overrides",
    "iter_swept_values",
]

_MISSING = object()
_PLAIN_TYPES = (str, int, float, bool)


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


def find_node_replaced_by_value_problems(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """A line for each override that gives a plain value (a string, number or bool; any value of a sweep)
    to a key whose node surely builds an object (``_target_`` a class, or a function annotated to return
    something other than a plain value): the object's argument was meant (``copy_paste=rare`` for
    ``copy_paste.mode=rare``), and the value would reach the code as it is, after the run folder exists. A
    function that may return a plain value (unannotated, a builtin, ``-> int | None``) may be replaced by one.
    The line names the argument whose value the given one fits, when a single one does.

    Args:
        cfg: the config before the command line's overrides.
        overrides: the command line after CONFIG.
    """
    problems = []
    for line, override in iter_config_overrides(overrides):
        key = override.key_or_group
        node = _select(cfg, key) if not override.is_delete() else None
        if not isinstance(node, DictConfig) or "_target_" not in node or not _surely_builds_object(node):
            continue
        if override.is_choice_sweep():
            given = list(zip(override.sweep_iterator(), override.sweep_string_iterator()))
        else:
            given = [(override.value(), line.split("=", 1)[1])]
        plain = [(value, text) for value, text in given if _is_plain_value(value)]
        if plain:
            problems.append(_describe_node_replaced(line, key, node, plain))
    return problems


def _surely_builds_object(node: DictConfig) -> bool:
    """Whether `node`'s target is a class (not a plain type) or a function annotated to return no plain value
    (``register_json_dataset`` returns the name it registers, which a plain name may replace)."""
    target = tree.raw_target(node)
    try:
        function = locate(target) if isinstance(target, str) else None
    except ImportError:
        return False  # not known here (preflight names a target that does not import)
    if isinstance(function, type):
        return not issubclass(function, _PLAIN_TYPES)
    if not callable(function):
        return False
    try:
        returned = inspect.signature(function).return_annotation
    except (TypeError, ValueError):  # some builtins have no signature
        return False
    if returned is inspect.Signature.empty:
        return False
    if isinstance(returned, str):
        try:
            returned = typing.get_type_hints(function).get("return", returned)
        except Exception:  # an annotation that names what the module imports only for type checking
            pass
    return not _may_be_plain(returned)


def _may_be_plain(annotation: Any) -> bool:
    """Whether a return annotation admits a plain value: a plain type, ``Any``/``object``, a union holding one,
    or a string annotation that names one."""
    if isinstance(annotation, str):
        names = set(re.findall(r"[A-Za-z_][\w.]*", annotation))
        return bool(names & {"str", "int", "float", "bool", "Any", "typing.Any", "object"})
    if annotation in (Any, object) or isinstance(annotation, typing.TypeVar):
        return True
    if isinstance(annotation, type):
        return issubclass(annotation, _PLAIN_TYPES)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_may_be_plain(argument) for argument in typing.get_args(annotation))
    return False


def _is_plain_value(value: Any) -> bool:
    if isinstance(value, str):
        return "${" not in value  # an interpolation may point at a node
    return isinstance(value, (bool, int, float))


def _fits(value: Any, current: Any) -> bool:
    """Whether the string or bool `value` is of the kind of an argument whose value is `current`."""
    if isinstance(value, bool):
        return isinstance(current, bool)
    return isinstance(current, str) and "${" not in current


def _describe_node_replaced(line: str, key: str, node: DictConfig, plain: list[tuple[Any, str]]) -> str:
    """The line for `plain` (each (value, its text)) given to `key`; a sweep's nulls are left out of the fix."""
    arguments = [name for name in node.keys() if not str(name).startswith("_")]
    target = tree.raw_target(node)
    # A string or bool that fits a single argument names it (copy_paste=rare -> copy_paste.mode, "none"); a
    # number fits too many meanings (lr_multiplier=0.1 is no warm-up factor) to pick one.
    numbers = any(isinstance(value, (int, float)) and not isinstance(value, bool) for value, _ in plain)
    fitting = [
        name
        for name in arguments
        if not numbers and all(_fits(value, tree.raw_value(tree.child(node, name))) for value, _ in plain)
    ]
    text = ",".join(text for _, text in plain)
    fix = (
        f"set one of its arguments, e.g. {key}.{fitting[0]}={text}"
        if len(fitting) == 1
        else ("set one of its arguments")
    )
    listed = f" ({', '.join(map(str, arguments))})" if arguments else ""
    return (
        f"{line}: {key} is a node that builds {target}, not a value; {fix}{listed}, or replace the whole node "
        f"with '{key}={{_target_: ..., ...}}'."
    )


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
