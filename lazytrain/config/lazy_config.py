"""`LazyConfig`: load Python/YAML config files, save them as YAML, render them as Python, apply overrides."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config.lazy import get_dotted_path, locate, to_config_value
from lazytrain.config.loading import execute_config_file, public_values
from lazytrain.config.overrides import apply_overrides
from lazytrain.config.versioning import CONFIG_VERSION, VERSION_HEADER, read_version, upgrade_config
from lazytrain.errors import ConfigError

__all__ = ["LazyConfig"]

_YAML_SCALARS = (str, int, float, bool, type(None))


def _check_representable(node: Any, path: str) -> None:
    """Raise naming the key path of the first value YAML cannot represent."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            _check_representable(node._get_node(key), f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            _check_representable(node._get_node(index), f"{path}[{index}]")
    else:
        value = node._value()
        if not isinstance(value, _YAML_SCALARS):
            raise ConfigError(
                f"LazyConfig.save: '{path}' holds {value!r} (type {type(value).__name__}), which YAML cannot "
                "represent. Describe it with LazyCall(...) in the config instead of a built object."
            )


class LazyConfig:
    """Load, save, render and override lazytrain configs (detectron2's LazyConfig, on Hydra's grammar)."""

    @staticmethod
    def load(path: str | os.PathLike) -> DictConfig:
        """Load a ``.py`` config (executed; relative imports by file location) or a saved ``.yaml`` config.

        The result holds the file's public module-level values: dicts, lists and scalars.

        Raises:
            ConfigError: missing file, syntax error (file and line), missing imported config file.
        """
        path = os.fspath(path)
        if path.endswith(".py"):
            values = public_values(execute_config_file(path))
            return OmegaConf.create({key: to_config_value(value, name=key) for key, value in values.items()})
        if path.endswith((".yaml", ".yml")):
            return LazyConfig._load_yaml(path)
        raise ConfigError(f"LazyConfig.load: {path} is neither a .py nor a .yaml config file.")

    @staticmethod
    def _load_yaml(path: str) -> DictConfig:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {os.path.abspath(path)}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"invalid YAML in config file {path}: {e}") from e
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {path} must hold a mapping at top level; got {type(data).__name__}"
            )
        return upgrade_config(OmegaConf.create(data), read_version(text), source=path)

    @staticmethod
    def save(cfg: DictConfig, path: str | os.PathLike) -> None:
        """Write `cfg` as YAML (interpolations kept) with a version header; `load` reads it back equal.

        Raises:
            ConfigError: naming the key path of a value YAML cannot represent (nothing is written then).
        """
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.create(cfg)
        _check_representable(cfg, "")
        text = VERSION_HEADER.format(version=CONFIG_VERSION) + OmegaConf.to_yaml(cfg, resolve=False)
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    @staticmethod
    def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
        """Apply Hydra-grammar overrides (``a.b=1``, ``+a.c=2``, ``++a.d=3``, ``~a.e``) in place; see
        `lazytrain.config.overrides.apply_overrides`."""
        return apply_overrides(cfg, overrides)

    @staticmethod
    def to_py(cfg: DictConfig, prefix: str = "") -> str:
        """Render `cfg` as readable Python using ``LazyCall`` (no formatter needed)."""
        return _PythonRenderer().render(cfg, prefix)


@dataclasses.dataclass
class _PythonRenderer:
    imports: dict[str, str] = dataclasses.field(default_factory=dict)

    def render(self, cfg: DictConfig, prefix: str) -> str:
        body = [f"{prefix}{key} = {self._value(cfg._get_node(key), 0)}" for key in cfg.keys()]
        header = ["from lazytrain.config import LazyCall as L"]
        header += sorted(f"from {module} import {name}" for name, module in self.imports.items())
        return "\n".join(header) + "\n\n" + "\n".join(body) + "\n"

    def _target_name(self, path: str) -> str:
        try:
            obj = locate(path)
            dotted = get_dotted_path(obj)
        except (ImportError, ConfigError):
            return repr(path)
        qualname = obj.__qualname__
        module, head = dotted[: -len(qualname) - 1], qualname.split(".")[0]
        if self.imports.setdefault(head, module) != module:
            return repr(path)
        return qualname

    def _value(self, node: Any, indent: int) -> str:
        pad, inner = "    " * indent, "    " * (indent + 1)
        if isinstance(node, DictConfig):
            keys = list(node.keys())
            if "_target_" in keys and isinstance(node._get_node("_target_")._value(), str):
                target = self._target_name(node._get_node("_target_")._value())
                args = node._get_node("_args_") if "_args_" in keys else []
                items = [self._value(args._get_node(i), indent + 1) for i in range(len(args))]
                items += [
                    f"{k}={self._value(node._get_node(k), indent + 1)}"
                    for k in keys
                    if k not in ("_target_", "_args_")
                ]
                return (
                    f"L({target})("
                    + "".join(f"\n{inner}{i}," for i in items)
                    + (f"\n{pad})" if items else ")")
                )
            items = [f"{k!r}: {self._value(node._get_node(k), indent + 1)}" for k in keys]
            return "{" + "".join(f"\n{inner}{i}," for i in items) + (f"\n{pad}}}" if items else "}")
        if isinstance(node, ListConfig):
            items = [self._value(node._get_node(i), indent + 1) for i in range(len(node))]
            return "[" + "".join(f"\n{inner}{i}," for i in items) + (f"\n{pad}]" if items else "]")
        value = node._value() if hasattr(node, "_value") else node
        return repr(value)
