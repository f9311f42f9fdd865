"""Check a whole config before anything expensive runs, without building anything.

Checked: every ``_target_`` imports and is callable; keyword arguments are accepted by the target's
signature (unless it takes ``**kwargs``) and required ones are given; ``_args_`` is not longer than the
positional parameters; ``_partial_``/``_recursive_``/``_convert_`` hold valid values; mandatory (``???``)
values are set; plain references (``${a.b}``, ``${..x}``) point at existing keys; literal values match
``int``/``float``/``str``/``bool`` annotations. All problems are reported at once, each starting with its
config key path, misspelled argument names with a did-you-mean suggestion. Only the targets' modules are
imported (torch only when a target lives there).
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig

from lazytrain.config.instantiate import CONVERT_MODES
from lazytrain.config.lazy import RESERVED_KEYS, locate
from lazytrain.errors import ConfigError

__all__ = ["find_problems", "validate"]

_SIMPLE_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
_SIMPLE_NAMES = {"int": int, "float": float, "str": str, "bool": bool}
_REFERENCE = re.compile(r"^\$\{\.*[\w\-\[\]]+(?:\.[\w\-\[\]]+)*\}$")


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
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


def _check_settings(node: DictConfig, path: str, problems: list[str]) -> None:
    """Hydra's call settings hold values `instantiate` accepts."""
    for key in ("_partial_", "_recursive_"):
        raw = node._get_node(key) if key in node else None
        if raw is not None and not raw._is_interpolation() and not isinstance(raw._value(), bool):
            problems.append(f"{_join(path, key)}: must be true or false; got {raw._value()!r}.")
    raw = node._get_node("_convert_") if "_convert_" in node else None
    if raw is not None and not raw._is_interpolation() and raw._value() not in CONVERT_MODES:
        problems.append(
            f"{_join(path, '_convert_')}: must be one of {', '.join(CONVERT_MODES)}; got {raw._value()!r}."
        )


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
    if not callable(target):
        problems.append(f"{_join(path, '_target_')}: '{name}' is not callable (a {type(target).__name__}).")
        return
    _check_settings(node, path, problems)
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
    takes_any = any(p.kind is p.VAR_POSITIONAL for p in params.values())
    if num_args > len(positional) and not takes_any:
        problems.append(
            f"{_join(path, '_args_')}: {name} takes {len(positional)} positional argument(s); got {num_args}."
        )
    for param in params.values():
        if param.default is not param.empty or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param in positional and positional.index(param) < num_args:
            continue
        if param.name not in provided:
            problems.append(f"{_join(path, param.name)}: missing required argument '{param.name}' of {name}.")


def _reference_problem(child: Any) -> str | None:
    """A plain reference interpolation (``${a.b}``, ``${..x}``) to a key that does not exist."""
    text = child._value()
    if not isinstance(text, str) or not _REFERENCE.match(text):
        return None  # resolvers (${oc.env:X}, ${hydra:...}) and string templates are not checked
    try:
        child._dereference_node()
    except Exception as e:  # omegaconf raises several error types for a dangling reference
        return f"interpolation {text} does not resolve: {str(e).splitlines()[0]}"
    return None


def _walk(node: Any, path: str, injected: Mapping[str, Iterable[str]], problems: list[str]) -> None:
    if isinstance(node, DictConfig):
        if node._is_none():
            return
        given_later = set(injected.get(path, ())) if "_target_" in node else set()
        if "_target_" in node:
            _check_call(node, path, given_later, problems)
        keys: Iterable[Any] = node.keys()
    elif isinstance(node, ListConfig):
        if node._is_none():
            return
        given_later, keys = set(), range(len(node))
    else:
        return
    for key in keys:
        child, child_path = node._get_node(key), _join(path, key)
        if child._is_missing():
            if key not in given_later:
                problems.append(f"{child_path}: mandatory value is missing (???). Set it: {child_path}=VALUE")
        elif child._is_interpolation():
            problem = _reference_problem(child)
            if problem:
                problems.append(f"{child_path}: {problem}")
        else:
            _walk(child, child_path, injected, problems)


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
