"""Executing Python config files, with relative imports between config files resolved by file location.

A config file is plain Python. ``from .base import model`` (or ``from ..recipes.models.x import model``)
finds ``base.py`` next to the importing file, no ``__init__.py`` needed, and executes it afresh each time,
so mutating an imported dict never leaks into another importer.

The shipped config files (the repository's ``conf/`` and ``recipes/``, installed as the packages
``lazytrain.conf`` and ``lazytrain.recipes``: pyproject.toml) are imported the same way by those names from a
config file anywhere: ``from lazytrain.recipes.models.mask_rcnn_fpn import model`` executes that file afresh.
"""

from __future__ import annotations

import builtins
import importlib.util
import inspect
import itertools
import os
import traceback
import types
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config.lazy import to_config_value
from lazytrain.errors import ConfigError

__all__ = ["SHIPPED_CONFIG_PACKAGES", "execute_config_file", "get_shipped_config_dir", "public_values"]

_FILE_KEY = "__lazytrain_config_file__"
_counter = itertools.count()
_executing: list[str] = []  # files being executed, innermost last (cycle detection)

SHIPPED_CONFIG_PACKAGES = ("lazytrain.conf", "lazytrain.recipes")
"""Packages of config files: an absolute import of a module in them executes its file as a config file."""


def get_shipped_config_dir(package: str) -> str:
    """The folder of `package` (one of `SHIPPED_CONFIG_PACKAGES`) that belongs to the imported lazytrain:
    ``lazytrain/conf`` or ``lazytrain/recipes`` inside an installed wheel, else ``conf/`` or ``recipes/``
    beside the package (a clone: pyproject.toml's package-dir), else wherever the import system finds it.

    The folders next to ``lazytrain.__file__`` come first: an editable install's finder is pinned to the
    installed checkout, so with another clone (or git worktree) on ``PYTHONPATH`` it would give the installed
    checkout's configs to the clone's code.

    Raises:
        ConfigError: none of them has the package (install lazytrain, or run from a clone).
    """
    package_dir = os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))
    )  # lazytrain/config/.. = lazytrain
    folder = package.split(".", 1)[1]  # lazytrain.conf -> conf
    for candidate in (os.path.join(package_dir, folder), os.path.join(os.path.dirname(package_dir), folder)):
        if os.path.isdir(candidate):
            return candidate
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"{package} is not installed with this lazytrain; reinstall lazytrain "
            "(in a clone: pip install -e .) so that its config files are importable by name."
        )
    return list(spec.submodule_search_locations)[0]


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
    spelled = "." * level + name
    return _import_config_file(
        target, importer_file, spelled, "Relative imports in config files resolve by file location."
    )


def _is_shipped(name: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in SHIPPED_CONFIG_PACKAGES)


def _shipped_import(name: str, importer_file: str, fromlist: Sequence[str] | None) -> types.ModuleType:
    """``from lazytrain.recipes.x import ...`` in `importer_file`: recipes/x.py executed as a config file."""
    if not fromlist:
        raise ConfigError(
            f"{importer_file}: 'import {name}' does not import a config file; import names from the file: "
            f"'from {name} import <names>'."
        )
    package = next(p for p in SHIPPED_CONFIG_PACKAGES if name == p or name.startswith(p + "."))
    folder = get_shipped_config_dir(package)
    target = os.path.join(folder, *name[len(package) :].split(".")[1:]) + ".py"
    return _import_config_file(target, importer_file, name, f"{package} is the folder {folder}.")


def _import_config_file(target: str, importer_file: str, spelled: str, where: str) -> types.ModuleType:
    """`target` executed as a config file, for `importer_file`'s ``from <spelled> import ...``."""
    if not os.path.isfile(target):
        hint = ""
        if os.path.isdir(target[:-3]):
            hint = (
                f" '{target[:-3]}' is a folder: import from a file in it ('from {spelled}.FILE import ...')."
            )
        raise ConfigError(
            f"{importer_file}: 'from {spelled} import ...' refers to config file {target}, "
            f"which does not exist. {where}{hint}"
        )
    module = execute_config_file(target)
    # Imported dicts and lists become omegaconf nodes so the importer can write `train.max_iter = 20` and
    # `model.backbone.depth = 18`, as in detectron2. Other values stay Python objects until the final load.
    for key, value in list(vars(module).items()):
        if key.startswith("_") or not isinstance(value, (Mapping, list, tuple)):
            continue
        if not isinstance(value, (DictConfig, ListConfig)):
            try:
                setattr(module, key, OmegaConf.create(to_config_value(value, name=key)))
            except ConfigError as e:
                raise ConfigError(f"config file {target}: {e}") from None
    return module


def _make_import(importer_file: str):
    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and _is_shipped(name):
            return _shipped_import(name, importer_file, fromlist)
        if level == 0:
            return builtins.__import__(name, globals, locals, fromlist, level)
        return _relative_import(name, importer_file, level)

    return _import


def _error_line(error: BaseException, path: str) -> int | None:
    """The line of `path` that was executing when `error` was raised (innermost frame in that file)."""
    line = None
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno
    return line


def execute_config_file(path: str) -> types.ModuleType:
    """Execute a Python config file as a fresh module and return it.

    Raises:
        ConfigError: the file is missing, has a syntax error (file and line named), imports a missing
            config file, imports itself in a cycle, or raises while executing (file and line named, the
            original exception chained).
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
    if path in _executing:
        chain = " -> ".join([*_executing[_executing.index(path) :], path])
        raise ConfigError(f"config files import each other in a cycle: {chain}")
    module = types.ModuleType(f"lazytrain_config_{next(_counter)}_{os.path.basename(path)[:-3]}")
    module.__file__ = path
    module_builtins = dict(vars(builtins))
    module_builtins["__import__"] = _make_import(path)
    module.__dict__.update({"__builtins__": module_builtins, _FILE_KEY: path})
    _executing.append(path)
    try:
        exec(code, module.__dict__)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(
            f"error in config file {path}, line {_error_line(e, path)}: {type(e).__name__}: {e}"
        ) from e
    finally:
        _executing.pop()
    return module


def _is_dropped(value: Any) -> bool:
    """Module-level values a config leaves out: modules, classes, functions and typing constructs."""
    return (
        isinstance(value, types.ModuleType)
        or inspect.isclass(value)
        or inspect.isroutine(value)
        or type(value).__module__ == "typing"
    )


def public_values(module: types.ModuleType) -> dict[str, Any]:
    """The public module-level values of an executed config file, converted to config values.

    Dicts, lists, scalars (and what `to_config_value` converts: dataclass instances, enums, torch dtypes)
    are kept; modules, classes, functions and ``_private`` names are left out.

    Raises:
        ConfigError: naming the file and variable, for a public value a config cannot hold (e.g. an
            object built eagerly in the file; describe it with ``LazyCall`` or give it a ``_name``).
    """
    values = {}
    for name, value in vars(module).items():
        if name.startswith("_") or _is_dropped(value):
            continue
        try:
            values[name] = to_config_value(value, name=name)
        except ConfigError as e:
            raise ConfigError(
                f"config file {module.__file__}: {e} To keep a helper object out of the config, give it a "
                f"private name (_{name})."
            ) from None
    return values
