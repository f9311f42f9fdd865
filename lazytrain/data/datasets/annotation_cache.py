"""One parse of a COCO/LVIS json per machine: the records in a file every process maps read-only.

Invariant: a cache file is data only, named after the content it was built from, and never changed once it has
its name; so any process may map any cache file it finds, on any machine, for as long as it likes.

The file holds the records (each msgpack-encoded, in one byte array with int64 offsets), the arrays the
samplers and the aspect grouping read (each image's distinct categories and their instance counts in CSR form,
its annotation count, height, width and aspect group) and the data set's metadata (msgpack), then a JSON table
of the arrays' dtypes, counts and offsets. Reading it decodes JSON and msgpack and maps numpy arrays of a fixed
set of dtypes, every offset checked against the file's length first: nothing in a file can run code, and a
damaged or foreign file is refused (`CacheFileError`) before any of it is used.

Where: ``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``; where that folder
cannot be written (read-only, full), a node-local folder under ``/dev/shm`` (`get_node_local_dir`). The name:
the json's file name and a digest of its key (`get_cache_key`: the json's sha256 and size, the image root, the
format, `FORMAT_VERSION`). A json changed in any way, even with its size and modification time kept, has a new
name; copies of one json on several machines (other inodes, other paths) share one file, whoever built it.
A machine hashes a json once: ``.sha256/`` in the cache folder keeps each json's sha256 with its device,
inode, size, mtime and ctime (the kernel sets the ctime on any change; no copy or archive tool restores it).

Rules (what runs first, who may touch what):
- a writer writes under a temporary name unique across machines and containers (host, pid namespace, pid,
  random), fsyncs, then publishes with a hard link that fails when the name exists: a name, once given, is
  never replaced. Where two writers race (no working locks), the loser drops its copy and maps the winner's.
- a writer removes only temporary files of writers provably dead: same host and pid namespace, pid gone.
- a file found damaged or foreign under a name is renamed aside (``<name>.damaged-...``), one warning naming
  it, and the name is written again: processes that map the damaged file keep their inode.
- the lock (``<name>.lock``, ``flock``) only spares duplicate parses; correctness never depends on it. A file
  system without locks (ENOSYS, ENOLCK, ...) parses without one; every wait on a lock is bounded
  (`LOCK_WAIT_S`, `LOCK_CALL_S`) by an error naming ``LAZYTRAIN_CACHE``.
- only ``python -m lazytrain cache --clear`` removes cache files (see its help for running jobs).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import mmap
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

import msgspec
import numpy as np

from lazytrain.errors import LazytrainError

try:
    import fcntl
except ImportError:  # Windows: no flock; the cache then works without a lock (see the module docstring)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "FORMAT_VERSION",
    "LOCK_CALL_S",
    "LOCK_WAIT_S",
    "CacheFile",
    "CacheFileError",
    "CacheLock",
    "CacheWriter",
    "get_cache_dir",
    "get_cache_key",
    "get_cache_path",
    "get_node_local_dir",
    "hash_file",
    "is_same_source",
    "list_cache_files",
    "move_aside",
    "read_cache_file",
    "write_cache_file",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Bump when the records, the arrays or the file layout change: older files are then rebuilt."""

LOCK_WAIT_S = 1800.0
"""Longest wait for another process's parse (LVIS takes minutes); then an error says what to do."""

LOCK_CALL_S = 120.0
"""Longest one lock call may take (NFS without lockd can hang in it); then an error says what to do."""

_MAGIC = b"LZTCACHE"
_PREAMBLE = struct.Struct("<8sQQ")  # magic, offset and length of the JSON table at the end
_DATA_START = 64
_ALIGN = 64
_SUFFIX = ".records"
_DTYPES = frozenset({"<i8", "<i4", "<f8", "|i1", "|u1"})
_REQUIRED = ("record_offsets", "record_bytes", "annotation_counts", "category_offsets", "categories")
_PER_IMAGE = ("annotation_counts", "heights", "widths", "aspect_groups")
_IDENTITY = ("version", "sha256", "size", "image_root", "lvis")
_NO_LOCK_ERRNOS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
_NODE_LOCAL_ROOT = "/dev/shm"
_RACY_S = 2.0  # see _hash_with_memo
_DECODER = msgspec.msgpack.Decoder()
_ENCODER = msgspec.msgpack.Encoder()


def get_cache_dir() -> str:
    """``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``."""
    folder = os.environ.get("LAZYTRAIN_CACHE")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "lazytrain")
    return os.path.abspath(os.path.expanduser(folder))


def get_node_local_dir() -> str | None:
    """The folder used when the cache folder cannot be written: ``/dev/shm/lazytrain-cache-<uid>`` (memory of
    this machine, shared by its processes, gone at reboot); None where there is no ``/dev/shm``."""
    if not os.path.isdir(_NODE_LOCAL_ROOT):
        return None
    return os.path.join(_NODE_LOCAL_ROOT, f"lazytrain-cache-{os.getuid()}")


def hash_file(path: str) -> str:
    """The sha256 of the file at `path` (hex), read through 64 MiB windows of a map, one at a time.

    A map hashes the page cache's pages without copying them (a read into a buffer cost as much as the hash);
    one window at a time, because a mapped page counts in the process's PSS while mapped (the whole json
    mapped at once added 0.66 GiB to the peak PSS of 2 ranks at LVIS size).
    """
    digest = hashlib.sha256()
    window = 64 << 20
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, window):
            with mmap.mmap(
                f.fileno(), min(window, size - offset), access=mmap.ACCESS_READ, offset=offset
            ) as part:
                digest.update(part)
    return digest.hexdigest()


def _stat_signature(status: os.stat_result) -> list[int]:
    # ctime is set by the kernel on every change (a write, utime, rename) and no user tool can restore it:
    # `cp -p`, `rsync -t` and archives keep the mtime, never the ctime.
    return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]


def _memo_path(path: str) -> str:
    """This machine's memo of `path`'s sha256 (another machine sees other devices and inodes)."""
    digest = hashlib.sha256(f"{_host()}\0{path}".encode()).hexdigest()[:32]
    return os.path.join(get_cache_dir(), ".sha256", f"{digest}.json")


def _hash_with_memo(path: str) -> str:
    """`hash_file`, skipped when this machine hashed the same file (same device, inode, size, mtime, ctime).

    As git's index does for racy files, a file changed less than `_RACY_S` before its hash is not memoized:
    a change within the clock's granularity of the last one could leave its ctime as it was.
    """
    before = os.stat(path)
    memo = _memo_path(path)
    try:
        with open(memo, "rb") as f:
            saved = json.loads(f.read(4096))
        if saved["stat"] == _stat_signature(before) and re.fullmatch(r"[0-9a-f]{64}", saved["sha256"]):
            return saved["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo, or not one of ours: hash
    digest = hash_file(path)
    after = os.stat(path)
    racy = time.time() - max(after.st_mtime, after.st_ctime) < _RACY_S
    if _stat_signature(after) == _stat_signature(before) and not racy:
        try:
            os.makedirs(os.path.dirname(memo), exist_ok=True)
            tmp = f"{memo}.tmp~{_writer_tag()}"
            with open(tmp, "w") as f:
                json.dump({"stat": _stat_signature(after), "sha256": digest}, f)
            os.replace(tmp, memo)  # a memo is read whole and never mapped: replacing it is safe
        except OSError:
            pass  # a read-only cache folder: hash every time
    return digest


def get_cache_key(json_file: str, image_root: str, *, lvis: bool) -> dict:
    """What a cache file must have been built from to serve `json_file` now (JSON-serializable).

    The json's content (sha256, about 1 s per GB) is the key, not its path, inode or modification time: a
    json fixed in place with its size and time kept gets a new cache file, and copies of one json on several
    machines share one. ``json_file`` is kept for ``lazytrain cache``'s listing only. A machine hashes a file
    once: the sha256 is kept with the file's device, inode, size, mtime and ctime (any change sets the ctime).
    """
    path = os.path.realpath(json_file)
    return {
        "version": FORMAT_VERSION,
        "sha256": _hash_with_memo(path),
        "size": os.path.getsize(path),
        "image_root": image_root,
        "lvis": lvis,
        "json_file": path,
    }


def is_same_source(key: dict, other: dict) -> bool:
    """Whether two keys describe the same records (same content, image root, format and version)."""
    return all(key.get(field) == other.get(field) for field in _IDENTITY)


def get_cache_path(key: dict, folder: str | None = None) -> str:
    """The cache file of `key` (`get_cache_key`) in `folder` (default `get_cache_dir`); it may not exist."""
    identity = "\0".join(str(key[field]) for field in _IDENTITY)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    stem = os.path.splitext(os.path.basename(key["json_file"]))[0]
    return os.path.join(folder or get_cache_dir(), f"{stem}-{digest}{_SUFFIX}")


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
            record = _DECODER.decode(self.arrays["record_bytes"][start:end])
            if not isinstance(record, dict):
                raise TypeError(f"a {type(record).__name__}, not a dict")
        except (
            msgspec.DecodeError,
            TypeError,
        ) as e:  # bytes changed after the file was checked and published
            raise LazytrainError(
                f"The annotation cache file {self.path} is damaged (record {index}: {e}). Remove it with: "
                f"python -m lazytrain cache {self.key.get('json_file', '')} --clear (the next run parses the json "
                "again)."
            ) from e
        return record


def _read_table(mapped: mmap.mmap) -> tuple[dict, int]:
    """(table, its offset) of a mapped file, after checking the header and the table's place."""
    if len(mapped) < _DATA_START:
        raise ValueError(f"{len(mapped)} bytes, shorter than the header")
    magic, offset, length = _PREAMBLE.unpack_from(mapped, 0)
    if magic != _MAGIC:
        raise ValueError("no lazytrain cache header")
    if offset < _DATA_START or offset + length != len(mapped):
        raise ValueError("its table is not where its header says (a truncated or overwritten file)")
    table = json.loads(bytes(mapped[offset:]))
    if not isinstance(table, dict) or not isinstance(table.get("key"), dict):
        raise ValueError("its table has no key")
    if table["key"].get("version") != FORMAT_VERSION:
        raise ValueError(
            f"format version {table['key'].get('version')!r}, this lazytrain reads {FORMAT_VERSION}"
        )
    if not isinstance(table.get("arrays"), dict):
        raise ValueError("its table has no arrays")
    return table, offset


def _map_arrays(mapped: mmap.mmap, entries: dict, end: int) -> dict[str, np.ndarray]:
    """The arrays the table lists, each checked to lie inside the data part of the file."""
    arrays = {}
    for name, entry in entries.items():
        if not (isinstance(entry, list) and len(entry) == 3 and entry[0] in _DTYPES):
            raise ValueError(f"array {name!r}: bad table entry {entry!r}")
        dtype, count, offset = entry
        if type(count) is not int or type(offset) is not int or count < 0 or offset < _DATA_START:
            raise ValueError(f"array {name!r}: bad count or offset {entry!r}")
        if offset + count * np.dtype(dtype).itemsize > end:
            raise ValueError(f"array {name!r} runs past the data ({offset} + {count} x {dtype} > {end})")
        arrays[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
    return arrays


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
    _check_csr(arrays["record_offsets"], len(arrays["record_bytes"]), "record offsets")
    _check_csr(arrays["category_offsets"], len(arrays["categories"]), "category offsets")
    images = len(arrays["record_offsets"]) - 1
    if len(arrays["category_offsets"]) != images + 1 or len(arrays["instances"]) != len(arrays["categories"]):
        raise ValueError("category arrays of another image count")
    if any(name in arrays and len(arrays[name]) != images for name in _PER_IMAGE):
        raise ValueError(f"per-image arrays of another length than {images} images")


def read_cache_file(path: str) -> CacheFile | None:
    """Map the cache file at `path`; None when there is no file.

    Raises:
        CacheFileError: the file is not a complete, valid cache file of this version (damaged, truncated,
            foreign); nothing of it was decoded beyond its JSON table.
    """
    try:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            if status.st_size == 0:
                raise CacheFileError(path, "empty", status)
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CacheFileError(path, f"cannot be read ({e.strerror})") from None
    # Any failure below means "not a cache file we wrote": JSON, msgpack and numpy views cannot run code, and
    # whatever they raise on hostile bytes (ValueError, RecursionError, ...) must become a rebuild, not a crash.
    try:
        table, end = _read_table(mapped)
        arrays = _map_arrays(mapped, table["arrays"], end)
        _check_arrays(arrays)
        metadata = _DECODER.decode(arrays.pop("metadata"))
        if not isinstance(metadata, dict) or not isinstance(metadata.get("categories"), list):
            raise ValueError("its metadata has no categories")
    except Exception as e:
        raise CacheFileError(path, f"{type(e).__name__}: {e}", status) from None
    return CacheFile(path, table["key"], arrays, metadata)


def move_aside(error: CacheFileError) -> str | None:
    """Rename the invalid file `error` names to ``<name>.damaged-<host>-<pid>-<random>`` (the processes that map
    it keep it; ``lazytrain cache --clear`` removes it); returns the new name, None when another process
    already moved or replaced it."""
    aside = f"{error.path}.damaged-{_writer_tag()}"
    try:
        if error.stat is not None and not os.path.samestat(os.stat(error.path), error.stat):
            return None  # a good file was published there since
        os.rename(error.path, aside)
    except FileNotFoundError:
        return None
    return aside


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def _pid_namespace() -> str:
    """The pid namespace's inode: two containers on one host can run the same pid under the same hostname."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _writer_tag() -> str:
    return f"{_host()}~{_pid_namespace()}~{os.getpid()}~{secrets.token_hex(4)}"


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_dead_writers_files(path: str) -> None:
    """Remove the temporary files of writers of `path` that provably died: this host, this pid namespace, a pid
    that no longer exists. Another machine's or container's files are left alone (their writer may live)."""
    folder, name = os.path.split(path)
    for tmp in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(name)}.tmp~*")):
        host, namespace, pid = (tmp.rsplit(".tmp~", 1)[1].split("~") + ["", "", ""])[:3]
        if host == _host() and namespace == _pid_namespace() and pid.isdigit() and not _is_alive(int(pid)):
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass


def _fsync_folder(folder: str) -> None:
    """Make the new name durable; best effort, as some file systems cannot open or sync a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


class CacheWriter:
    """A cache file written under a temporary name unique to this process, published under `path` only whole.

    Creating it creates the temporary file: an unwritable folder fails here, before anything is parsed. Use it
    as a context manager; leaving the block removes the temporary file unless `publish` linked it.

    Args:
        path: the cache file's name (`get_cache_path`).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        _remove_dead_writers_files(path)
        folder, name = os.path.split(path)
        self._tmp = os.path.join(folder, f".{name}.tmp~{_writer_tag()}")
        self._file: IO[bytes] = os.fdopen(
            os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb"
        )

    def write(self, records: Iterable[dict], metadata: dict, key: dict) -> None:
        """Write the file's contents (again, from the start, when called twice)."""
        f = self._file
        f.seek(0)
        f.truncate()
        writer = _ArrayWriter(f)
        arrays = _Arrays()
        writer.begin("record_bytes", "|u1")
        for record in records:
            blob = _ENCODER.encode(record)
            f.write(blob)
            arrays.add(record, len(blob))
        writer.end("record_bytes")
        arrays.write(writer)
        writer.add("metadata", np.frombuffer(_ENCODER.encode(metadata), np.uint8))
        writer.finish(key)

    def publish(self) -> bool:
        """fsync the file and give it its name unless the name exists; False when another writer's file has it
        (same content: use that one)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        try:
            os.link(self._tmp, self.path)
            published = True
        except FileExistsError:
            published = False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise
            # No hard links here: rename while the name is free. Two writers of the same content racing in
            # between give the name twice, with equal bytes; a reader's map of the first stays valid locally.
            published = not os.path.exists(self.path)
            if published:
                os.rename(self._tmp, self.path)
        _fsync_folder(os.path.dirname(self.path))
        return published

    def __enter__(self) -> CacheWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._file.close()
        try:
            os.remove(self._tmp)
        except FileNotFoundError:
            pass


def write_cache_file(path: str, records: Iterable[dict], metadata: dict, key: dict) -> bool:
    """Write `records` and their arrays to `path` (see `CacheWriter`); False when a file already had the name.

    Args:
        records: the records in order; consumed once, one at a time.
        metadata: msgpack-encodable metadata stored with them.
        key: `get_cache_key` of the json read.
    """
    with CacheWriter(path) as writer:
        writer.write(records, metadata, key)
        return writer.publish()


def list_cache_files(folder: str | None = None) -> list[str]:
    """The cache files in `folder` (default `get_cache_dir`), sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(folder or get_cache_dir()), "*" + _SUFFIX)))


def _try_lock(fd: int, lock_path: str) -> bool | None:
    """One non-blocking ``flock``: True when taken, False when another process holds it, None where the file
    system has no locks. The call runs in a thread, so that one that hangs (NFS without lockd) is bounded."""
    outcome: dict[str, BaseException] = {}

    def attempt() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=attempt, name="lazytrain-cache-lock", daemon=True)
    thread.start()
    thread.join(LOCK_CALL_S)
    if thread.is_alive():
        raise LazytrainError(
            f"The annotation cache's lock {lock_path} did not answer in {LOCK_CALL_S:.0f} s: this file system's "
            "locks hang (NFS without lockd?). Set LAZYTRAIN_CACHE to a folder on a local disk."
        )
    error = outcome.get("error")
    if error is None:
        return True
    if isinstance(error, OSError) and error.errno in (errno.EAGAIN, errno.EACCES):
        return False
    if isinstance(error, NotImplementedError) or (
        isinstance(error, OSError) and error.errno in _NO_LOCK_ERRNOS
    ):
        return None
    raise error


class CacheLock:
    """Hold ``<path>.lock`` while the block runs; `held` is False where the file system has no locks.

    Every wait is bounded: a lock held longer than `LOCK_WAIT_S`, or a lock call that does not return within
    `LOCK_CALL_S`, raises a `LazytrainError` that says to put ``LAZYTRAIN_CACHE`` on a local disk.

    Args:
        path: the cache file.
        what: named in the log line of a process that waits.
    """

    def __init__(self, path: str, what: str) -> None:
        self._lock_path = path + ".lock"
        self._what = what
        self._fd: int | None = None
        self.held = False

    def _open(self) -> int:
        try:
            return os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:  # another user's lock file in a shared folder: flock needs only a read handle
            return os.open(self._lock_path, os.O_RDONLY)

    def __enter__(self) -> CacheLock:
        if fcntl is None:
            return self
        self._fd = self._open()
        deadline = time.monotonic() + LOCK_WAIT_S
        delay = 0.05
        try:
            while (taken := _try_lock(self._fd, self._lock_path)) is False:
                if delay == 0.05:
                    logger.info("Waiting for another process to parse %s.", self._what)
                if time.monotonic() > deadline:
                    raise LazytrainError(
                        f"Waited {LOCK_WAIT_S:.0f} s for the annotation cache's lock {self._lock_path} (another "
                        f"process parsing {self._what}). If none is, this file system's locks are stuck: set "
                        "LAZYTRAIN_CACHE to a folder on a local disk."
                    )
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        except BaseException:
            self._close()
            raise
        if taken is None:
            logger.debug(
                "No file lock for %s: parsing without one (the file is still published once).", self._what
            )
            self._close()
        self.held = bool(taken)
        return self

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __exit__(self, *exc_info: Any) -> None:
        self._close()
        self.held = False
