"""`LazyConfig`: load Python/YAML config files, save them as YAML, render them as Python, apply overrides."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config import tree
from lazytrain.config.lazy import to_config_value
from lazytrain.config.loading import execute_config_file, public_values
from lazytrain.config.overrides import apply_overrides
from lazytrain.config.rendering import render_python
from lazytrain.config.shipped_configs import get_config_file
from lazytrain.config.versioning import CONFIG_VERSION, VERSION_HEADER, read_version, upgrade_config
from lazytrain.errors import ConfigError

__all__ = ["LazyConfig"]

_YAML_SCALARS = (str, int, float, bool, type(None))
_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.1 (PyYAML) reads `1e-3` as a string; configs mean a float, as omegaconf's own loader does.
_FLOAT_PATTERN = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python objects) with the float rule above."""


_SafeLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SafeLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_PATTERN, list("-+0123456789."))


def _check_representable(cfg: DictConfig) -> None:
    """Raise naming the key path of the first value YAML cannot represent."""
    for entry in tree.walk(cfg):
        if isinstance(entry.node, (DictConfig, ListConfig)):
            continue  # its children come next in the walk
        value = tree.raw_value(entry.node)
        if not isinstance(value, _YAML_SCALARS):
            raise ConfigError(
                f"LazyConfig.save: '{entry.path}' holds {value!r} (type {type(value).__name__}), which YAML "
                "cannot represent. Describe it with LazyCall(...) in the config instead of a built object."
            )


class LazyConfig:
    """Load, save, render and override lazytrain configs (detectron2's LazyConfig, on Hydra's grammar)."""

    @staticmethod
    def load(path: str | os.PathLike) -> DictConfig:
        """Load a ``.py`` config (executed), a saved ``.yaml`` config, or a shipped config by its short name
        ``lazytrain://NAME`` (``lazytrain.conf``'s ``NAME.py``: the repository's ``conf/``).

        In a ``.py`` file, relative imports (``from .base import model``, ``from ..recipes.x import y``)
        load other config files by location, no ``__init__.py`` needed, each import a fresh execution;
        absolute imports are normal Python imports. The result holds the file's public module-level values:
        dicts, lists and scalars, plus dataclass instances/enums/dtypes converted by `to_config_value`;
        modules, classes, functions and ``_private`` names are left out. ``.yaml`` files are read with a
        safe loader; files saved by an older lazytrain get renamed keys upgraded (`versioning`).

        Args:
            path: the config file, or ``lazytrain://NAME``.

        Returns:
            The config.

        Raises:
            ConfigError: missing file (the path looked for) or shipped config (the closest names), syntax
                or runtime error (file and line), missing imported config file, ``from . import x``, import
                cycle, or a public value a config cannot hold (naming it).
        """
        path = get_config_file(os.fspath(path))
        if path.endswith(".py"):
            return tree.tuples_to_lists(OmegaConf.create(public_values(execute_config_file(path))))
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
            data = yaml.load(text, Loader=_SafeLoader)
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
        """Write `cfg` as YAML that `load` reads back to an equal config.

        Interpolations are written as they are (not resolved). The file starts with the comment
        ``# lazytrain-config-version: N`` (`versioning.CONFIG_VERSION`), so the version never becomes a
        config key. The file is written atomically; missing folders are created.

        Args:
            cfg: the config (a plain dict is accepted too; its values convert like LazyCall arguments).
            path: where to write.

        Raises:
            ConfigError: naming the key path of a value YAML cannot represent (nothing is written then).
        """
        if not isinstance(cfg, DictConfig):  # a plain dict: its values convert as LazyCall arguments do
            cfg = OmegaConf.create({str(k): to_config_value(v, name=str(k)) for k, v in cfg.items()})
        cfg = tree.tuples_to_lists(cfg)  # OmegaConf 2.4's TupleConfig, written as a list
        _check_representable(cfg)
        text = VERSION_HEADER.format(version=CONFIG_VERSION) + OmegaConf.to_yaml(cfg, resolve=False)
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    @staticmethod
    def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
        """Apply Hydra-grammar overrides (``a.b=1``, ``+a.c=2``, ``++a.d=3``, ``~a.e``) to `cfg` in place
        and return it; see `lazytrain.config.overrides.apply_overrides`."""
        return apply_overrides(cfg, overrides)

    @staticmethod
    def to_py(cfg: DictConfig, prefix: str = "") -> str:
        """Render `cfg` as a readable Python config file using ``LazyCall`` (no formatter needed).

        Args:
            cfg: the config.
            prefix: prepended to every top-level variable name.

        Returns:
            Python source that `LazyConfig.load` reads back to an equal config.
        """
        return render_python(cfg, prefix)
