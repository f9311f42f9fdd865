"""`DatasetCatalog` (name -> function returning records) and `MetadataCatalog` (name -> metadata).

The built-in names (``coco_2017_{train,val}``, ``lvis_v1_{train,val}``, ``synthetic_lt_{train,val}``) are
registered the first time either catalog is used, so importing this module is enough: ``lazytrain.data``,
which Python imports first, hands them over (`register_on_first_use`). This module imports no loader, as
the loaders use it. Registration does no I/O: the files are found under ``$LAZYTRAIN_DATASETS`` when a data
set is loaded. Register your own data set with::

    DatasetCatalog.register("my_train", lambda: load_coco_json(json_file, image_root, "my_train"))
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

__all__ = ["DatasetCatalog", "Metadata", "MetadataCatalog", "UnknownDatasetError", "register_on_first_use"]


class UnknownDatasetError(KeyError):
    """A data set name that is not registered (a `KeyError` whose message prints unquoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_pending: list[tuple[str, Callable[[], list[dict]], str]] = []


def register_on_first_use(datasets: Iterable[tuple[str, Callable[[], list[dict]], str]]) -> None:
    """Register ``(name, loader, evaluator_type)`` data sets when either catalog is next used, not now.

    A name already registered by then keeps its registration. ``import lazytrain.data`` hands over the
    built-in data sets this way (`lazytrain.data.datasets.builtin.get_builtin_datasets`).
    """
    _pending.extend(datasets)


def _register_pending() -> None:
    """Register what `register_on_first_use` left pending (on every use of a catalog; cheap once done)."""
    if not _pending:
        return
    # Taken off the list first: `register` below calls this function again.
    entries = list(_pending)
    _pending.clear()
    for name, loader, evaluator_type in entries:
        if name not in DatasetCatalog:
            DatasetCatalog.register(name, loader)
            MetadataCatalog.get(name).set(evaluator_type=evaluator_type)


class _DatasetCatalog:
    """Maps a data set name to a function that takes no argument and returns its records."""

    def __init__(self) -> None:
        self._functions: dict[str, Callable[[], list[dict]]] = {}

    def register(self, name: str, func: Callable[[], list[dict]]) -> None:
        """Register `func` (no arguments, returns a list of records) under `name`.

        Args:
            name: the data set name used in configs, e.g. ``"my_train"``.
            func: called on every `get`; cache inside it if loading is slow.
        """
        _register_pending()
        if not callable(func):
            raise TypeError(f"DatasetCatalog.register(func=) must be callable; got {func!r}")
        if name in self._functions:
            raise ValueError(
                f"DatasetCatalog.register: '{name}' is already registered; call DatasetCatalog.remove('{name}') "
                "first to replace it."
            )
        self._functions[name] = func

    def get(self, name: str) -> list[dict]:
        """Load and return the records of `name`.

        Raises:
            UnknownDatasetError: `name` is not registered; the message lists the registered names, closest first.
        """
        _register_pending()
        func = self._functions.get(name)
        if func is None:
            raise UnknownDatasetError(_unknown_name_message(name, self._functions))
        return func()

    def list(self) -> list[str]:
        """The registered names, sorted."""
        _register_pending()
        return sorted(self._functions)

    def remove(self, name: str) -> None:
        """Forget `name` (no error when it is not registered)."""
        _register_pending()
        self._functions.pop(name, None)

    def __contains__(self, name: str) -> bool:
        _register_pending()
        return name in self._functions


def _unknown_name_message(name: str, registered: dict) -> str:
    names = sorted(registered)
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    ordered = close + [n for n in names if n not in close]
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return (
        f"DatasetCatalog: data set {name!r} is not registered.{hint} Registered names (closest first): "
        f"{', '.join(ordered)}. Register a new one with DatasetCatalog.register(name, func)."
    )


class Metadata(SimpleNamespace):
    """Attributes of one data set: ``thing_classes``, ``thing_dataset_id_to_contiguous_id``, ``json_file``,
    ``image_root``, ``evaluator_type``, and for LVIS-style sets ``class_image_count`` and ``class_frequency``.

    Attributes are set by the loaders when the data set is loaded, or by hand with `set`.
    """

    def set(self, **kwargs: Any) -> Metadata:
        """Set several attributes; returns self so calls can be chained."""
        for key, value in kwargs.items():
            setattr(self, key, value)
        return self

    def get(self, key: str, default: Any = None) -> Any:
        """The attribute `key`, or `default` when it is not set."""
        return getattr(self, key, default)

    def as_dict(self) -> dict[str, Any]:
        """A shallow copy of the attributes."""
        return dict(vars(self))


class _MetadataCatalog:
    """Maps a data set name to its `Metadata` (created empty on first access)."""

    def __init__(self) -> None:
        self._metadata: dict[str, Metadata] = {}

    def get(self, name: str) -> Metadata:
        """The metadata of `name`, created empty on first access (it fills in when the data set loads)."""
        _register_pending()
        metadata = self._metadata.get(name)
        if metadata is None:
            metadata = self._metadata[name] = Metadata(name=name)
        return metadata

    def list(self) -> list[str]:
        """Names that have metadata, sorted."""
        _register_pending()
        return sorted(self._metadata)

    def remove(self, name: str) -> None:
        """Forget the metadata of `name`."""
        self._metadata.pop(name, None)


DatasetCatalog = _DatasetCatalog()
MetadataCatalog = _MetadataCatalog()
