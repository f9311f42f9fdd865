"""Check a whole config before anything expensive runs: targets import, keyword arguments match signatures,
mandatory (``???``) values are set, literal values match simple annotations. All problems are reported at
once, each with its config key path and, for misspelled names, a did-you-mean suggestion.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig

from lazytrain.config.lazy import RESERVED_KEYS, locate
from lazytrain.errors import ConfigError

__all__ = ["find_problems", "validate"]

_SIMPLE_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
_SIMPLE_NAMES = {"int": int, "float": float, "str": str, "bool": bool}


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _signature(target: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have no signature
        return None


def _type_problem(param: inspect.Parameter, node: Any) -> str | None:
    if isinstance(node, (DictConfig, ListConfig)) or node._is_interpolation() or node._is_missing():
        return None
    value = node._value()
    annotation = _SIMPLE_NAMES.get(param.annotation, param.annotation)
    if value is None or annotation not in _SIMPLE_TYPES:
        return None
    if isinstance(value, bool) and annotation is not bool:
        return f"expected {annotation.__name__}, got bool {value!r}"
    if not isinstance(value, _SIMPLE_TYPES[annotation]):
        return f"expected {annotation.__name__}, got {type(value).__name__} {value!r}"
    return None


def _check_call(node: DictConfig, path: str, injected: Iterable[str], problems: list[str]) -> None:
    raw = node._get_node("_target_")
    if isinstance(raw, DictConfig) or raw._is_interpolation():
        return  # a lazy target is checked as its own node; its result's signature is unknown here
    name = raw._value()
    try:
        target = locate(name)
    except ImportError as e:
        problems.append(f"{_join(path, '_target_')}: cannot import '{name}': {e}")
        return
    signature = _signature(target)
    if signature is None:
        return
    params = signature.parameters
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    given = [str(k) for k in node.keys() if k not in RESERVED_KEYS]
    for key in given:
        if key in params:
            problem = _type_problem(params[key], node._get_node(key))
            if problem:
                problems.append(f"{_join(path, key)}: {name}({key}=) {problem}")
        elif not accepts_any:
            close = difflib.get_close_matches(key, list(params), n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            problems.append(
                f"{_join(path, key)}: {name} has no argument '{key}'.{hint} Accepted: {', '.join(params)}."
            )
    if node.get("_partial_", False):
        return
    num_args = len(node._get_node("_args_")) if "_args_" in node else 0
    provided = set(given) | set(injected)
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for param in params.values():
        if param.default is not param.empty or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param in positional and positional.index(param) < num_args:
            continue
        if param.name not in provided:
            problems.append(f"{_join(path, param.name)}: missing required argument '{param.name}' of {name}.")


def _walk(node: Any, path: str, injected: Mapping[str, Iterable[str]], problems: list[str]) -> None:
    if isinstance(node, DictConfig):
        if "_target_" in node:
            _check_call(node, path, injected.get(path, ()), problems)
        for key in node.keys():
            child = node._get_node(key)
            if child._is_missing():
                problems.append(
                    f"{_join(path, key)}: mandatory value is missing (???). Set it: {_join(path, key)}=VALUE"
                )
            elif not child._is_interpolation():
                _walk(child, _join(path, key), injected, problems)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            child = node._get_node(index)
            if child._is_missing():
                problems.append(f"{path}[{index}]: mandatory value is missing (???).")
            elif not child._is_interpolation():
                _walk(child, _join(path, index), injected, problems)


def find_problems(cfg: DictConfig, injected: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """All problems in `cfg`, one line each, starting with the config key path.

    Args:
        cfg: the config.
        injected: key path -> argument names a program passes at instantiation time (e.g.
            ``{"train.trainer": ["model", "optimizer", "data_loader"]}``), so they are not reported missing.
    """
    problems: list[str] = []
    _walk(cfg, "", injected or {}, problems)
    return problems


def validate(cfg: DictConfig, injected: Mapping[str, Iterable[str]] | None = None) -> None:
    """Raise one `ConfigError` listing every problem `find_problems` finds (nothing is built)."""
    problems = find_problems(cfg, injected)
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"the config has {len(problems)} problem(s):\n{listing}")
