"""`instantiate`: build the objects a config describes, recursively, with Hydra's special keys.

- ``_target_``: dotted path (or a lazy-call node, built first, whose result is called).
- ``_args_``: positional arguments. ``_partial_: true``: return ``functools.partial`` instead of calling.
- ``_recursive_: false``: children are passed as config nodes, unbuilt.
- ``_convert_``: how containers without a target reach the callee: ``"all"`` (default here), ``"partial"``
  and ``"object"`` give plain ``dict``/``list``; ``"none"`` gives omegaconf containers.

A node reached from several places through interpolation (``sampler.dataset_dicts: ${..dataset}``) is built
once per `instantiate` call and the same object is shared. Errors name the key path and the target.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lazytrain.config.lazy import RESERVED_KEYS, locate
from lazytrain.errors import ConfigError

__all__ = ["instantiate", "InstantiationError"]

_CONVERT_MODES = ("none", "partial", "object", "all")


class InstantiationError(ConfigError):
    """Building a config node failed; the message names its key path and target."""


def _full_key(node: Any) -> str:
    key = node._get_full_key(None)
    return str(key) if key is not None else ""


class _Builder:
    def __init__(self) -> None:
        self.built: dict[str, Any] = {}

    def build(self, node: Any, path: str, convert: str) -> Any:
        """Build any config value: lazy calls become objects, containers are walked."""
        if isinstance(node, DictConfig):
            if node._is_none():
                return None
            if "_target_" in node:
                return self.build_call(node, path)
            items = {str(k): self.build(self.child(node, k, path), self.join(path, k), convert) for k in node}
            return OmegaConf.create(items, flags={"allow_objects": True}) if convert == "none" else items
        if isinstance(node, ListConfig):
            if node._is_none():
                return None
            items = [self.build(self.child(node, i, path), f"{path}[{i}]", convert) for i in range(len(node))]
            return OmegaConf.create(items, flags={"allow_objects": True}) if convert == "none" else items
        return node

    @staticmethod
    def join(path: str, key: Any) -> str:
        return f"{path}.{key}" if path else str(key)

    def child(self, node: Any, key: Any, path: str) -> Any:
        """A child as a config node when it is one (interpolations followed), else its resolved value."""
        try:
            child = node._get_node(key)
            if child._is_interpolation():
                child = child._dereference_node()
            if isinstance(child, (DictConfig, ListConfig)):
                return child
            return node[key]
        except OmegaConfBaseException as e:
            raise InstantiationError(f"cannot read config key '{self.join(path, key)}': {e}") from e

    def build_call(self, node: DictConfig, path: str, extra: Mapping[str, Any] | None = None) -> Any:
        cache_key = _full_key(node)
        if not extra and cache_key in self.built:
            return self.built[cache_key]
        raw_target = node._get_node("_target_")
        target_name = raw_target._value() if not isinstance(raw_target, DictConfig) else "<lazy target>"
        try:
            result = self.call(node, path, extra or {})
        except InstantiationError:
            raise
        except Exception as e:
            where = path or "<root>"
            raise InstantiationError(
                f"error instantiating '{where}' (_target_: {target_name}): {type(e).__name__}: {e}"
            ) from e
        if not extra:
            self.built[cache_key] = result
        return result

    def call(self, node: DictConfig, path: str, extra: Mapping[str, Any]) -> Any:
        target = self.child(node, "_target_", path)
        if isinstance(target, DictConfig):
            target = self.build_call(target, self.join(path, "_target_"))
        elif isinstance(target, str):
            target = locate(target)
        if not callable(target):
            raise TypeError(f"_target_ must be callable; got {target!r}")
        recursive = bool(node["_recursive_"]) if "_recursive_" in node else True
        partial = bool(node["_partial_"]) if "_partial_" in node else False
        convert = str(node["_convert_"]) if "_convert_" in node else "all"
        if convert not in _CONVERT_MODES:
            raise ValueError(f"_convert_ must be one of {_CONVERT_MODES}; got {convert!r}")
        args = []
        if "_args_" in node:
            raw_args = self.child(node, "_args_", path)
            args = [
                self.argument(self.child(raw_args, i, path), f"{path}._args_[{i}]", recursive, convert)
                for i in range(len(raw_args))
            ]
        kwargs = {
            str(key): self.argument(self.child(node, key, path), self.join(path, key), recursive, convert)
            for key in node
            if key not in RESERVED_KEYS and key not in extra
        }
        kwargs.update(extra)
        return functools.partial(target, *args, **kwargs) if partial else target(*args, **kwargs)

    def argument(self, value: Any, path: str, recursive: bool, convert: str) -> Any:
        if not recursive:
            return value
        return self.build(value, path, convert)


def instantiate(cfg: Any, /, **kwargs: Any) -> Any:
    """Build the object(s) described by `cfg`.

    Args:
        cfg: a lazy-call node, or any config/container holding them (plain dicts/lists work too).
        **kwargs: extra keyword arguments for the top-level call; they override keys of the same name and
            are passed as given (used by programs to hand built objects, e.g. the model, to a trainer node).

    Returns:
        The built object; containers without ``_target_`` become plain dicts/lists of built values.

    Raises:
        InstantiationError: naming the failing key path and target, with the original exception chained.
    """
    if isinstance(cfg, (dict, list)) and not isinstance(cfg, (DictConfig, ListConfig)):
        cfg = OmegaConf.create(cfg, flags={"allow_objects": True})
    builder = _Builder()
    if isinstance(cfg, DictConfig) and "_target_" in cfg:
        return builder.build_call(cfg, _full_key(cfg), kwargs)
    if kwargs:
        raise TypeError("instantiate(**kwargs) needs a config node with '_target_' to pass them to")
    if isinstance(cfg, (DictConfig, ListConfig)):
        return builder.build(cfg, _full_key(cfg), "all")
    return cfg
