"""One parse of a COCO/LVIS json per machine: the records in a file every process maps read-only.

The cache file of a json holds its records (each pickled, in one byte array with int64 offsets), the arrays
the samplers and the aspect grouping read (each image's distinct categories and their instance counts in CSR
form, its annotation count, height, width and aspect group) and the data set's metadata. Every rank and every
loader worker maps the same file: its pages are the page cache's, shared, not copies.

Where: ``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``; one file per
(json's real path, image root, format), named after the json. Its key: the json's size, modification time
and inode (and its sha256 when asked), the format (COCO or LVIS), the image root and `FORMAT_VERSION`. A json
that changed is parsed again and its cache file replaced.

Safety:
- the first process takes an exclusive lock on ``<cache file>.lock`` (`filelock`: ``flock``), parses and
  writes; the others wait on the lock, then map the file. A process killed while it holds the lock releases
  it (the kernel drops it with the descriptor).
- the file is written under a temporary name in the same folder, fsynced and renamed over the cache file
  (`atomic_write`): a reader sees a complete file or none. A temporary file left by a killed process is
  never read; the next writer removes it.
- where locks do not work (some network file systems), two processes may parse at once; each renames a
  complete file, and every reader checks the key it finds, so a cache shared by several machines stays
  correct.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import mmap
import os
import pickle
import struct
from collections.abc import Iterable
from typing import IO, Any

import numpy as np
from filelock import FileLock, Timeout

from lazytrain.errors import LazytrainError
from lazytrain.utils.file_io import atomic_write

__all__ = [
    "FORMAT_VERSION",
    "CacheFile",
    "CacheLock",
    "get_cache_dir",
    "get_cache_key",
    "get_cache_path",
    "list_cache_files",
    "read_cache_file",
    "write_cache_file",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the records, the arrays or the file layout change: older files are then rebuilt."""

_MAGIC = b"LZTCACHE"
_PREAMBLE = struct.Struct("<8sQQ")  # magic, offset and length of the JSON table at the end
_DATA_START = 64
_ALIGN = 64
_SUFFIX = ".records"


def get_cache_dir() -> str:
    """``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``."""
    folder = os.environ.get("LAZYTRAIN_CACHE")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "lazytrain")
    return os.path.abspath(os.path.expanduser(folder))


def get_cache_path(json_file: str, image_root: str, *, lvis: bool) -> str:
    """The cache file of `json_file` read with `image_root` as COCO or LVIS (it may not exist)."""
    identity = "\0".join((os.path.realpath(json_file), image_root, "lvis" if lvis else "coco"))
    digest = hashlib.sha1(identity.encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(json_file))[0]
    return os.path.join(get_cache_dir(), f"{stem}-{digest}{_SUFFIX}")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def get_cache_key(json_file: str, image_root: str, *, lvis: bool, content_hash: bool = False) -> dict:
    """What a cache file must have been built from to serve `json_file` now (JSON-serializable).

    Args:
        content_hash: add the json's sha256 (reads the whole file; catches a json rewritten in place with the
            same size and modification time).
    """
    path = os.path.realpath(json_file)
    stat = os.stat(path)
    key = {
        "version": FORMAT_VERSION,
        "json_file": path,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "inode": stat.st_ino,
        "image_root": image_root,
        "lvis": lvis,
    }
    if content_hash:
        key["sha256"] = _sha256(path)
    return key


class CacheFile:
    """A cache file mapped read-only: its key, arrays (views of the map) and metadata.

    Attributes:
        path: the file.
        key: what it was built from (`get_cache_key`).
        arrays: name -> read-only numpy array backed by the map.
        metadata: the data set's metadata (class names, id mapping, LVIS class image counts).
    """

    def __init__(self, path: str, key: dict, arrays: dict[str, np.ndarray], metadata: dict) -> None:
        self.path, self.key, self.arrays, self.metadata = path, key, arrays, metadata

    def __len__(self) -> int:
        return len(self.arrays["record_offsets"]) - 1

    def get_record(self, index: int) -> dict:
        """A fresh dict of record `index` (the caller may modify it)."""
        offsets = self.arrays["record_offsets"]
        start, end = int(offsets[index]), int(offsets[index + 1])
        try:
            return pickle.loads(memoryview(self.arrays["record_bytes"][start:end]))
        except Exception as e:  # overwritten bytes: any unpickling error, named with the way out
            raise LazytrainError(
                f"The annotation cache file {self.path} is damaged (record {index}: {type(e).__name__}: {e}). "
                f"Remove it with: python -m lazytrain cache {self.key.get('json_file', '')} --clear (the next run "
                "parses the json again)."
            ) from e


def read_cache_file(path: str) -> CacheFile | None:
    """Map the cache file at `path`; None when it is absent or not a complete cache file of this version."""
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # absent or unreadable; ValueError: an empty file cannot be mapped
        return None
    if len(mapped) < _DATA_START:
        return None
    magic, table_offset, table_length = _PREAMBLE.unpack_from(mapped, 0)
    if magic != _MAGIC or table_offset + table_length != len(mapped):
        return None
    try:
        table = json.loads(bytes(mapped[table_offset : table_offset + table_length]))
    except ValueError:
        return None
    if table.get("key", {}).get("version") != FORMAT_VERSION:
        return None
    arrays = {
        name: np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
        for name, (dtype, count, offset) in table["arrays"].items()
    }
    metadata = pickle.loads(memoryview(arrays.pop("metadata")))
    return CacheFile(path, table["key"], arrays, metadata)


class _ArrayWriter:
    """Writes the record bytes as they come, then the arrays and the table, into an open file."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self._table: dict[str, list] = {}
        f.write(b"\0" * _DATA_START)

    def begin(self, name: str, dtype: str) -> int:
        position = self._f.tell()
        padding = -position % _ALIGN
        self._f.write(b"\0" * padding)
        self._table[name] = [dtype, 0, position + padding]
        return position + padding

    def end(self, name: str) -> None:
        dtype, _, offset = self._table[name]
        self._table[name][1] = (self._f.tell() - offset) // np.dtype(dtype).itemsize

    def add(self, name: str, array: np.ndarray) -> None:
        self.begin(name, array.dtype.str)
        self._f.write(np.ascontiguousarray(array).tobytes())
        self.end(name)

    def finish(self, key: dict) -> None:
        table = json.dumps({"key": key, "arrays": self._table}).encode()
        offset = self._f.tell()
        self._f.write(table)
        self._f.seek(0)
        self._f.write(_PREAMBLE.pack(_MAGIC, offset, len(table)))


class _Arrays:
    """The per-image arrays, gathered record by record."""

    def __init__(self) -> None:
        self.record_offsets = [0]
        self.annotation_counts: list[int] = []
        self.category_offsets = [0]
        self.categories: list[int] = []
        self.instances: list[int] = []
        self.heights: list[float] = []
        self.widths: list[float] = []
        self.groups: list[int] | None = []

    def add(self, record: dict, size: int) -> None:
        self.record_offsets.append(self.record_offsets[-1] + size)
        counts: dict[int, int] = {}
        annotations = record.get("annotations") or ()
        for annotation in annotations:
            category = annotation["category_id"]
            counts[category] = counts.get(category, 0) + 1
        self.annotation_counts.append(len(annotations))
        for category in sorted(counts):
            self.categories.append(category)
            self.instances.append(counts[category])
        self.category_offsets.append(len(self.categories))
        height, width = record.get("height"), record.get("width")
        self.heights.append(height if isinstance(height, (int, float)) else float("nan"))
        self.widths.append(width if isinstance(width, (int, float)) else float("nan"))
        if self.groups is not None:
            try:  # as lazytrain.data.aspect_grouping.get_aspect_groups decides from a record
                self.groups.append(int(record["width"] > record["height"]))
            except (KeyError, TypeError):
                self.groups = None

    def write(self, writer: _ArrayWriter) -> None:
        writer.add("record_offsets", np.asarray(self.record_offsets, dtype=np.int64))
        writer.add("annotation_counts", np.asarray(self.annotation_counts, dtype=np.int64))
        writer.add("category_offsets", np.asarray(self.category_offsets, dtype=np.int64))
        writer.add("categories", np.asarray(self.categories, dtype=np.int32))
        writer.add("instances", np.asarray(self.instances, dtype=np.int32))
        writer.add("heights", np.asarray(self.heights, dtype=np.float64))
        writer.add("widths", np.asarray(self.widths, dtype=np.float64))
        if self.groups is not None:
            writer.add("aspect_groups", np.asarray(self.groups, dtype=np.int8))


def _write_contents(f: IO[bytes], records: Iterable[dict], metadata: dict, key: dict) -> None:
    writer = _ArrayWriter(f)
    arrays = _Arrays()
    writer.begin("record_bytes", "|u1")
    for record in records:
        blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        f.write(blob)
        arrays.add(record, len(blob))
    writer.end("record_bytes")
    arrays.write(writer)
    writer.add("metadata", np.frombuffer(pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL), np.uint8))
    writer.finish(key)


def write_cache_file(path: str, records: Iterable[dict], metadata: dict, key: dict) -> None:
    """Write `records` and their arrays to `path` atomically (`lazytrain.utils.file_io.atomic_write`).

    Call it holding the lock of `path` (`CacheLock`): temporary files left next to `path` are removed first,
    as only a killed writer can have left them.

    Args:
        records: the records in order; consumed once, one at a time.
        metadata: picklable metadata stored with them.
        key: `get_cache_key` of the json read.
    """
    folder, name = os.path.split(path)
    for stale in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(name)}.tmp*")):
        os.remove(stale)
    atomic_write(path, lambda f: _write_contents(f, records, metadata, key))


def list_cache_files(folder: str | None = None) -> list[str]:
    """The cache files in `folder` (default `get_cache_dir`), sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(folder or get_cache_dir()), "*" + _SUFFIX)))


class CacheLock:
    """Hold ``<path>.lock`` while the block runs; `held` is False where the file system has no locks.

    Args:
        path: the cache file.
        what: named in the log line of a process that waits.
    """

    def __init__(self, path: str, what: str) -> None:
        self._lock = FileLock(path + ".lock", mode=0o666)  # any user of a shared cache folder may take it
        self._what = what
        self.held = False

    def __enter__(self) -> CacheLock:
        try:
            try:
                self._lock.acquire(blocking=False)
            except Timeout:
                logger.info("Waiting for another process to parse %s.", self._what)
                self._lock.acquire()
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            logger.debug("No file lock for %s (%s): parsing without one.", self._what, e)
            return self
        self.held = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.held:
            self._lock.release()
