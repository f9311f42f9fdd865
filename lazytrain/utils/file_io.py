"""File access shared by every layer: the iopath `PathManager`, safe reading of torch files, atomic writes.

One `PathManager` reads annotation files, images and checkpoints, so a handler registered on it (a URL scheme,
a cluster file system) serves all of them. `load_torch_file` reads checkpoints and initial weights with
``torch.load(weights_only=True)`` and errors that say what the file is; `atomic_write` writes a file that is
either complete or absent, whenever the process is killed.

torch is imported by `load_torch_file` only: the data loaders read through this module too, and the launcher
imports them (its checks before spawning) without needing torch.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Callable
from typing import IO, Any

from iopath.common.file_io import PathManager as _PathManagerClass

from lazytrain.errors import CheckpointError

__all__ = ["PathManager", "atomic_write", "fsync_folder", "get_non_checkpoint_reason", "load_torch_file"]

PathManager = _PathManagerClass()
"""The iopath path manager for every file lazytrain reads (register handlers on it for URLs)."""


def fsync_folder(directory: str) -> None:
    """Make a new name in `directory` durable; best effort, as some file systems cannot open or sync a folder."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[IO[bytes]], Any], replace: bool = True) -> None:
    """Call ``write(file)`` on a temporary file next to `path`, fsync it, then rename it to `path`.

    The temporary file is ``.<name of path>.tmp<pid>`` in the same folder (the rename is atomic only within
    one file system); it is removed when `write` raises, but stays behind when the process is killed. With
    ``replace=False`` the file is linked to `path` instead, which raises FileExistsError when `path` exists by
    then (a file made since a caller's check is kept, not replaced).
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.remove(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_folder(directory)


def get_non_checkpoint_reason(local_path: str) -> str | None:
    """Why the file at `local_path` cannot be a torch checkpoint, judged from its first and last bytes (None
    when it looks like one: a complete zip archive, as ``torch.save`` writes, or a pickle)."""
    try:
        with open(local_path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if head.startswith(b"PK\x03\x04"):
        return None if zipfile.is_zipfile(local_path) else "a truncated or damaged torch file"
    if head[:1] == b"\x80":  # pickle protocol 2+ (torch's legacy format, or any pickle)
        return None
    return "empty" if not head else "not a torch file (neither a zip archive nor a pickle)"


def load_torch_file(path: str, local_path: str, *, allow_unsafe: bool, reader: str) -> Any:
    """``torch.load`` on CPU, weights only unless `allow_unsafe`, with errors that say what the file is.

    Args:
        path: the name the user gave (a path or URL), used in messages.
        local_path: the local file to read (`PathManager.get_local_path` of `path`, or a downloaded copy).
        allow_unsafe: allow arbitrary unpickling (only for files you trust).
        reader: who reads, the first word of the messages (``"Checkpointer"``, ``"load_init_weights"``).

    Raises:
        CheckpointError: the file is not a checkpoint (not a torch file, truncated), or it needs arbitrary
            unpickling and `allow_unsafe` is False. The message names `path` and `reader`.
    """
    import torch  # here, not at the top: see the module docstring

    reason = get_non_checkpoint_reason(local_path)
    if reason is not None:
        raise CheckpointError(
            f"{reader}: {path} is not a checkpoint: {reason}. Give a file written by lazytrain or torch.save (for "
            "a resumed run, delete the damaged file and point last_checkpoint at an earlier one)."
        )
    try:
        return torch.load(local_path, map_location="cpu", weights_only=not allow_unsafe)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{reader}: refused to load {path}: it needs arbitrary unpickling, which can run code "
            f"({str(e).splitlines()[0]}). Only if you trust this file, load it with allow_unsafe=True "
            "(train.allow_unsafe_checkpoint=true)."
        ) from None
    except (RuntimeError, EOFError) as e:
        raise CheckpointError(
            f"{reader}: {path} is not a readable checkpoint (truncated or corrupt): {str(e).splitlines()[0]}. "
            "Use an earlier checkpoint; files named in last_checkpoint are always complete."
        ) from None
