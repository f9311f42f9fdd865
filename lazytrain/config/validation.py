"""Check a whole config before anything expensive runs, without building anything.

Checked: every ``_target_`` imports and is callable; keyword arguments are accepted by the target's
signature (a class's ``**kwargs`` followed into the base class that receives them, `signatures`; any other
``**kwargs`` accepts anything) and required ones are given; ``_args_`` is not longer than the
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
from omegaconf.errors import InterpolationKeyError

from lazytrain.config import tree
from lazytrain.config.instantiate import CONVERT_MODES
from lazytrain.config.lazy import RESERVED_KEYS, locate
from lazytrain.config.signatures import get_parameters
from lazytrain.errors import ConfigError

__all__ = ["find_problems", "validate"]

_SIMPLE_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
_SIMPLE_NAMES = {"int": int, "float": float, "str": str, "bool": bool}
_REFERENCE = re.compile(r"^\$\{\.*[\w\-\[\]]+(?:\.[\w\-\[\]]+)*\}$")
_NOT_LITERAL = object()  # `_literal` of a key that is absent or an interpolation


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _type_problem(param: inspect.Parameter, node: Any) -> str | None:
    if isinstance(node, (DictConfig, ListConfig)) or tree.is_interpolation(node) or tree.is_missing(node):
        return None
    value = tree.raw_value(node)
    annotation = _SIMPLE_NAMES.get(param.annotation, param.annotation)
    if value is None or annotation not in _SIMPLE_TYPES:
        return None
    if isinstance(value, bool) and annotation is not bool:
        return f"expected {annotation.__name__}, got bool {value!r}"
    if not isinstance(value, _SIMPLE_TYPES[annotation]):
        return f"expected {annotation.__name__}, got {type(value).__name__} {value!r}"
    return None


def _literal(node: DictConfig, key: str) -> Any:
    """The value written for `key`; `_NOT_LITERAL` when absent or an interpolation (known once resolved)."""
    if key not in node:
        return _NOT_LITERAL
    raw = tree.child(node, key)
    return _NOT_LITERAL if tree.is_interpolation(raw) else tree.raw_value(raw)


def _check_settings(node: DictConfig, path: str, problems: list[str]) -> None:
    """Hydra's call settings hold values `instantiate` accepts."""
    for key in ("_partial_", "_recursive_"):
        raw = _literal(node, key)
        if raw is not _NOT_LITERAL and not isinstance(raw, bool):
            problems.append(f"{_join(path, key)}: must be true or false; got {raw!r}.")
    raw = _literal(node, "_convert_")
    if raw is not _NOT_LITERAL and raw not in CONVERT_MODES:
        problems.append(
            f"{_join(path, '_convert_')}: must be one of {', '.join(CONVERT_MODES)}; got {raw!r}."
        )


def _check_call(node: DictConfig, path: str, injected: Iterable[str], problems: list[str]) -> None:
    raw = tree.child(node, "_target_")
    if isinstance(raw, DictConfig) or tree.is_interpolation(raw):
        return  # a lazy target is checked as its own node; its result's signature is unknown here
    name = tree.raw_value(raw)
    try:
        target = locate(name)
    except ImportError as e:
        reason = str(e) if str(e).startswith(f"cannot import '{name}'") else f"cannot import '{name}': {e}"
        problems.append(f"{_join(path, '_target_')}: {reason}")
        return
    if not callable(target):
        problems.append(f"{_join(path, '_target_')}: '{name}' is not callable (a {type(target).__name__}).")
        return
    _check_settings(node, path, problems)
    parameters = get_parameters(target)
    if parameters is None:  # some builtins have no signature
        return
    params = {p.name: p for p in parameters}
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    given = [str(k) for k in node.keys() if k not in RESERVED_KEYS]
    for key in given:
        if key in params:
            problem = _type_problem(params[key], tree.child(node, key))
            if problem:
                problems.append(f"{_join(path, key)}: {name}({key}=) {problem}")
        elif not accepts_any:
            problems.append(f"{_join(path, key)}: {name} has no argument '{key}'.{_suggestion(key, params)}")
    if node.get("_partial_", False):
        return
    num_args = len(tree.child(node, "_args_")) if "_args_" in node else 0
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


def _suggestion(key: str, params: Mapping[str, inspect.Parameter]) -> str:
    """The did-you-mean hint and the accepted names for a misspelled argument `key`."""
    names = [name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not names:
        return " It takes no keyword arguments."
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"{hint} Accepted: {', '.join(names)}."


def _reference_problem(child: Any) -> str | None:
    """A plain reference interpolation (``${a.b}``, ``${..x}``) to a key that does not exist."""
    text = tree.raw_value(child)
    if not isinstance(text, str) or not _REFERENCE.match(text):
        return None  # resolvers (${oc.env:X}, ${hydra:...}) and string templates are not checked
    try:
        tree.dereference(child)
    except InterpolationKeyError as e:
        return (
            f"cannot resolve the interpolation: {str(e).splitlines()[0]}. Point it at an existing key or give a "
            "plain value."
        )
    except Exception:
        # The key exists and its own value does not resolve: a ??? (reported at its key), a resolver registered
        # later (Hydra's ${hydra:...}, known once the job runs) or one that fails (its own error says why).
        return None
    return None


def _check_node(node: Any, path: str, injected: Mapping[str, Iterable[str]], problems: list[str]) -> None:
    """Check `node` as a call when it is one; arguments a program injects at `path` count as given."""
    if isinstance(node, DictConfig) and not tree.is_none(node) and "_target_" in node:
        _check_call(node, path, set(injected.get(path, ())), problems)


def _given_later(entry: tree.Entry, injected: Mapping[str, Iterable[str]]) -> set[str]:
    """Argument names a program passes to the call holding `entry`, so it may leave them ``???``."""
    if isinstance(entry.parent, DictConfig) and "_target_" in entry.parent:
        return set(injected.get(entry.parent_path, ()))
    return set()


def _child_path(path: str, parent: Any, key: Any) -> str:
    return _join(path, key)  # the same path format as every other message here


def _walk(cfg: DictConfig, injected: Mapping[str, Iterable[str]], problems: list[str]) -> None:
    _check_node(cfg, "", injected, problems)
    for entry in tree.walk(cfg, join=_child_path):
        if tree.is_missing(entry.node):
            if entry.key not in _given_later(entry, injected):
                path = entry.path
                problems.append(f"{path}: mandatory value is missing (???). Set it: {path}=VALUE")
        elif tree.is_interpolation(entry.node):
            problem = _reference_problem(entry.node)
            if problem:
                problems.append(f"{entry.path}={tree.raw_value(entry.node)}: {problem}")
        else:  # `walk` goes on into its children next
            _check_node(entry.node, entry.path, injected, problems)


def find_problems(cfg: DictConfig, injected: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """All problems in `cfg`, one line each, starting with the config key path.

    Args:
        cfg: the config.
        injected: key path -> argument names a program passes at instantiation time (e.g.
            ``{"train.trainer": ["model", "optimizer", "data_loader"]}``), so they are not reported missing.
    """
    problems: list[str] = []
    _walk(cfg, injected or {}, problems)
    return problems


def validate(cfg: DictConfig, injected: Mapping[str, Iterable[str]] | None = None) -> None:
    """Raise one `ConfigError` listing every problem `find_problems` finds (nothing is built): the problem's
    line when there is one, else a count and a line each."""
    problems = find_problems(cfg, injected)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"the config has {len(problems)} problems:\n{listing}")
