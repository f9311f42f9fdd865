"""Records of COCO/LVIS json files served from their cache files (`annotation_cache`), shared by all processes.

`load_cached_json` gives a data set's records as `CachedRecords`: a sequence whose items are the dicts
`load_coco_json`/`load_lvis_json` return (fresh ones on each access), read from the memory-mapped cache file,
which the first process on the machine writes (`annotation_cache`). It also carries the arrays that
repeat-factor sampling (`category_index`) and aspect grouping (`aspect_groups`) read, so neither touches a
record. Several files concatenate and images without annotations can be left out (`concatenate`) without
copying a record. Pickled (into a spawned loader worker, a spawned rank) it is the cache files' paths and
keys: the receiving process maps the same files.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lazytrain.data.datasets.annotation_cache import (
    CacheFile,
    CacheLock,
    get_cache_key,
    get_cache_path,
    read_cache_file,
    write_cache_file,
)
from lazytrain.data.datasets.coco import read_json, records_from_coco_dict, set_coco_metadata
from lazytrain.data.datasets.lvis import get_class_image_count, records_from_lvis_dict, set_lvis_metadata
from lazytrain.data.datasets.record_stream import decode_json_file
from lazytrain.errors import LazytrainError
from lazytrain.utils.file_io import PathManager

__all__ = ["CachedRecords", "load_cached_json", "open_cache"]

logger = logging.getLogger(__name__)


def _category_metadata(categories: list[dict]) -> list[dict]:
    """The category fields the metadata uses (a full LVIS category also has synonyms and a definition)."""
    fields = ("id", "name", "image_count", "frequency")
    return [{key: c[key] for key in fields if key in c} for c in categories]


def _parse_typed(json_file: str, image_root: str, lvis: bool) -> tuple[Any, dict] | None:
    """(records iterator, metadata) from the typed decode; None when the plain loader must read the file."""
    decoded = decode_json_file(json_file, image_root, lvis=lvis)
    if decoded is None:
        return None
    metadata: dict[str, Any] = {"categories": _category_metadata(decoded.categories)}
    if lvis:
        metadata["class_image_count"] = get_class_image_count(decoded.categories, decoded.annotation_pairs)
    return decoded, metadata


def _parse_plain(json_file: str, image_root: str, lvis: bool) -> tuple[list[dict], dict]:
    """(records, metadata) from `read_json` and the plain loaders, which raise their errors for bad files."""
    data = read_json(json_file)
    records = (records_from_lvis_dict if lvis else records_from_coco_dict)(data, json_file, image_root)
    categories = sorted(data["categories"], key=lambda c: c["id"])
    metadata: dict[str, Any] = {"categories": _category_metadata(categories)}
    if lvis:
        pairs = ((a["image_id"], a["category_id"]) for a in data.get("annotations") or [])
        metadata["class_image_count"] = get_class_image_count(categories, pairs)
    return records, metadata


def _build(path: str, json_file: str, image_root: str, lvis: bool, key: dict) -> None:
    """Parse `json_file` and write its cache file (under the lock)."""
    typed = _parse_typed(json_file, image_root, lvis)
    if typed is not None:
        decoded, metadata = typed
        try:
            write_cache_file(path, decoded.records(), metadata, key)
        except (TypeError, KeyError, IndexError, AttributeError, ValueError):
            typed = None  # an annotation the plain loader must judge (a box that is not a list, ...)
        else:
            if decoded.dropped:
                summary = ", ".join(f"{count} {what}" for what, count in sorted(decoded.dropped.items()))
                logger.warning("%s: dropped %s.", json_file, summary)
    if typed is None:
        records, metadata = _parse_plain(json_file, image_root, lvis)
        write_cache_file(path, records, metadata, key)
    logger.info("Wrote the cache file %s of %s.", path, json_file)


def open_cache(
    json_file: str, image_root: str, *, lvis: bool, content_hash: bool = False
) -> CacheFile | None:
    """The cache file of `json_file`, written first when absent or stale; None when it cannot be written
    (the cache folder is read-only) and none is valid.

    Raises:
        FileNotFoundError, ValueError: the plain loaders' errors for a missing or bad json (before anything is
            written).
    """
    if not os.path.isfile(json_file):
        read_json(json_file)  # its error names the file and $LAZYTRAIN_DATASETS
    key = get_cache_key(json_file, image_root, lvis=lvis, content_hash=content_hash)
    path = get_cache_path(json_file, image_root, lvis=lvis)
    cache = read_cache_file(path)
    if cache is not None and cache.key == key:
        return cache
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with CacheLock(path, json_file):
            cache = read_cache_file(path)  # written by the process this one waited for
            if cache is None or cache.key != key:
                _build(path, json_file, image_root, lvis, key)
                cache = read_cache_file(path)
    except OSError as e:  # a read-only or full cache folder: the plain loader still gives the records
        logger.warning(
            "Cannot write the annotation cache for %s (%s); each process parses the json. Set LAZYTRAIN_CACHE to "
            "a writable folder.",
            json_file,
            e,
        )
        return None
    return cache


def _set_metadata(dataset_name: str, cache: CacheFile, json_file: str, image_root: str, lvis: bool) -> None:
    data = {"categories": cache.metadata["categories"]}
    if lvis:
        set_lvis_metadata(dataset_name, data, json_file, image_root, cache.metadata["class_image_count"])
        return
    from lazytrain.data.catalog import MetadataCatalog

    evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type") or "coco"
    set_coco_metadata(dataset_name, data, json_file, image_root, evaluator_type)


def load_cached_json(
    json_file: str,
    image_root: str,
    dataset_name: str | None = None,
    *,
    lvis: bool,
    content_hash: bool = False,
) -> CachedRecords | list[dict]:
    """The records of `load_lvis_json` (``lvis=True``) or `load_coco_json`, served from the json's cache file.

    Falls back to the plain loader for a file iopath reads from elsewhere (a URL) and where the cache cannot
    be written.

    Args:
        json_file: the annotation file.
        image_root: joined before each image's ``file_name``.
        dataset_name: when given, its `MetadataCatalog` entry is set as the plain loader sets it.
        lvis: read LVIS's fields (``coco_url``, negative and not-exhaustive category ids, frequencies).
        content_hash: key the cache on the json's sha256 too (see `get_cache_key`).
    """
    local = os.path.isfile(json_file) or not PathManager.exists(json_file)
    cache = open_cache(json_file, image_root, lvis=lvis, content_hash=content_hash) if local else None
    if cache is None:
        from lazytrain.data.datasets.coco import load_coco_json
        from lazytrain.data.datasets.lvis import load_lvis_json

        return (load_lvis_json if lvis else load_coco_json)(json_file, image_root, dataset_name)
    if dataset_name is not None:
        _set_metadata(dataset_name, cache, json_file, image_root, lvis)
    records = CachedRecords([cache])
    logger.info(
        "Loaded %d images with %d annotations from %s (cache %s)",
        len(records),
        int(cache.arrays["annotation_counts"].sum()),
        json_file,
        cache.path,
    )
    return records


def _reopen(path: str, key: dict) -> CacheFile:
    cache = read_cache_file(path)
    if cache is None or cache.key != key:
        raise LazytrainError(
            f"the annotation cache file {path} of {key['json_file']} changed or went away while a run used it "
            "(the json was modified, or the cache cleared). Restart the run; it rebuilds the file."
        )
    return cache


class CachedRecords(Sequence):
    """Records of one or several cache files, in order, optionally without the images lacking annotations.

    Items are fresh dicts (a mapper may modify them). Build it with `load_cached_json` and `concatenate`.

    Args:
        files: the mapped cache files, in order.
        filter_empty: leave out the images without annotations.
    """

    def __init__(self, files: Sequence[CacheFile], filter_empty: bool = False) -> None:
        self._files = list(files)
        self._filter_empty = filter_empty
        self._setup()

    def _setup(self) -> None:
        sizes = [len(f) for f in self._files]
        self._starts = np.cumsum([0, *sizes]).tolist()
        self._kept: np.ndarray | None = None
        if self._filter_empty:
            counts = self._array("annotation_counts")
            self._kept = np.flatnonzero(counts > 0)

    @classmethod
    def concatenate(cls, parts: Sequence[CachedRecords], filter_empty: bool = False) -> CachedRecords:
        """The records of `parts` in order (their own filtering is ignored), leaving out the images without
        annotations when `filter_empty`."""
        return cls([f for part in parts for f in part._files], filter_empty)

    def __getstate__(self) -> dict:
        return {"files": [(f.path, f.key) for f in self._files], "filter_empty": self._filter_empty}

    def __setstate__(self, state: dict) -> None:
        self._files = [_reopen(path, key) for path, key in state["files"]]
        self._filter_empty = state["filter_empty"]
        self._setup()

    def __len__(self) -> int:
        return self._starts[-1] if self._kept is None else len(self._kept)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"CachedRecords index {index} out of range for {len(self)} records")
        position = int(self._kept[index]) if self._kept is not None else int(index)
        part = bisect.bisect_right(self._starts, position) - 1
        return self._files[part].get_record(position - self._starts[part])

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(len(self)))

    def _array(self, name: str) -> np.ndarray:
        """`name` of every file, concatenated (no copy for one file), before filtering."""
        arrays = [f.arrays[name] for f in self._files]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def _select(self, values: np.ndarray) -> np.ndarray:
        return values if self._kept is None else values[self._kept]

    @property
    def cache_paths(self) -> list[str]:
        """The cache files the records come from."""
        return [f.path for f in self._files]

    @property
    def annotation_counts(self) -> np.ndarray:
        """int64 [N]: annotations per image."""
        return self._select(self._array("annotation_counts"))

    @property
    def image_sizes(self) -> np.ndarray:
        """float64 [N, 2]: each image's (height, width) from its record (NaN where not a number)."""
        return np.stack([self._select(self._array("heights")), self._select(self._array("widths"))], axis=1)

    @property
    def aspect_groups(self) -> np.ndarray | None:
        """int8 [N]: 1 for landscape (w > h), 0 otherwise, as `get_aspect_groups` reads records; None when
        some record lacks a comparable size."""
        if any("aspect_groups" not in f.arrays for f in self._files):
            return None
        return self._select(self._array("aspect_groups"))

    def get_category_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offsets int64 [N + 1], categories int32 [M], instances int32 [M]): each image's distinct
        categories, ascending, and its annotation count of each (`CategoryIndex`'s arrays; writable copies)."""
        offsets, categories, instances = [], [], []
        base = 0
        for f in self._files:
            offsets.append(f.arrays["category_offsets"][:-1] + base)
            base += int(f.arrays["category_offsets"][-1])
            categories.append(f.arrays["categories"])
            instances.append(f.arrays["instances"])
        starts = np.concatenate([*offsets, [base]])
        # Copies (a few MB at LVIS size): torch takes these arrays as tensors, which must be writable.
        categories_all, instances_all = np.concatenate(categories), np.concatenate(instances)
        if self._kept is None:
            return starts.astype(np.int64), categories_all, instances_all
        lengths = np.diff(starts)[self._kept]
        new_offsets = np.zeros(len(self._kept) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        entries = np.repeat(starts[self._kept] - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
        return new_offsets, categories_all[entries], instances_all[entries]
