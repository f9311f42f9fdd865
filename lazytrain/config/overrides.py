"""Command-line overrides in Hydra's grammar, applied to a loaded LazyConfig.

``a.b=1`` changes an existing key (an unknown key is an error with did-you-mean suggestions), ``+a.c=1``
adds a new key, ``++a.b=1`` adds or changes, ``~a.b`` deletes (``~a.b=v`` only if the value is v). Values
parse as in Hydra: ``1`` int, ``'1'`` string, ``[1,2]`` list, ``{x:1}`` dict (merged into a dict node),
``null``, ``${c.d}`` interpolation. Sweeps (``a=1,2``) need ``-m`` and are refused here. An override Hydra's
grammar cannot read is one line saying what is wrong with it (`parse_override`), not the parser's traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lazytrain.config import tree
from lazytrain.errors import ConfigError

_KEY_PATTERN = re.compile(r"[\w\-/]+(\.[\w\-/]+)*(@[\w.\-]*)?")  # Hydra's keys, config groups and packages
_CLOSING = {"[": "]", "{": "}", "(": ")"}
_OPENING = {closing: opening for opening, closing in _CLOSING.items()}
_QUOTE_VALUE = "quote a value that holds spaces, '=', ',', quotes or brackets as text: {key}='...'"

__all__ = ["apply_overrides", "iter_key_paths", "parse_override", "suggest_keys"]


def iter_key_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key path in a config (``a.b.2.c``), without resolving interpolations."""
    for entry in tree.walk(node, prefix, join=tree.dotted_path):
        yield entry.path


def suggest_keys(cfg: DictConfig, key: str, limit: int = 3) -> list[str]:
    """The existing key paths closest to `key` (whole path first, then same-leaf-name matches)."""
    paths = list(iter_key_paths(cfg))
    close = difflib.get_close_matches(key, paths, n=limit, cutoff=0.6)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = {p.rsplit(".", 1)[-1]: p for p in paths}
    for name in difflib.get_close_matches(leaf, list(by_leaf), n=limit, cutoff=0.7):
        candidates = [p for p in paths if p.rsplit(".", 1)[-1] == name]
        close += [p for p in difflib.get_close_matches(key, candidates, n=1, cutoff=0.0) if p not in close]
    return close[:limit]


def _did_you_mean(cfg: DictConfig, key: str) -> str:
    suggestions = suggest_keys(cfg, key)
    return f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""


def _not_a_node(key: str, inside: str, node: Any, part: str) -> ConfigError:
    value = tree.raw_value(node)
    return ConfigError(
        f"override '{key}': '{inside}' holds a plain value ({type(value).__name__} {value!r}), "
        f"not a config node, so it has no key '{part}'. Override '{inside}' itself (e.g. {inside}=VALUE)."
    )


def _child(node: Any, part: str) -> Any:
    """The child node named `part`, or None when `node` is a container without it."""
    if isinstance(node, DictConfig):  # keys(), not `in`: a mandatory value (???) is a key but not `in` it
        return tree.child(node, part) if part in node.keys() else None
    if part.isdigit() and int(part) < len(node):
        return tree.child(node, int(part))
    return None


def _find(cfg: DictConfig, key: str) -> tuple[Any, str, bool]:
    """Walk to the parent of `key`. Returns (parent container or None when a parent is missing, last part,
    whether the key exists)."""
    *parents, last = key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parents):
        if not isinstance(node, (DictConfig, ListConfig)):
            raise _not_a_node(key, ".".join(parents[:depth]), node, part)
        node = _child(node, part)
        if node is None:
            return None, last, False
        if tree.is_interpolation(node):
            # Writing through a reference would silently replace it (and un-share a node built once).
            inside = ".".join(parents[: depth + 1])
            rest = ".".join([*parents[depth + 1 :], last])
            target = tree.full_key(tree.dereference(node))
            raise ConfigError(
                f"override '{key}': '{inside}' is an interpolation ({tree.raw_value(node)}) of '{target}'. Override "
                f"'{target}.{rest}' to change the shared value, or replace '{inside}' as a whole."
            )
    if not isinstance(node, (DictConfig, ListConfig)):
        raise _not_a_node(key, ".".join(parents), node, last)
    return node, last, _child(node, last) is not None


def _set(cfg: DictConfig, key: str, value: Any) -> None:
    parent, last, exists = _find(cfg, key)
    if exists and isinstance(value, dict):
        current = tree.child(parent, int(last) if isinstance(parent, ListConfig) else last)
        if isinstance(current, DictConfig):
            current.merge_with(value)
            return
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def _delete(cfg: DictConfig, key: str, expected: Any, line: str) -> None:
    parent, last, exists = _find(cfg, key)
    if not exists:
        raise ConfigError(f"override '{line}': cannot delete '{key}', no such key.{_did_you_mean(cfg, key)}")
    index: Any = int(last) if isinstance(parent, ListConfig) else last
    if expected is not None and parent[index] != expected:
        raise ConfigError(
            f"override '{line}': '{key}' is {parent[index]!r}, not {expected!r}; nothing deleted. "
            f"Use '~{key}' to delete whatever it holds."
        )
    parent.pop(index)


def _apply(cfg: DictConfig, override: Any, line: str) -> None:
    key = override.key_or_group
    if override.is_sweep_override():
        raise ConfigError(
            f"override '{line}' is a sweep; run with -m/--multirun to launch one job per value "
            f"(e.g. python -m lazytrain CONFIG -m {line})."
        )
    value = override.value()
    if override.is_delete():
        _delete(cfg, key, value, line)
        return
    parent, last, exists = _find(cfg, key)
    if override.is_add() and exists:
        raise ConfigError(
            f"override '{line}': '{key}' already exists; use '{key}=...' to change it or '++{key}=...' "
            "to add-or-change."
        )
    sibling = _misspelled_sibling(parent, last) if not exists else None
    if not exists and not (override.is_add() or override.is_force_add()):
        add = "" if sibling else f" To add a new key use '+{key}=...'."
        raise ConfigError(
            f"override '{line}': key '{key}' is not in the config.{_did_you_mean(cfg, key)}{add}"
        )
    if override.is_add() and sibling and not _is_component(value):
        # A plain value beside a key one typo away: most likely the typo, and the run would not use it.
        existing = f"{key.rsplit('.', 1)[0]}.{sibling}" if "." in key else sibling
        given = line.split("=", 1)[1] if "=" in line else "..."
        raise ConfigError(
            f"override '{line}': adds '{key}' beside the existing '{existing}', one typo apart: the run would "
            f"keep {existing}'s value. Did you mean '{existing}={given}'? To add the new key anyway use "
            f"'++{key}={given}'."
        )
    _set(cfg, key, value)


def _misspelled_sibling(parent: Any, name: str) -> str | None:
    """The existing key of `parent` that `name` is one typo away from (one letter added, dropped, changed, or
    two swapped, a digit excepted: ``eval2`` beside ``eval`` is a new key), or None. Not for a component's
    arguments (a node with ``_target_``): the check of its constructor's arguments names those it accepts."""
    if not isinstance(parent, DictConfig) or "_target_" in parent.keys() or len(name) < 4:
        return None
    for other in parent.keys():
        if isinstance(other, str) and other != name and _one_typo_apart(name, other):
            return other
    return None


def _one_typo_apart(a: str, b: str) -> bool:
    if a.lower() == b.lower():
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    start = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if len(a) == len(b):
        rest_a, rest_b = a[start:], b[start:]
        swapped = len(rest_a) >= 2 and rest_a[:2] == rest_b[1::-1] and rest_a[2:] == rest_b[2:]
        changed = rest_a[1:] == rest_b[1:] and not (rest_a[0].isdigit() or rest_b[0].isdigit())
        return swapped or changed
    longer, shorter = (a, b) if len(a) > len(b) else (b, a)
    return longer[start + 1 :] == shorter[start:] and not longer[start].isdigit()


def _is_component(value: Any) -> bool:
    """A value that builds something (a dict with ``_target_``): adding one is never silent."""
    return isinstance(value, dict) and "_target_" in value


def parse_override(line: str) -> Any:
    """`line` parsed by Hydra's override grammar, as a ``hydra.core.override_parser.types.Override``.

    Raises:
        ConfigError: one line naming the override, what is wrong with it (an unclosed bracket or quote, a
            closing one without its opening, else the grammar's own complaint) and how to write it instead.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(line)
    except HydraException as e:
        raise ConfigError(f"cannot parse override '{line}': {_describe_grammar_error(line, e)}") from e


def _describe_grammar_error(line: str, error: Exception) -> str:
    """What is wrong with `line`, which Hydra's grammar refused with `error`, and the fix."""
    key, equal, value = line.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    key = key.lstrip("+~")
    words = key.split()
    if not equal and len(words) > 1 and _KEY_PATTERN.fullmatch(words[0]):
        # A value after a space (~a.b c, a.b c): the space, not a missing '=', is what the user would fix.
        name, rest = words[0], " ".join(words[1:])
        value = rest if len(words) == 2 else f"'{rest}'"
        fix = f"delete the key with ~{name}, or with ~{name}={value} only while it holds {value}"
        return f"a space between '{prefix}{name}' and '{rest}' (an override is one word): " + (
            fix if prefix == "~" else f"write {prefix}{name}={value}"
        )
    if not equal:
        return f"no '=' (set a key with {key}=VALUE, delete it with ~{key})"
    if not _KEY_PATTERN.fullmatch(key):
        return (
            f"'{key}' is not a key path (names of letters, digits, '_' or '-' joined by '.': train.max_iter)"
        )
    problem = _find_unbalanced(value, offset=len(line) - len(value), key=key)
    if problem is not None:
        return problem
    if value.rstrip().endswith(","):
        return f"it ends with ',' (a sweep has a value after each ',': -m {key}=1,2)"
    if isinstance(error.__cause__, (TypeError, ValueError)):  # a sweep function's arguments: Hydra says which
        return str(error)
    # The grammar's own complaint, without the list of tokens it expected.
    complaint = str(error).split(" expecting ")[0]
    return f"Hydra's grammar reads no value in it ({complaint}); {_QUOTE_VALUE.format(key=key)}"


def _find_unbalanced(value: str, offset: int, key: str) -> str | None:
    """The first unclosed quote, unclosed bracket or stray closing bracket in `value` (which starts at
    character `offset` + 1 of the override setting `key`) and its fix; None when they all pair up."""
    opened: list[tuple[str, int]] = []  # (bracket, character number in the override)
    quote: tuple[str, int] | None = None
    index = 0
    while index < len(value):
        char, at = value[index], offset + index + 1
        if char == "\\":  # an escaped character is text, inside quotes and out
            index += 2
            continue
        if quote is not None:
            quote = None if char == quote[0] else quote
        elif char in "'\"":
            quote = (char, at)
        elif char in _CLOSING:
            opened.append((char, at))
        elif char in _OPENING and opened and opened[-1][0] == _OPENING[char]:
            opened.pop()
        elif char in _OPENING and opened:
            bracket, start = opened[-1]
            return (
                f"the '{bracket}' at character {start} is closed by '{char}' at {at}; "
                f"close it with '{_CLOSING[bracket]}'"
            )
        elif char in _OPENING:
            return (
                f"the '{char}' at character {at} closes nothing; remove it, or {_QUOTE_VALUE.format(key=key)}"
            )
        index += 1
    if quote is not None:
        mark, start = quote
        text = value.rstrip()
        escapes = len(text[:-1]) - len(text[:-1].rstrip("\\"))
        if text.endswith(mark) and escapes % 2 == 1:  # 'C:\' : the backslash escapes the closing quote
            written = text[: -1 - escapes] + "\\" * (2 * escapes) + mark
            return (
                f"the quote {mark} at character {start} is never closed: the \\ before the last {mark} escapes "
                f"it; write a backslash just before a closing quote as \\\\: {key}={written}"
            )
        return f"the quote {mark} at character {start} is never closed; close it, or write \\{mark} in text"
    if opened:
        bracket, start = opened[-1]
        return f"the '{bracket}' at character {start} is never closed; close it with '{_CLOSING[bracket]}'"
    return None


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply Hydra-grammar overrides to `cfg` in place and return it.

    Overrides apply in order, so a later one sees the effect of an earlier one (``+a.b=1 a.b=2``).

    Args:
        cfg: the config to change.
        overrides: command-line overrides such as ``["train.max_iter=100", "+model.extra=1", "~train.hooks.x"]``.

    Returns:
        `cfg` itself.

    Raises:
        ConfigError: naming the override, for an unparsable override, an unknown key (with suggestions),
            adding an existing key with ``+``, overriding inside a plain value or through an interpolation,
            or a sweep (use ``-m``).
    """
    for line in overrides:
        override = parse_override(line)
        try:
            _apply(cfg, override, line)
        except OmegaConfBaseException as e:
            raise ConfigError(f"override '{line}' failed: {type(e).__name__}: {e}") from e
    return cfg
