"""`instantiate`: build the objects a config describes, recursively, with Hydra's special keys.

- ``_target_``: dotted path of what to call, or a lazy-call node that is built first and whose result is
  called (a "lazy target", e.g. a factory returning a class or function).
- ``_args_``: positional arguments. ``_partial_: true``: return ``functools.partial`` instead of calling.
- ``_recursive_: false``: arguments are passed as config nodes, unbuilt (the callee may instantiate them).
- ``_convert_``: what a callee receives for argument containers without ``_target_``. ``"all"`` (the default
  here, unlike Hydra's ``"none"``), ``"partial"`` and ``"object"`` give plain ``dict``/``list`` (they differ
  in Hydra only for structured configs, which lazytrain does not use); ``"none"`` gives omegaconf
  containers holding the built values. As in Hydra, a node without ``_convert_`` inherits its parent's.

A node reached from several places through interpolation (``sampler.dataset_dicts: ${..dataset}``) is built
once per `instantiate` call and the same object is shared. Values that are not configs (built objects,
scalars) pass through unchanged. Errors name the config key path and the target, the cause chained.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lazytrain.config import tree
from lazytrain.config.lazy import RESERVED_KEYS, locate
from lazytrain.errors import ConfigError

__all__ = ["instantiate", "InstantiationError"]

CONVERT_MODES = ("none", "partial", "object", "all")
_DEFAULT_CONVERT = "all"


class InstantiationError(ConfigError):
    """Building a config node failed; the message names its key path and target."""


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class _Builder:
    """One `instantiate` call: walks the config and remembers what it built."""

    def __init__(self) -> None:
        # id(node) -> (node, result). Nodes reached through an interpolation are the very node objects of
        # the tree, so identity is the node's place in the config; holding the node keeps its id unique.
        self.built: dict[int, tuple[Any, Any]] = {}

    def child(self, node: DictConfig | ListConfig, key: Any, path: str) -> tuple[Any, str]:
        """A child and its key path: a config node when it is one (interpolations followed, the path then
        being the referenced node's), else its resolved value."""
        child_path = _join(path, key)
        try:
            child = tree.child(node, key)
            if tree.is_interpolation(child):
                child = tree.dereference(child)
                if isinstance(child, (DictConfig, ListConfig)) and tree.full_key(child):
                    child_path = tree.full_key(child)
            if isinstance(child, (DictConfig, ListConfig)):
                return child, child_path
            return node[key], child_path
        except OmegaConfBaseException as e:
            raise InstantiationError(f"cannot read config key '{child_path}': {e}") from e

    def build(self, node: Any, path: str, convert: str) -> Any:
        """Build any config value: lazy calls become objects, containers are walked."""
        if not isinstance(node, (DictConfig, ListConfig)):
            return node
        if tree.is_none(node):
            return None
        if isinstance(node, DictConfig) and "_target_" in node:
            return self.build_call(node, path, convert)
        if isinstance(node, DictConfig):
            items: Any = {}
            for key in node.keys():
                value, value_path = self.child(node, key, path)
                items[str(key)] = self.build(value, value_path, convert)
        else:
            items = []
            for index in range(len(node)):
                value, value_path = self.child(node, index, path)
                items.append(self.build(value, value_path, convert))
        return OmegaConf.create(items, flags={"allow_objects": True}) if convert == "none" else items

    def build_call(
        self, node: DictConfig, path: str, convert: str, extra: Mapping[str, Any] | None = None
    ) -> Any:
        """Build a lazy-call node once; `extra` (top-level kwargs) makes a one-off call that is not cached."""
        if not extra and id(node) in self.built:
            return self.built[id(node)][1]
        raw_target = tree.child(node, "_target_")
        target_name = "<lazy target>" if isinstance(raw_target, DictConfig) else tree.raw_value(raw_target)
        try:
            result = self.call(node, path, convert, dict(extra or {}))
        except InstantiationError:
            raise  # already names the innermost failing key
        except Exception as e:
            raise InstantiationError(
                f"error instantiating '{path or '<root>'}' (_target_: {target_name}): {type(e).__name__}: {e}"
            ) from e
        if not extra:
            self.built[id(node)] = (node, result)
        return result

    def setting(self, node: DictConfig, extra: dict[str, Any], key: str, default: Any) -> Any:
        if key in extra:
            return extra.pop(key)
        return node.get(key, default)

    def call(self, node: DictConfig, path: str, convert: str, extra: dict[str, Any]) -> Any:
        recursive = bool(self.setting(node, extra, "_recursive_", True))
        partial = bool(self.setting(node, extra, "_partial_", False))
        convert = str(self.setting(node, extra, "_convert_", convert))
        if convert not in CONVERT_MODES:
            raise ValueError(f"_convert_ must be one of {CONVERT_MODES}; got {convert!r}")
        target = self.target(node, path, convert, extra)
        if "_args_" in extra:
            args = list(extra.pop("_args_"))
        elif "_args_" in node:
            raw_args, args_path = self.child(node, "_args_", path)
            args = [self.argument(raw_args, i, args_path, recursive, convert) for i in range(len(raw_args))]
        else:
            args = []
        kwargs = {
            str(key): self.argument(node, key, path, recursive, convert)
            for key in node.keys()
            if key not in RESERVED_KEYS and key not in extra
        }
        kwargs.update(extra)  # passed as given: built objects handed over by the program
        return functools.partial(target, *args, **kwargs) if partial else target(*args, **kwargs)

    def target(self, node: DictConfig, path: str, convert: str, extra: dict[str, Any]) -> Any:
        if "_target_" in extra:
            target = extra.pop("_target_")
        else:
            target, target_path = self.child(node, "_target_", path)
            if isinstance(target, DictConfig):
                target = self.build_call(target, target_path, convert)
        if isinstance(target, str):
            target = locate(target)
        if not callable(target):
            raise TypeError(f"_target_ must be callable; got {target!r}")
        return target

    def argument(
        self, node: DictConfig | ListConfig, key: Any, path: str, recursive: bool, convert: str
    ) -> Any:
        value, value_path = self.child(node, key, path)
        return self.build(value, value_path, convert) if recursive else value


def instantiate(cfg: Any, /, **kwargs: Any) -> Any:
    """Build the object(s) described by `cfg`.

    Args:
        cfg: a lazy-call node, or any config/container holding them (plain dicts/lists work too). Other
            values are returned unchanged.
        **kwargs: extra keyword arguments for the top-level call; they override keys of the same name and
            are passed as given, not converted (programs hand built objects this way, e.g.
            ``instantiate(cfg.train.trainer, model=model, optimizer=optimizer)``). Hydra's keys
            (``_partial_``, ``_convert_``, ``_recursive_``, ``_args_``, ``_target_``) given here override
            the node's setting instead; for a container without ``_target_`` only ``_convert_`` applies.

    Returns:
        The built object; containers without ``_target_`` become plain dicts/lists of built values
        (omegaconf containers with ``_convert_="none"``).

    Raises:
        InstantiationError: naming the failing key path and target, with the original exception chained.
        TypeError: keyword arguments other than ``_convert_`` for a config without ``_target_``.
    """
    if isinstance(cfg, (dict, list)):
        cfg = OmegaConf.create(cfg, flags={"allow_objects": True})
    builder = _Builder()
    if isinstance(cfg, DictConfig) and "_target_" in cfg:
        return builder.build_call(cfg, tree.full_key(cfg), _DEFAULT_CONVERT, kwargs)
    convert = str(kwargs.pop("_convert_", _DEFAULT_CONVERT))
    if kwargs:
        raise TypeError(
            f"instantiate(**kwargs) passes keyword arguments to a '_target_', but this config has none; "
            f"got {sorted(kwargs)}"
        )
    if convert not in CONVERT_MODES:
        raise ValueError(f"instantiate(_convert_=) must be one of {CONVERT_MODES}; got {convert!r}")
    return builder.build(cfg, tree.full_key(cfg) if OmegaConf.is_config(cfg) else "", convert)
