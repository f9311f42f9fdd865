"""Rendering a config as readable Python (`LazyConfig.to_py`), without any code formatter.

Lazy calls are written as ``L(Class)(...)`` with the imports they need; a target that cannot be imported, or
whose short name clashes with another import, is written as its dotted-path string, which `LazyCall` also
accepts. Loading the rendered file with `LazyConfig.load` gives back an equal config.
"""

from __future__ import annotations

import keyword
import math
from typing import Any

from omegaconf import DictConfig, ListConfig

from lazytrain.config import tree
from lazytrain.config.lazy import get_dotted_path, locate
from lazytrain.errors import ConfigError

__all__ = ["render_python"]

_INDENT = "    "


def _is_name(key: Any) -> bool:
    return isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)


def _block(opening: str, items: list[str], closing: str, indent: int) -> str:
    """One item per line, each followed by a comma; empty containers stay on one line."""
    if not items:
        return opening + closing
    inner = _INDENT * (indent + 1)
    return opening + "".join(f"\n{inner}{item}," for item in items) + f"\n{_INDENT * indent}{closing}"


class _Renderer:
    def __init__(self) -> None:
        self.imports: dict[str, str] = {}  # short name -> module it is imported from

    def target_name(self, path: str) -> str:
        """The short name to write for a dotted target path, recording its import."""
        try:
            dotted = get_dotted_path(locate(path))
        except (ImportError, ConfigError):
            return repr(path)
        qualname = locate(path).__qualname__
        module, head = dotted[: -len(qualname) - 1], qualname.split(".")[0]
        if self.imports.setdefault(head, module) != module:
            return repr(path)
        return qualname

    def value(self, node: Any, indent: int) -> str:
        if isinstance(node, DictConfig):
            if tree.is_none(node):
                return "None"
            return self.call(node, indent) if "_target_" in node else self.mapping(node, indent)
        if isinstance(node, ListConfig):
            if tree.is_none(node):
                return "None"
            items = [self.value(item, indent + 1) for _, item in tree.children(node)]
            return _block("[", items, "]", indent)
        value = tree.raw_value(node)
        if isinstance(value, float) and not math.isfinite(value):
            return f"float('{value}')"
        return repr(value)

    def mapping(self, node: DictConfig, indent: int) -> str:
        items = [f"{key!r}: {self.value(child, indent + 1)}" for key, child in tree.children(node)]
        return _block("{", items, "}", indent)

    def call(self, node: DictConfig, indent: int) -> str:
        target_node = tree.child(node, "_target_")
        raw_target = tree.raw_value(target_node)
        if isinstance(target_node, DictConfig):  # a lazy target: a call whose result is called
            target = self.value(target_node, indent)
        elif tree.is_interpolation(target_node) or not isinstance(raw_target, str):
            target = repr(raw_target)
        else:
            target = self.target_name(raw_target)
        items = []
        if "_args_" in node:
            args = tree.child(node, "_args_")
            items += [self.value(tree.child(args, i), indent + 1) for i in range(len(args))]
        named, unnamed = [], []
        for key, child in tree.children(node):
            if key in ("_target_", "_args_"):
                continue
            rendered = self.value(child, indent + 1)
            if _is_name(key):
                named.append(f"{key}={rendered}")
            else:
                unnamed.append(f"{key!r}: {rendered}")
        items += named
        if unnamed:  # keys that are not Python names go through **{...}
            items.append("**" + _block("{", unnamed, "}", indent + 1))
        return _block(f"L({target})(", items, ")", indent)


def render_python(cfg: DictConfig, prefix: str = "") -> str:
    """Render `cfg` as a Python config file: imports, then one assignment per top-level key.

    Args:
        cfg: the config.
        prefix: prepended to every top-level variable name.
    """
    renderer = _Renderer()
    body = []
    for key, node in tree.children(cfg):
        rendered = renderer.value(node, 0)
        name = f"{prefix}{key}"
        # A top-level key that is not a Python name is still a module-level value once set via globals().
        body.append(f"{name} = {rendered}" if _is_name(name) else f"globals()[{name!r}] = {rendered}")
    header = ["from lazytrain.config import LazyCall as L"]
    header += sorted(f"from {module} import {name}" for name, module in renderer.imports.items())
    return "\n".join(header) + "\n\n" + "\n".join(body) + "\n"
