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
import errno
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lazytrain.data.datasets.annotation_cache import (
    CacheLock,
    CacheWriter,
    get_cache_dir,
    get_cache_key,
    get_cache_path,
    get_json_signature,
    get_node_local_dir,
    get_parse_failure,
    is_same_source,
    make_private_folder,
    move_aside,
    read_cache_file,
    record_parse_failure,
)
from lazytrain.data.datasets.cache_file import CacheFile, CacheFileError
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


# Errors that make a folder unusable for the cache (then the next folder is tried); any other OSError is raised.
_UNUSABLE_FOLDER = frozenset(
    {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST}
)
_SIZE_RATIO = 1.25  # cache file bytes per json byte, with margin (1.1 GB for LVIS's 900 MiB json)


class _JsonChanged(Exception):
    """The json changed (its stat signature or its content) between its hash and the end of its parse."""


def _is_unchanged(json_file: str, image_root: str, lvis: bool, key: dict) -> bool:
    """Whether `json_file` is still the file `key` was made from: the same stat signature (any write sets the
    ctime, so a json changed and changed back differs too) and the same content (the memo answers at once)."""
    if get_json_signature(json_file) != key["stat"]:
        return False
    return is_same_source(get_cache_key(json_file, image_root, lvis=lvis), key)


def _build(writer: CacheWriter, json_file: str, image_root: str, lvis: bool, key: dict) -> bool:
    """Parse `json_file` into `writer` and publish it; False when another process published the name first.

    Raises:
        _JsonChanged: the json is not the file the key was made from (nothing published): the parse may have read
            other content, which must not go under the key's name, nor its error be kept as the key's.
    """
    try:
        typed = _parse_typed(json_file, image_root, lvis)
        if typed is not None:
            decoded, metadata = typed
            try:
                writer.write(decoded.records(), metadata, key)
            except (TypeError, KeyError, IndexError, AttributeError, ValueError):
                typed = None  # an annotation the plain loader must judge (a box that is not a list, ...)
            else:
                if decoded.dropped:
                    summary = ", ".join(f"{count} {what}" for what, count in sorted(decoded.dropped.items()))
                    logger.warning("%s: dropped %s.", json_file, summary)
        if typed is None:
            records, metadata = _parse_plain(json_file, image_root, lvis)
            writer.write(records, metadata, key)
    except (ValueError, TypeError) as e:
        if not _is_unchanged(json_file, image_root, lvis, key):  # a half-written json is not this content's
            raise _JsonChanged(json_file) from e
        raise
    if not _is_unchanged(json_file, image_root, lvis, key):
        raise _JsonChanged(json_file)
    return writer.publish()


def _find(key: dict, folder: str, repair: bool = False) -> CacheFile | None:
    """The valid cache file of `key` in `folder`. An invalid file there is moved aside with one warning when
    `repair` (the caller holds its lock); else it is passed over."""
    path = get_cache_path(key, folder)
    try:
        cache = read_cache_file(path)
        if cache is not None and not is_same_source(cache.key, key):
            raise CacheFileError(path, f"built from another json (sha256 {cache.key.get('sha256')!r})")
    except CacheFileError as e:
        if repair:
            aside = move_aside(e)
            if aside is not None:
                logger.warning("%s. Moved it to %s; parsing %s again.", e, aside, key["json_file"])
        return None
    return cache


def _check_room(folder: str, json_size: int) -> None:
    """Refuse a folder without room for the file before parsing (raises ENOSPC), rather than after."""
    try:
        status = os.statvfs(folder)
    except OSError:
        return
    free, needed = status.f_bavail * status.f_frsize, int(json_size * _SIZE_RATIO)
    if free < needed:
        raise OSError(
            errno.ENOSPC, f"{free / 2**20:.0f} MiB free, the cache file needs about {needed / 2**20:.0f}"
        )


def _build_in(folder: str, key: dict) -> CacheFile:
    """The cache file of `key` in `folder`, parsed and written by this process unless another one (on this
    machine or another) wrote it first. OSErrors of the folder propagate."""
    path = get_cache_path(key, folder)
    json_file = key["json_file"]
    waiting_since = time.time()
    with CacheLock(path, json_file):
        cache = _find(key, folder, repair=True)  # written by the process this one waited for
        if cache is not None:
            return cache
        failure = get_parse_failure(path, since=waiting_since)
        if failure is not None:  # the process this one waited for failed on the same content
            raise failure
        _check_room(folder, key["size"])
        # The temporary file exists before the parse: a read-only folder fails here.
        with CacheWriter(path) as writer:
            try:
                published = _build(writer, json_file, key["image_root"], key["lvis"], key)
            except (ValueError, TypeError) as e:
                record_parse_failure(path, e)
                raise
        cache = writer.read()  # ours, or the one another writer of this key published first
    if cache is None or not is_same_source(cache.key, key):
        raise LazytrainError(
            f"The annotation cache file {path} of {json_file} went away or changed right after it was written "
            "(`lazytrain cache --clear` while this run started?). Start the run again."
        )
    if published:
        logger.info("Wrote the cache file %s of %s.", path, json_file)
    return cache


def _open_in(folder: str, key: dict, problems: list[str]) -> CacheFile | None:
    """The cache file of `key` in `folder`, found or built; None, with the reason added to `problems`, where the
    folder cannot hold it."""
    try:
        os.makedirs(folder, exist_ok=True)
    except FileNotFoundError as e:  # a path under /proc, a parent that vanished: no folder, as for EROFS
        problems.append(f"{folder} (cannot be created: {e.strerror})")
        return None
    except OSError as e:
        if e.errno not in _UNUSABLE_FOLDER:
            raise
        problems.append(f"{folder} ({e.strerror or e})")
        return None
    try:
        return _find(key, folder) or _build_in(folder, key)
    except OSError as e:
        if e.errno not in _UNUSABLE_FOLDER:
            raise
        problems.append(f"{folder} ({e.strerror or e})")
        return None


def _open_node_local(key: dict, problems: list[str]) -> CacheFile | None:
    """The cache file of `key` in this machine's memory (`get_node_local_dir`), used only once it is a folder of
    this user's that no other user can write (its name is predictable)."""
    folder = get_node_local_dir()
    if folder is None or folder == get_cache_dir():
        return None
    problem = make_private_folder(folder)
    if problem is not None:
        logger.warning(
            "Not using %s for the annotation cache: %s. Remove it, or set LAZYTRAIN_CACHE to a writable folder.",
            folder,
            problem,
        )
        problems.append(f"{folder} ({problem})")
        return None
    cache = _open_in(folder, key, problems)
    if cache is not None:
        logger.warning(
            "Cannot write the annotation cache in %s; using %s (this machine's memory, until reboot or "
            "`lazytrain cache --clear` on this machine). Set LAZYTRAIN_CACHE to a writable folder on a local disk "
            "to keep it on disk.",
            "; ".join(problems),
            folder,
        )
    return cache


_TRIES = 3  # parses of a json that keeps changing under them before the error


def open_cache(json_file: str, image_root: str, *, lvis: bool) -> CacheFile:
    """The cache file of `json_file`, written first when there is none for its content.

    Where the cache folder cannot be written (read-only, full), and only then, the file goes to this machine's
    memory (`get_node_local_dir`), still parsed once per machine, with one warning.

    Raises:
        FileNotFoundError, ValueError: the plain loaders' errors for a missing or bad json (before anything is
            written).
        LazytrainError: no folder can hold the file (before any parse), a lock hangs, or the json kept changing
            while it was parsed; the message says what to do.
    """
    for _ in range(_TRIES):
        if not os.path.isfile(json_file):
            read_json(json_file)  # its error names the file and $LAZYTRAIN_DATASETS
        key = get_cache_key(json_file, image_root, lvis=lvis)
        problems: list[str] = []
        try:
            cache = _open_in(get_cache_dir(), key, problems) or _open_node_local(key, problems)
        except _JsonChanged:
            logger.warning(
                "%s changed while it was parsed; parsing it again (nothing was cached).", json_file
            )
            continue
        if cache is not None:
            return cache
        raise LazytrainError(
            f"Cannot write the annotation cache of {json_file} in {'; nor in '.join(problems)}. Set "
            f"LAZYTRAIN_CACHE to a writable folder on a local disk with {key['size'] * _SIZE_RATIO / 2**20:.0f} "
            "MiB free."
        )
    raise LazytrainError(
        f"{json_file} changed while it was parsed, {_TRIES} times in a row: wait until whatever writes it has "
        "finished (a copy, a sync, a script), then start the run again."
    )


def _set_metadata(dataset_name: str, cache: CacheFile, json_file: str, image_root: str, lvis: bool) -> None:
    data = {"categories": cache.metadata["categories"]}
    if lvis:
        set_lvis_metadata(dataset_name, data, json_file, image_root, cache.metadata["class_image_count"])
        return
    from lazytrain.data.catalog import MetadataCatalog

    evaluator_type = MetadataCatalog.get(dataset_name).get("evaluator_type") or "coco"
    set_coco_metadata(dataset_name, data, json_file, image_root, evaluator_type)


def load_cached_json(
    json_file: str, image_root: str, dataset_name: str | None = None, *, lvis: bool
) -> CachedRecords | list[dict]:
    """The records of `load_lvis_json` (``lvis=True``) or `load_coco_json`, served from the json's cache file.

    Falls back to the plain loader only for a file iopath reads from elsewhere (a URL). A local json is parsed
    once per machine or not at all: where no folder can hold its cache file, every process stops with the same
    one-line error before parsing (see `open_cache`).

    Args:
        json_file: the annotation file.
        image_root: joined before each image's ``file_name``.
        dataset_name: when given, its `MetadataCatalog` entry is set as the plain loader sets it.
        lvis: read LVIS's fields (``coco_url``, negative and not-exhaustive category ids, frequencies).
    """
    if not (os.path.isfile(json_file) or not PathManager.exists(json_file)):
        from lazytrain.data.datasets.coco import load_coco_json
        from lazytrain.data.datasets.lvis import load_lvis_json

        return (load_lvis_json if lvis else load_coco_json)(json_file, image_root, dataset_name)
    cache = open_cache(json_file, image_root, lvis=lvis)
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


def _reopen(path: str, key: dict, checked: list[int] | None) -> CacheFile:
    """The cache file a pickled `CachedRecords` names, in a spawned process. Files are never replaced under
    their names, so it is the same file unless `lazytrain cache --clear` removed it; `checked` spares the
    check of its record bytes that the sending process made (`read_cache_file`)."""
    try:
        cache = read_cache_file(path, checked=checked)
    except CacheFileError as e:
        cache, reason = None, f" ({e.reason})"
    else:
        reason = ""
    if cache is None or not is_same_source(cache.key, key):
        raise LazytrainError(
            f"the annotation cache file {path} of {key['json_file']} went away or changed while a run used it"
            f"{reason} (`lazytrain cache --clear` during the run?). Restart the run; it rebuilds the file."
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
        files = [(f.path, f.key, f.checked) for f in self._files]
        return {"files": files, "filter_empty": self._filter_empty}

    def __setstate__(self, state: dict) -> None:
        self._files = [_reopen(path, key, checked) for path, key, checked in state["files"]]
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
