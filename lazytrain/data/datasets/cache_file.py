"""The annotation cache file's format: writing one, and mapping and checking one before any of it is used.

Invariant: a file this module maps was checked whole against the sha256s it carries, except its record bytes,
whose check (1 s per GB) `annotation_cache` makes once per machine; nothing in a file can run code.

Layout: a 64-byte header (magic, the JSON table's offset, length and sha256), the record bytes (each record
msgpack-encoded), then 64-byte aligned numpy arrays (record offsets and crc32s, each image's distinct categories
and their instance counts in CSR form, its annotation count, height, width and aspect group, the metadata as
msgpack), then the JSON table: the key the file was built from and each array's dtype, count, offset and
sha256. Reading decodes JSON and msgpack and maps numpy arrays of a fixed set of dtypes, every offset checked
against the file's length before use; a record's crc32 is checked each time it is read (4-6 us of a 43 us
decode at LVIS size). Which file has which name, who writes it and how it is shared are `annotation_cache`'s.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterable
from typing import IO

import msgspec
import numpy as np

from lazytrain.errors import LazytrainError

__all__ = ["FORMAT_VERSION", "CacheFile", "CacheFileError", "map_cache_contents", "write_cache_contents"]

FORMAT_VERSION = 3
"""Bump when the records, the arrays or the file layout change: older files are then rebuilt."""

_MAGIC = b"LZTCACHE"
_PREAMBLE = struct.Struct("<8sQQ32s")  # magic, offset, length and sha256 of the JSON table at the end
_DATA_START = 64
_ALIGN = 64
_DTYPES = frozenset({"<i8", "<i4", "<u4", "<f8", "|i1", "|u1"})
_REQUIRED = (
    "record_offsets",
    "record_bytes",
    "record_crcs",
    "annotation_counts",
    "category_offsets",
    "categories",
)
_PER_IMAGE = ("record_crcs", "annotation_counts", "heights", "widths", "aspect_groups")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DECODER = msgspec.msgpack.Decoder()
_ENCODER = msgspec.msgpack.Encoder()


class CacheFileError(LazytrainError):
    """A file under a cache file's name that is not a valid cache file (damaged, foreign, another version).

    Attributes:
        path: the file.
        reason: what is wrong with it.
        stat: its `os.stat_result` when read (to move aside that file and not a newer one).
    """

    def __init__(self, path: str, reason: str, stat: os.stat_result | None = None) -> None:
        super().__init__(f"{path} is not a valid annotation cache file: {reason}")
        self.path, self.reason, self.stat = path, reason, stat


class CacheFile:
    """A cache file mapped read-only: its key, arrays (views of the map) and metadata.

    Attributes:
        path: the file.
        key: what it was built from (`get_cache_key`).
        arrays: name -> read-only numpy array backed by the map.
        metadata: the data set's metadata (class names, id mapping, LVIS class image counts).
        checked: the stat signature of the file whose record bytes were checked against their sha256 (handed
            to a spawned process, which then skips that check; see `annotation_cache.read_cache_file`).
    """

    def __init__(
        self,
        path: str,
        key: dict,
        arrays: dict[str, np.ndarray],
        metadata: dict,
        *,
        checked: list[int] | None = None,
    ) -> None:
        self.path, self.key, self.arrays, self.metadata, self.checked = path, key, arrays, metadata, checked

    def __len__(self) -> int:
        return len(self.arrays["record_offsets"]) - 1

    def get_record(self, index: int) -> dict:
        """A fresh dict of record `index` (the caller may modify it)."""
        offsets = self.arrays["record_offsets"]
        start, end = int(offsets[index]), int(offsets[index + 1])
        blob = self.arrays["record_bytes"][start:end]
        try:
            # The file's record bytes were checked when this machine first mapped it; the crc32 (a few us per
            # record) keeps a later change to the bytes from being read as a record.
            if zlib.crc32(blob) != int(self.arrays["record_crcs"][index]):
                raise ValueError("its bytes do not match their crc32")
            record = _DECODER.decode(blob)
            if not isinstance(record, dict):
                raise TypeError(f"a {type(record).__name__}, not a dict")
        except (msgspec.DecodeError, TypeError, ValueError, RecursionError) as e:
            raise LazytrainError(
                f"The annotation cache file {self.path} is damaged (record {index}: {e}). Remove it with: "
                f"python -m lazytrain cache {self.key.get('json_file', '')} --clear (the next run parses the json "
                "again)."
            ) from e
        return record


def _read_table(mapped: mmap.mmap) -> tuple[dict, int]:
    """(table, its offset) of a mapped file, after checking the header, the table's place and its sha256."""
    if len(mapped) < _DATA_START:
        raise ValueError(f"{len(mapped)} bytes, shorter than the header")
    magic, offset, length, digest = _PREAMBLE.unpack_from(mapped, 0)
    if magic != _MAGIC:
        raise ValueError("no lazytrain cache header")
    if offset < _DATA_START or offset + length != len(mapped):
        raise ValueError("its table is not where its header says (a truncated or overwritten file)")
    text = bytes(mapped[offset:])
    if digest == bytes(32):  # formats before 3 left these header bytes zero
        raise ValueError(f"an older format (no table sha256); this lazytrain reads version {FORMAT_VERSION}")
    if hashlib.sha256(text).digest() != digest:
        raise ValueError("its table does not match its sha256")
    table = json.loads(text)
    if not isinstance(table, dict) or not isinstance(table.get("key"), dict):
        raise ValueError("its table has no key")
    if table["key"].get("version") != FORMAT_VERSION:
        raise ValueError(
            f"format version {table['key'].get('version')!r}, this lazytrain reads {FORMAT_VERSION}"
        )
    if not isinstance(table.get("arrays"), dict):
        raise ValueError("its table has no arrays")
    return table, offset


def _map_arrays(mapped: mmap.mmap, entries: dict, end: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(the arrays the table lists, each checked to lie inside the data part of the file; their sha256s)."""
    arrays, digests = {}, {}
    for name, entry in entries.items():
        if not (isinstance(entry, list) and len(entry) == 4 and entry[0] in _DTYPES):
            raise ValueError(f"array {name!r}: bad table entry {entry!r}")
        dtype, count, offset, digest = entry
        if type(count) is not int or type(offset) is not int or count < 0 or offset < _DATA_START:
            raise ValueError(f"array {name!r}: bad count or offset {entry!r}")
        if not (isinstance(digest, str) and _HEX64.fullmatch(digest)):
            raise ValueError(f"array {name!r}: bad sha256 {digest!r}")
        if offset + count * np.dtype(dtype).itemsize > end:
            raise ValueError(f"array {name!r} runs past the data ({offset} + {count} x {dtype} > {end})")
        arrays[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
        digests[name] = digest
    return arrays, digests


def _check_csr(offsets: np.ndarray, values: int, name: str) -> None:
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != values or np.any(np.diff(offsets) < 0):
        raise ValueError(f"{name} are not increasing offsets from 0 to {values}")


def _check_arrays(arrays: dict[str, np.ndarray]) -> None:
    """Offsets that index inside their arrays, per-image arrays of the image count, the expected dtypes."""
    missing = [
        name for name in (*_REQUIRED, "instances", "heights", "widths", "metadata") if name not in arrays
    ]
    if missing:
        raise ValueError(f"arrays missing: {', '.join(missing)}")
    if arrays["record_offsets"].dtype != np.int64 or arrays["category_offsets"].dtype != np.int64:
        raise ValueError("offsets are not int64")
    if arrays["record_crcs"].dtype != np.uint32:
        raise ValueError("record crc32s are not uint32")
    _check_csr(arrays["record_offsets"], len(arrays["record_bytes"]), "record offsets")
    _check_csr(arrays["category_offsets"], len(arrays["categories"]), "category offsets")
    images = len(arrays["record_offsets"]) - 1
    if len(arrays["category_offsets"]) != images + 1 or len(arrays["instances"]) != len(arrays["categories"]):
        raise ValueError("category arrays of another image count")
    if any(name in arrays and len(arrays[name]) != images for name in _PER_IMAGE):
        raise ValueError(f"per-image arrays of another length than {images} images")


def _check_digests(arrays: dict[str, np.ndarray], digests: dict[str, str]) -> None:
    """Every array but the record bytes against its sha256 (6 ms at LVIS size; the record bytes are
    `annotation_cache`'s, once per machine)."""
    for name, array in arrays.items():
        if name != "record_bytes" and hashlib.sha256(array.data).hexdigest() != digests[name]:
            raise ValueError(f"array {name!r} does not match its sha256")


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

    def end(self, name: str, digest: str) -> None:
        dtype, _, offset = self._table[name]
        self._table[name][1:] = [(self._f.tell() - offset) // np.dtype(dtype).itemsize, offset, digest]

    def add(self, name: str, array: np.ndarray) -> None:
        self.begin(name, array.dtype.str)
        data = np.ascontiguousarray(array).tobytes()
        self._f.write(data)
        self.end(name, hashlib.sha256(data).hexdigest())

    def finish(self, key: dict) -> None:
        table = json.dumps({"key": key, "arrays": self._table}).encode()
        offset = self._f.tell()
        self._f.write(table)
        self._f.seek(0)
        self._f.write(_PREAMBLE.pack(_MAGIC, offset, len(table), hashlib.sha256(table).digest()))


class _Arrays:
    """The per-image arrays, gathered record by record."""

    def __init__(self) -> None:
        self.record_offsets = [0]
        self.record_crcs: list[int] = []
        self.annotation_counts: list[int] = []
        self.category_offsets = [0]
        self.categories: list[int] = []
        self.instances: list[int] = []
        self.heights: list[float] = []
        self.widths: list[float] = []
        self.groups: list[int] | None = []

    def add(self, record: dict, blob: bytes) -> None:
        self.record_offsets.append(self.record_offsets[-1] + len(blob))
        self.record_crcs.append(zlib.crc32(blob))
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
        writer.add("record_crcs", np.asarray(self.record_crcs, dtype=np.uint32))
        writer.add("annotation_counts", np.asarray(self.annotation_counts, dtype=np.int64))
        writer.add("category_offsets", np.asarray(self.category_offsets, dtype=np.int64))
        writer.add("categories", np.asarray(self.categories, dtype=np.int32))
        writer.add("instances", np.asarray(self.instances, dtype=np.int32))
        writer.add("heights", np.asarray(self.heights, dtype=np.float64))
        writer.add("widths", np.asarray(self.widths, dtype=np.float64))
        if self.groups is not None:
            writer.add("aspect_groups", np.asarray(self.groups, dtype=np.int8))


def write_cache_contents(f: IO[bytes], records: Iterable[dict], metadata: dict, key: dict) -> str:
    """Write a whole cache file into `f` from its start: `records` (consumed once, one at a time), their arrays,
    `metadata` (msgpack-encodable) and `key` (what they were built from); returns the record bytes' sha256."""
    f.seek(0)
    f.truncate()
    writer = _ArrayWriter(f)
    arrays = _Arrays()
    writer.begin("record_bytes", "|u1")
    digest = hashlib.sha256()
    for record in records:
        blob = _ENCODER.encode(record)
        f.write(blob)
        digest.update(blob)
        arrays.add(record, blob)
    writer.end("record_bytes", digest.hexdigest())
    arrays.write(writer)
    writer.add("metadata", np.frombuffer(_ENCODER.encode(metadata), np.uint8))
    writer.finish(key)
    return digest.hexdigest()


def map_cache_contents(fd: int, path: str, size: int) -> tuple[CacheFile, list]:
    """Map the file open as `fd` (`size` bytes) and check every part but the record bytes: the table against
    the header's sha256, the arrays' places, dtypes and lengths, each against its sha256, the metadata.

    Returns:
        (the file, the record bytes' table entry: dtype, count, offset, sha256) for the caller's check of them.

    Raises:
        CacheFileError: anything wrong (its stat is left for the caller to add).
    """
    if size == 0:
        raise CacheFileError(path, "empty")
    try:
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise CacheFileError(path, f"cannot be read ({e.strerror})") from None
    # Any failure below means "not a cache file we wrote": JSON, msgpack and numpy views cannot run code, and
    # whatever they raise on hostile bytes (ValueError, RecursionError, ...) must become a rebuild.
    try:
        table, end = _read_table(mapped)
        arrays, digests = _map_arrays(mapped, table["arrays"], end)
        _check_arrays(arrays)
        _check_digests(arrays, digests)
        metadata = _DECODER.decode(arrays.pop("metadata"))
        if not isinstance(metadata, dict) or not isinstance(metadata.get("categories"), list):
            raise ValueError("its metadata has no categories")
    except Exception as e:
        raise CacheFileError(path, f"{type(e).__name__}: {e}") from None
    return CacheFile(path, table["key"], arrays, metadata), table["arrays"]["record_bytes"]
