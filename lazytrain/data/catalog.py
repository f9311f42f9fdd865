"""`DatasetCatalog` (name -> function returning records) and `MetadataCatalog` (name -> metadata).

Built-in names (``coco_2017_*``, ``lvis_v1_*``, ``synthetic_lt_*``) are registered on first lookup by
`lazytrain.data.datasets.builtin`; register your own with ``DatasetCatalog.register(name, func)`` and
``MetadataCatalog.get(name).set(...)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

__all__ = ["DatasetCatalog", "Metadata", "MetadataCatalog"]


def _ensure_builtin() -> None:
    from lazytrain.data.datasets import builtin

    builtin.register_all()


class _DatasetCatalog:
    def __init__(self) -> None:
        self._functions: dict[str, Callable[[], list[dict]]] = {}

    def register(self, name: str, func: Callable[[], list[dict]]) -> None:
        """Register `func` (no arguments, returns a list of records) under `name`."""
        if not callable(func):
            raise TypeError(f"DatasetCatalog.register(func=) must be callable; got {func!r}")
        if name in self._functions:
            raise ValueError(
                f"DatasetCatalog: '{name}' is already registered; remove it first to replace it."
            )
        self._functions[name] = func

    def get(self, name: str) -> list[dict]:
        """Call the function registered under `name` and return its records."""
        _ensure_builtin()
        if name not in self._functions:
            names = sorted(self._functions)
            close = difflib.get_close_matches(name, names, n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise KeyError(
                f"DatasetCatalog: dataset '{name}' is not registered.{hint} Registered: {', '.join(names)}. "
                "Register yours with DatasetCatalog.register(name, func)."
            )
        return self._functions[name]()

    def list(self) -> list[str]:
        _ensure_builtin()
        return sorted(self._functions)

    def remove(self, name: str) -> None:
        self._functions.pop(name, None)

    def __contains__(self, name: str) -> bool:
        _ensure_builtin()
        return name in self._functions


class Metadata(SimpleNamespace):
    """Attributes of a dataset (thing_classes, json_file, image_root, evaluator_type, ...)."""

    def set(self, **kwargs: Any) -> Metadata:
        for key, value in kwargs.items():
            setattr(self, key, value)
        return self

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class _MetadataCatalog:
    def __init__(self) -> None:
        self._metadata: dict[str, Metadata] = {}

    def get(self, name: str) -> Metadata:
        """The metadata of `name` (created empty on first access)."""
        _ensure_builtin()
        return self._metadata.setdefault(name, Metadata(name=name))

    def remove(self, name: str) -> None:
        self._metadata.pop(name, None)


DatasetCatalog = _DatasetCatalog()
MetadataCatalog = _MetadataCatalog()
