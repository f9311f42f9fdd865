"""One parse of a COCO/LVIS json per machine, shared: which cache file serves a json, where it lives, who
writes it and how processes on one or many machines share it (the file's format is `cache_file`'s).

Invariant: a cache file is named after the content it was built from and never changed once it has its name;
so any process may map any cache file it finds, on any machine, for as long as it likes (a file that cannot
change cannot be truncated under a map: no SIGBUS).

`read_cache_file` opens a name without following a link or blocking on a FIFO, has `cache_file` check every
part of the file but the record bytes (each time a process maps it: 6 ms at LVIS size) and checks the record
bytes once per machine (1 s per GB; remembered in ``.sha256/`` as for the json, and handed to spawned
processes); a damaged or foreign file is refused (`CacheFileError`) before any of it is used.

Where: ``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``; only where that
folder cannot be written (read-only, full, another user's), a node-local folder under ``/dev/shm``
(`get_node_local_dir`), used only when it is this user's own, mode 0700, not a symbolic link (its name is
predictable: another user could make it first and plant files with wrong labels). The name: the json's file
name and a digest of its key (`get_cache_key`: the json's sha256 and size, the image root, the format,
`FORMAT_VERSION`). A json changed in any way, even with its size and modification time kept, has a new name;
copies of one json on several machines (other inodes, other paths) share one file, whoever built it. A machine
hashes a json once: ``.sha256/`` in the cache folder (read-only: in the private node-local folder) keeps each
json's sha256 with its device, inode, size, mtime and ctime (the kernel sets the ctime on any change; no copy
or archive tool restores it). After its parse the json's stat signature is compared with the one its key was
made from, and its hash too (the memo answers unless it changed): a json changed meanwhile, even changed back,
is parsed again, never published under the key's name nor its parse error kept as that content's.

Rules (what runs first, who may touch what):
- a writer writes under a temporary name unique across machines and containers (host, boot id, pid namespace,
  pid, random), fsyncs, then publishes with a hard link that fails when the name exists (where hard links fail,
  ``renameat2(RENAME_NOREPLACE)``): a name, once given, is never replaced. Where two writers race (no working
  locks), the loser drops its copy and maps the winner's.
- a writer removes only temporary files of writers provably dead: same host, boot and pid namespace, pid gone
  (of any name in its folder); the others stay, listed with their size by ``lazytrain cache``, until
  ``--clear``.
- a file found damaged or foreign under a name (a FIFO or a symbolic link too: cache files are opened without
  following links or blocking) is renamed aside (``<name>.damaged-...``), one warning naming it, and the name
  is written again: processes that map the damaged file keep their inode.
- the lock (``<name>.lock``, ``flock``, never opened through a symbolic link: at one, a warning and no lock)
  only spares duplicate parses; correctness never depends on it. A file
  system without locks (ENOSYS, ENOLCK, EBADF of NFS on a read-only lock file, ...) parses without one; every
  wait on a lock is bounded (`LOCK_WAIT_S`, `LOCK_CALL_S`) by an error naming ``LAZYTRAIN_CACHE``.
- clocks: a waiter takes a recorded parse failure (``<name>.failed``) only if recorded at or after it began to
  wait, and the racy-file guard compares this machine's clock with the json's mtime and ctime (the file
  server's on NFS); with clocks skewed between machines a waiter may parse again or take an earlier job's error
  for the same content (``--clear`` removes it), and a json rewritten within the skew could be memoized.
- only ``python -m lazytrain cache --clear`` removes cache files (see its help for running jobs); files in
  ``/dev/shm`` stay until it runs on that machine or the machine reboots.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import stat
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from lazytrain.data.datasets.cache_file import (
    FORMAT_VERSION,
    CacheFile,
    CacheFileError,
    map_cache_contents,
    write_cache_contents,
)
from lazytrain.errors import LazytrainError
from lazytrain.utils.file_io import fsync_folder

try:
    import fcntl
except ImportError:  # Windows: no flock; the cache then works without a lock (see the module docstring)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_CALL_S",
    "LOCK_WAIT_S",
    "CacheLock",
    "CacheWriter",
    "get_cache_dir",
    "get_cache_key",
    "get_cache_path",
    "get_json_signature",
    "get_node_local_dir",
    "get_parse_failure",
    "get_private_folder_problem",
    "hash_file",
    "is_same_source",
    "list_cache_files",
    "make_private_folder",
    "move_aside",
    "record_parse_failure",
    "read_cache_file",
    "write_cache_file",
]

logger = logging.getLogger(__name__)

LOCK_WAIT_S = 1800.0
"""Longest wait for another process's parse (LVIS takes minutes); then an error says what to do."""

LOCK_CALL_S = 120.0
"""Longest one lock call may take (NFS without lockd can hang in it); then an error says what to do."""

_SUFFIX = ".records"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
_LOCK_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
_CHUNK = 1 << 20  # hashing buffer: a few of them fit the CPU's cache
_IDENTITY = ("version", "sha256", "size", "image_root", "lvis")
_NO_LOCK_ERRNOS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
_NODE_LOCAL_ROOT = "/dev/shm"
_RACY_S = 2.0  # see _hash_with_memo


def get_cache_dir() -> str:
    """``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``."""
    folder = os.environ.get("LAZYTRAIN_CACHE")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "lazytrain")
    return os.path.abspath(os.path.expanduser(folder))


def get_node_local_dir() -> str | None:
    """The folder used when the cache folder cannot be written: ``/dev/shm/lazytrain-cache-<uid>`` (memory of
    this machine, shared by its processes, gone at reboot); None where there is no ``/dev/shm``.

    Its name is predictable, so another user may have made it first: it is used only after `make_private_folder`
    found it this user's own (see `get_private_folder_problem`).
    """
    if not os.path.isdir(_NODE_LOCAL_ROOT):
        return None
    return os.path.join(_NODE_LOCAL_ROOT, f"lazytrain-cache-{os.getuid()}")


def get_private_folder_problem(folder: str) -> str | None:
    """Why `folder` is not this user's private folder (a symbolic link, another owner, open to other users), or
    None when it is. Another user who could write it could plant a cache file with wrong labels; one who made it
    first could replace its files. ``/dev/shm`` is sticky: once checked, no other user can rename it away."""
    try:
        status = os.lstat(folder)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(status.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(status.st_mode):
        return "not a folder"
    if status.st_uid != os.getuid():
        return f"owned by uid {status.st_uid}, not by this user (uid {os.getuid()})"
    if status.st_mode & 0o077:
        return f"mode {stat.S_IMODE(status.st_mode):o}: other users may read or write it (0700 expected)"
    return None


def make_private_folder(folder: str) -> str | None:
    """Create `folder` with mode 0700 unless it exists; then `get_private_folder_problem` of it."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot be created ({e.strerror})"
    return get_private_folder_problem(folder)


def _open_regular(path: str) -> int:
    """A read descriptor of the regular file at `path`; never blocks (a FIFO) nor follows a symbolic link.

    Raises:
        OSError: ENOENT when there is none; ELOOP for a symbolic link; EINVAL, its text naming the kind, for a
            FIFO, a device or a folder.
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket"}.get(
            kind, "a device"
        )
        raise OSError(errno.EINVAL, f"{what}, not a regular file")
    return fd


def _hash_descriptor(fd: int, offset: int = 0, length: int | None = None) -> str:
    """The sha256 (hex) of `length` bytes (default: to the end) of `fd` from `offset`, read into one reused
    buffer: never a map, so a file truncated meanwhile gives a short read, not a SIGBUS."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    position, end = offset, None if length is None else offset + length
    while end is None or position < end:
        wanted = _CHUNK if end is None else min(_CHUNK, end - position)
        count = os.preadv(fd, [view[:wanted]], position)
        if count == 0:
            break
        digest.update(view[:count])
        position += count
    return digest.hexdigest()


def hash_file(path: str) -> str:
    """The sha256 of the file at `path` (hex), read in 1 MiB chunks into one reused buffer.

    Not through a map: a json truncated while it is hashed (rewritten in place) would raise SIGBUS in a map; a
    read returns what is there, and the changed file's stat (see `get_cache_key`) tells it apart.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _hash_descriptor(fd)
    finally:
        os.close(fd)


def _stat_signature(status: os.stat_result) -> list[int]:
    # ctime is set by the kernel on every change (a write, utime, rename) and no user tool can restore it:
    # `cp -p`, `rsync -t` and archives keep the mtime, never the ctime.
    return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]


def _memo_path(path: str, folder: str | None = None) -> str:
    """This machine's memo of `path`'s sha256 in `folder` (default `get_cache_dir`) (another machine sees other
    devices and inodes)."""
    digest = hashlib.sha256(f"{_host()}\0{path}".encode()).hexdigest()[:32]
    return os.path.join(folder or get_cache_dir(), ".sha256", f"{digest}.json")


def _read_memo(memo: str, status: os.stat_result) -> str | None:
    """The sha256 a memo keeps for a file of `status`; None without a memo of that very file."""
    try:
        fd = _open_regular(memo)
        with os.fdopen(fd, "rb") as f:
            saved = json.loads(f.read(4096))
        if saved["stat"] == _stat_signature(status) and _HEX64.fullmatch(saved["sha256"]):
            return saved["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo, or not one of ours
    return None


def _write_memo(memo: str, status: os.stat_result, digest: str) -> bool:
    """Keep `digest` for the file of `status`; False where the folder cannot be written."""
    try:
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        tmp = f"{memo}.tmp~{_writer_tag()}"
        with open(tmp, "x") as f:
            json.dump({"stat": _stat_signature(status), "sha256": digest}, f)
        os.replace(tmp, memo)  # a memo is read whole and never mapped: replacing it is safe
    except OSError:
        return False  # a read-only cache folder: hash every time
    return True


def _hash_with_memo(path: str) -> tuple[str, os.stat_result]:
    """(`hash_file`, the stat taken before it), the hash skipped when this machine hashed the same file (same
    device, inode, size, mtime, ctime).

    As git's index does for racy files, a file changed less than `_RACY_S` before its hash began is not
    memoized: a change within the clock's granularity of the last one could leave its ctime as it was. The time
    is taken before the hash, not after: a slow hash must not make a change made as it began look old.
    """
    start = time.time()
    before = os.stat(path)
    saved = _recall(path, get_cache_dir(), before)
    if saved is not None:
        return saved, before
    digest = hash_file(path)
    after = os.stat(path)
    racy = start - max(after.st_mtime, after.st_ctime) < _RACY_S
    if _stat_signature(after) == _stat_signature(before) and not racy:
        _remember(path, get_cache_dir(), after, digest)
    return digest, before


def _recall(path: str, folder: str, status: os.stat_result) -> str | None:
    """The sha256 this machine kept for `path` as of `status`, from `folder`'s ``.sha256/`` or, where that is
    read-only (a team's folder), this user's private node-local folder's."""
    saved = _read_memo(_memo_path(path, folder), status)
    node_local = get_node_local_dir()
    if saved is None and node_local not in (None, folder) and get_private_folder_problem(node_local) is None:
        saved = _read_memo(_memo_path(path, node_local), status)
    return saved


def _remember(path: str, folder: str, status: os.stat_result, digest: str) -> None:
    """Keep `digest` for `_recall`: in `folder`, else in this user's private node-local folder."""
    if _write_memo(_memo_path(path, folder), status, digest):
        return
    node_local = get_node_local_dir()
    if node_local is not None and node_local != folder and make_private_folder(node_local) is None:
        _write_memo(_memo_path(path, node_local), status, digest)


def get_cache_key(json_file: str, image_root: str, *, lvis: bool) -> dict:
    """What a cache file must have been built from to serve `json_file` now (JSON-serializable).

    The json's content (sha256, about 1 s per GB) is the key, not its path, inode or modification time: a
    json fixed in place with its size and time kept gets a new cache file, and copies of one json on several
    machines share one. ``json_file`` is kept for ``lazytrain cache``'s listing only. A machine hashes a file
    once: the sha256 is kept with the file's device, inode, size, mtime and ctime (any change sets the ctime).
    ``stat`` is that stat signature as of the hash (`get_json_signature`), for telling a json changed since;
    it is no part of the identity and is not written into the cache file.
    """
    path = os.path.realpath(json_file)
    digest, status = _hash_with_memo(path)
    return {
        "version": FORMAT_VERSION,
        "sha256": digest,
        "size": status.st_size,
        "image_root": image_root,
        "lvis": lvis,
        "json_file": path,
        "stat": _stat_signature(status),
    }


def get_json_signature(json_file: str) -> list[int] | None:
    """The json's stat signature now (device, inode, size, mtime, ctime; the ``stat`` of `get_cache_key`), None
    when it is gone. Any write sets the ctime: a json changed and changed back has another signature."""
    try:
        return _stat_signature(os.stat(os.path.realpath(json_file)))
    except OSError:
        return None


def is_same_source(key: dict, other: dict) -> bool:
    """Whether two keys describe the same records (same content, image root, format and version)."""
    return all(key.get(field) == other.get(field) for field in _IDENTITY)


def get_cache_path(key: dict, folder: str | None = None) -> str:
    """The cache file of `key` (`get_cache_key`) in `folder` (default `get_cache_dir`); it may not exist."""
    identity = "\0".join(str(key[field]) for field in _IDENTITY)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    stem = os.path.splitext(os.path.basename(key["json_file"]))[0]
    return os.path.join(folder or get_cache_dir(), f"{stem}-{digest}{_SUFFIX}")


_CHECKED: set[tuple] = set()  # (path, stat signature) of the files whose record bytes this process checked


def _check_records(
    fd: int, path: str, status: os.stat_result, entry: list, checked: list[int] | None
) -> None:
    """The record bytes against their sha256, once per machine and file: skipped when this process, the one
    that handed it the file (`checked`), or a memo (this host, the file's device, inode, size, mtime and ctime)
    saw that check pass (1 s per GB). The memo is kept in the file's folder's ``.sha256/``, or where that is
    read-only (a team's folder) in this user's private node-local folder (`get_node_local_dir`).

    Read, not through the map: a check must not leave a GB of mapped pages counted in each rank's PSS. A cache
    file is never written after its name is given (its name is its content), so what was checked stays.
    """
    signature = _stat_signature(status)
    if (path, tuple(signature)) in _CHECKED or checked == signature:
        _CHECKED.add((path, tuple(signature)))
        return
    _, count, offset, digest = entry
    if _recall(path, os.path.dirname(path), status) != digest:
        if _hash_descriptor(fd, offset, count) != digest:
            raise ValueError("its record bytes do not match their sha256")
        _remember(path, os.path.dirname(path), status, digest)
    _CHECKED.add((path, tuple(signature)))


def read_cache_file(path: str, *, checked: list[int] | None = None) -> CacheFile | None:
    """Map the cache file at `path`; None when there is no file.

    Every part of the file is checked before any of it is used: the table against the sha256 in the header,
    each array against its sha256 in the table, the record bytes once per machine (see `_check_records`).

    Args:
        checked: the stat signature of a file whose record bytes the caller's process checked (`CacheFile`).

    Raises:
        CacheFileError: the file is not a complete, valid cache file of this version (damaged, truncated,
            foreign, a FIFO or a symbolic link); nothing of it was decoded beyond its JSON table.
    """
    try:
        fd = _open_regular(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        reason = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise CacheFileError(path, f"cannot be read ({reason})") from None
    try:
        status = os.fstat(fd)
        try:
            cache, records_entry = map_cache_contents(fd, path, status.st_size)
            _check_records(fd, path, status, records_entry, checked)
        except CacheFileError as e:
            raise CacheFileError(path, e.reason, status) from None
        except Exception as e:  # the record bytes' entry was checked by map_cache_contents: only a mismatch
            raise CacheFileError(path, f"{type(e).__name__}: {e}", status) from None
    finally:
        os.close(fd)
    cache.checked = _stat_signature(status)
    return cache


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


def _boot_id() -> str:
    """This boot of this machine: every machine's first pid namespace has the same inode, and two machines can
    share a hostname (cloned images), so host and namespace alone do not tell a writer's machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return re.sub(r"[^0-9a-f]", "", f.read()) or "0"
    except OSError:
        return "0"


def _writer_tag() -> str:
    return f"{_host()}~{_boot_id()}~{_pid_namespace()}~{os.getpid()}~{secrets.token_hex(4)}"


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


_TEMPORARY_PATTERNS = (f".*{_SUFFIX}.tmp~*", f"*{_SUFFIX}.failed.tmp~*")  # a writer's, a failure record's


def _remove_dead_writers_files(folder: str) -> None:
    """Remove the temporary files in `folder`, of any cache file's name, of writers that provably died: this
    host, this boot, this pid namespace, a pid that no longer exists (a crashed run started again on the same
    machine). Another machine's or container's files, and those of an earlier boot (a cloned machine may share
    the hostname), are left alone, as their writer may live: ``lazytrain cache`` lists them with their size
    and ``--clear`` removes them."""
    here = (_host(), _boot_id(), _pid_namespace())
    for pattern in _TEMPORARY_PATTERNS:
        for tmp in glob.glob(os.path.join(glob.escape(folder), pattern)):
            host, boot, namespace, pid = (tmp.rsplit(".tmp~", 1)[1].split("~") + ["", "", "", ""])[:4]
            if (host, boot, namespace) == here and pid.isdigit() and not _is_alive(int(pid)):
                try:
                    os.remove(tmp)
                except FileNotFoundError:
                    pass


class CacheWriter:
    """A cache file written under a temporary name unique to this process, published under `path` only whole.

    Creating it creates the temporary file: an unwritable folder fails here, before anything is parsed. Use it
    as a context manager; leaving the block removes the temporary file unless `publish` linked it.

    Args:
        path: the cache file's name (`get_cache_path`).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        folder, name = os.path.split(path)
        _remove_dead_writers_files(folder)
        self._tmp = os.path.join(folder, f".{name}.tmp~{_writer_tag()}")
        self._published, self._records_digest = False, ""
        self._file: IO[bytes] = os.fdopen(
            os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb"
        )

    def write(self, records: Iterable[dict], metadata: dict, key: dict) -> None:
        """Write the file's contents (again, from the start, when called twice; `write_cache_contents`)."""
        # The json's stat is this machine's view of it, no part of what the file was built from.
        key = {field: value for field, value in key.items() if field != "stat"}
        self._records_digest = write_cache_contents(self._file, records, metadata, key)

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
            published = _rename_without_replacing(self._tmp, self.path)
        fsync_folder(os.path.dirname(self.path))
        self._published = published
        return published

    def read(self) -> CacheFile | None:
        """`read_cache_file` of the name, after the block. This writer's own file is not hashed again: its record
        bytes were hashed as they were written, and that sha256 is kept as this machine's memo of the file (the
        other ranks waiting on the lock skip the check too)."""
        if self._published:
            try:
                status = os.stat(self.path)  # after the temporary name's removal, which sets the ctime
            except FileNotFoundError:
                return None
            _remember(self.path, os.path.dirname(self.path), status, self._records_digest)
        return read_cache_file(self.path)

    def __enter__(self) -> CacheWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._file.close()
        try:
            os.remove(self._tmp)
        except FileNotFoundError:
            pass


_RENAME_NOREPLACE = 1  # linux/fs.h
_AT_FDCWD = -100


def _rename_without_replacing(source: str, target: str) -> bool:
    """Rename `source` to `target` unless `target` exists; False when it does.

    Where hard links fail (some FUSE and SMB mounts), ``renameat2(RENAME_NOREPLACE)`` (Linux 3.15, glibc 2.28)
    is the kernel's own rename that fails on an existing name. Where the file system refuses that flag too
    (EINVAL) or there is no renameat2, the name is checked first, then renamed: two writers racing between the
    check and the rename give the name twice. The second file replaces the first; both hold records of the same
    key (the same json content) but not equal bytes (the table keeps the json's path), and a process that
    mapped the first keeps its inode, so only a reader on NFS could see that file go (ESTALE).
    """
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return True
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            return False
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), target)
    if os.path.lexists(target):
        return False
    os.rename(source, target)
    return True


def _load_renameat2() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux, or a libc before 2.28
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


_renameat2 = _load_renameat2()


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


_FAILURE_TYPES = {"ValueError": ValueError, "TypeError": TypeError}


def record_parse_failure(path: str, error: Exception) -> None:
    """Keep `error` (a bad json's ValueError or TypeError) beside the cache file `path` (``<path>.failed``),
    so that the ranks waiting on the lock raise it at once instead of each parsing the same json in turn.
    Best effort: a folder that cannot be written only costs those parses."""
    if type(error).__name__ not in _FAILURE_TYPES:
        return
    try:
        tmp = f"{path}.failed.tmp~{_writer_tag()}"
        with open(tmp, "x") as f:
            json.dump({"type": type(error).__name__, "message": str(error), "time": time.time()}, f)
        os.replace(tmp, f"{path}.failed")
    except OSError:
        pass


def get_parse_failure(path: str, since: float) -> Exception | None:
    """The error `record_parse_failure` kept for `path` at or after `since` (a time.time(): when the caller began
    to wait for the lock), else None: only processes that waited for the failing parse take its error; a later
    one (a new job, maybe a newer lazytrain) parses again."""
    try:
        fd = _open_regular(f"{path}.failed")
        with os.fdopen(fd, "rb") as f:
            saved = json.loads(f.read(1 << 16))
        kind, message, when = _FAILURE_TYPES[saved["type"]], saved["message"], float(saved["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return kind(message) if isinstance(message, str) and when >= since else None


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
    if isinstance(error, OSError) and error.errno == errno.EBADF:
        # Linux NFS emulates flock with POSIX locks, whose exclusive lock needs a writable descriptor: another
        # user's lock file opened read-only. Parsing stays correct without the lock (see the module docstring).
        logger.debug("No lock on %s (read-only lock file on NFS): parsing without one.", lock_path)
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

    def _open(self) -> int | None:
        """The lock file's descriptor; None for a symbolic link at its name (never followed: it could point at
        any file this user may write, which O_CREAT would create)."""
        try:
            try:
                return os.open(self._lock_path, _LOCK_FLAGS | os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError as e:
                # Another user's lock file in a shared folder: flock needs only a read handle.
                try:
                    return os.open(self._lock_path, _LOCK_FLAGS | os.O_RDONLY)
                except FileNotFoundError:
                    raise e from None  # no lock file and no right to make one: a folder this user cannot write
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            return None

    def __enter__(self) -> CacheLock:
        if fcntl is None:
            return self
        self._fd = self._open()
        if self._fd is None:
            logger.warning(
                "The annotation cache's lock file %s is a symbolic link: not following it; parsing %s without "
                "a lock (the cache file is still published once). Remove the link.",
                self._lock_path,
                self._what,
            )
            return self
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
