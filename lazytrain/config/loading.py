"""Executing Python config files, with relative imports between config files resolved by file location.

A config file is plain Python. ``from .base import model`` (or ``from ..recipes.models.x import model``)
finds ``base.py`` next to the importing file, no ``__init__.py`` needed, and executes it afresh each time,
so mutating an imported dict never leaks into another importer.
"""

from __future__ import annotations

import builtins
import itertools
import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config.lazy import to_config_value
from lazytrain.errors import ConfigError

__all__ = ["execute_config_file", "public_values"]

_FILE_KEY = "__lazytrain_config_file__"
_counter = itertools.count()


def _relative_import(name: str, importer_file: str, level: int) -> types.ModuleType:
    base_dir = os.path.dirname(importer_file)
    for _ in range(level - 1):
        base_dir = os.path.dirname(base_dir)
    if not name:
        raise ConfigError(
            f"{importer_file}: 'from {'.' * level} import x' is not supported between config files. "
            f"Import from the file itself instead: 'from {'.' * level}x import <names>'."
        )
    target = os.path.join(base_dir, *name.split(".")) + ".py"
    if not os.path.isfile(target):
        raise ConfigError(
            f"{importer_file}: 'from {'.' * level}{name} import ...' refers to config file {target}, "
            "which does not exist. Relative imports in config files resolve by file location."
        )
    module = execute_config_file(target)
    # Imported dicts become DictConfigs so the importer can write `train.max_iter = 20`, as in detectron2.
    for name, value in public_values(module).items():
        if isinstance(value, (Mapping, Sequence)) and not isinstance(value, (str, DictConfig, ListConfig)):
            setattr(module, name, OmegaConf.create(to_config_value(value, name=name)))
    return module


def _make_import(importer_file: str):
    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            return builtins.__import__(name, globals, locals, fromlist, level)
        return _relative_import(name, importer_file, level)

    return _import


def execute_config_file(path: str) -> types.ModuleType:
    """Execute a Python config file as a fresh module and return it.

    Raises:
        ConfigError: the file is missing, has a syntax error (file and line named), or imports a missing
            config file.
    """
    path = os.path.abspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    try:
        code = compile(source, path, "exec")
    except SyntaxError as e:
        raise ConfigError(f"syntax error in config file {path}, line {e.lineno}: {e.msg}") from e
    module = types.ModuleType(f"lazytrain_config_{next(_counter)}_{os.path.basename(path)[:-3]}")
    module.__file__ = path
    module_builtins = dict(vars(builtins))
    module_builtins["__import__"] = _make_import(path)
    module.__dict__.update({"__builtins__": module_builtins, _FILE_KEY: path})
    exec(code, module.__dict__)
    return module


def _is_config_value(value: Any) -> bool:
    if isinstance(value, (DictConfig, ListConfig, str, int, float, bool, type(None))):
        return True
    return isinstance(value, (Mapping, Sequence)) and not isinstance(value, (bytes, bytearray))


def public_values(module: types.ModuleType) -> dict[str, Any]:
    """The module's public module-level values a config keeps: dicts, lists and scalars (no modules,
    functions, classes or ``_private`` names)."""
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_") and _is_config_value(value)
    }
