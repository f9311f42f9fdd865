"""Command-line overrides in Hydra's grammar, applied to a loaded LazyConfig.

``a.b=1`` changes an existing key (an unknown key is an error with did-you-mean suggestions), ``+a.c=1``
adds a new key, ``++a.b=1`` adds or changes, ``~a.b`` deletes (``~a.b=v`` only if the value is v). Values
parse as in Hydra: ``1`` int, ``'1'`` string, ``[1,2]`` list, ``{x:1}`` dict (merged into a dict node),
``null``, ``${c.d}`` interpolation. Sweeps (``a=1,2``) need ``-m`` and are refused here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.errors import ConfigError

__all__ = ["apply_overrides", "iter_key_paths", "suggest_keys"]


def iter_key_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key path in a config, without resolving interpolations."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from iter_key_paths(node._get_node(key), path)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            path = f"{prefix}.{index}" if prefix else str(index)
            yield path
            yield from iter_key_paths(node._get_node(index), path)


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


def _find(cfg: DictConfig, key: str) -> tuple[Any, str, bool]:
    """Walk to the parent of `key`. Returns (parent container or None, last part, exists)."""
    *parents, last = key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parents):
        if isinstance(node, DictConfig) and part in node:
            node = node._get_node(part)
            if node._is_interpolation():
                node = node._dereference_node()
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        elif isinstance(node, (DictConfig, ListConfig)):
            return None, last, False
        else:
            inside = ".".join(parents[:depth])
            raise ConfigError(
                f"override '{key}': '{inside}' holds a {type(node._value()).__name__} value, not a config "
                f"node, so it has no key '{part}'. Override '{inside}' itself (e.g. {inside}=VALUE)."
            )
    if isinstance(node, DictConfig):
        return node, last, last in node
    if isinstance(node, ListConfig):
        return node, last, last.isdigit() and int(last) < len(node)
    inside = ".".join(parents)
    raise ConfigError(
        f"override '{key}': '{inside}' holds a {type(node._value()).__name__} value, not a config node, so it "
        f"has no key '{last}'. Override '{inside}' itself (e.g. {inside}=VALUE)."
    )


def _set(cfg: DictConfig, key: str, value: Any) -> None:
    parent, last, exists = _find(cfg, key)
    if exists and isinstance(value, dict):
        current = parent._get_node(int(last) if isinstance(parent, ListConfig) else last)
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


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply Hydra-grammar overrides to `cfg` in place and return it.

    Raises:
        ConfigError: unparsable override, unknown key (with suggestions), adding an existing key with
            ``+``, overriding inside a non-config value, or a sweep (use ``-m``).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for line in overrides:
        try:
            override = parser.parse_override(line)
        except HydraException as e:
            raise ConfigError(f"cannot parse override '{line}': {e}") from None
        key = override.key_or_group
        if override.is_sweep_override():
            raise ConfigError(
                f"override '{line}' is a sweep; run with -m/--multirun to launch one job per value "
                f"(e.g. python -m lazytrain CONFIG -m {line})."
            )
        value = override.value()
        if override.is_delete():
            _delete(cfg, key, value, line)
            continue
        _, _, exists = _find(cfg, key)
        if override.is_add() and exists:
            raise ConfigError(
                f"override '{line}': '{key}' already exists; use '{key}=...' to change it or '++{key}=...' "
                "to add-or-change."
            )
        if not exists and not (override.is_add() or override.is_force_add()):
            raise ConfigError(
                f"override '{line}': key '{key}' is not in the config.{_did_you_mean(cfg, key)} "
                f"To add a new key use '+{key}=...'."
            )
        _set(cfg, key, value)
    return cfg
