"""Weight files named by URL (``train.init_checkpoint=https://...``), downloaded once per machine.

A file lands in torch hub's cache, ``torch.hub.get_dir()/checkpoints/<file name>`` (``$TORCH_HOME/hub``,
by default ``~/.cache/torch/hub``): the place torchvision's ``resnet50(weights=...)`` uses, so a file either
program fetched serves both, and the place to copy a file to on a machine without internet. As in torch hub,
a file name ending in ``-<hex>.<ext>`` (8 or more hex digits after the last ``-``) gives the start of the
file's sha256. A download is checked against it before it is installed, and a cached file each time it is
used (hashing is cheap next to loading the file), so a wrong file copied into the cache by hand is found too.

Several processes at once (the launcher's check before it starts the ranks, then one process per GPU under
torchrun or SLURM, each running the program) download once:

- the first takes an exclusive lock on ``<file>.lock`` next to the destination (`filelock`, which uses
  ``flock``) and downloads; the others block on that lock (logging that they wait), then find the file and
  use it;
- the download goes to ``<file>.<random>.partial`` in the same folder and is renamed over the destination
  only when complete and verified (``os.replace``: atomic within one file system). Readers never see a
  partial file, an interrupted download leaves nothing at the destination, and where the lock does not
  work (some network file systems) two processes download twice but each installs a complete file;
- a process that dies while downloading releases the lock (the kernel drops it with the descriptor) and a
  waiting one downloads instead. filelock 4.x leaves the empty ``.lock`` file; 3.x removes it on release
  and, locking, checks that the file it locked was not removed meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator

import torch
from filelock import FileLock, Timeout

from lazytrain.errors import CheckpointError, ConfigError
from lazytrain.utils.logger import log_every_n_seconds

__all__ = ["download_to_cache", "get_cache_path", "get_hash_prefix", "is_url"]

logger = logging.getLogger(__name__)

# Per socket operation (connect, each read), not for the whole file: a machine whose firewall drops packets
# fails after this long instead of the OS's TCP timeout (about 2 minutes on Linux).
DEFAULT_TIMEOUT_S = 30.0
_CHUNK = 1 << 20
_HEX = re.compile(r"[0-9a-f]{8,}")


def is_url(path: str) -> bool:
    """Whether `path` is a URL (``scheme://...``) rather than a local path."""
    return "://" in path


def get_hash_prefix(file_name: str) -> str | None:
    """The sha256 prefix a torch hub style name carries (``resnet50-0676ba61.pth`` -> ``0676ba61``), or None.

    Torch hub's convention: the hex digits after the last ``-``, up to the next ``.``, at least 8 of them
    (a shorter run, as in ``mask-rcnn-a.pth``, is a word, not a hash).
    """
    if "-" not in file_name:
        return None
    candidate = file_name.rpartition("-")[2].split(".")[0]
    return candidate if _HEX.fullmatch(candidate) else None


def get_cache_path(url: str) -> str:
    """Where `url` is cached on this machine: ``torch.hub.get_dir()/checkpoints/<its file name>``.

    Raises:
        ConfigError: the URL's path names no file.
    """
    name = os.path.basename(urllib.parse.urlparse(url).path)
    if not name:
        raise ConfigError(
            f"train.init_checkpoint={url}: the URL names no file (its path ends with '/'). Give the URL of the "
            "weights file itself."
        )
    return os.path.join(torch.hub.get_dir(), "checkpoints", name)


def download_to_cache(url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """The local copy of `url` in torch hub's cache, downloaded first if this machine has none.

    Safe to call from many processes at once: one downloads, the others wait for it (module docstring).

    Args:
        url: an ``http://`` or ``https://`` URL of a weights file.
        timeout: seconds to wait for the server to connect or send more bytes.

    Returns:
        The path of the verified file (`get_cache_path`).

    Raises:
        ConfigError: the URL is not http(s), could not be downloaded (offline, refused, HTTP error; the
            message names the URL, the cache path to put the file at, and the ``train.init_checkpoint``
            alternatives), or the cache folder cannot be written.
        CheckpointError: the file's sha256 does not start with the prefix in its name (the downloaded copy
            is discarded; a cached copy is removed).
    """
    if urllib.parse.urlparse(url).scheme not in ("http", "https"):
        raise ConfigError(
            f"train.init_checkpoint={url}: only http:// and https:// URLs are downloaded. Copy the file to this "
            "machine and set train.init_checkpoint=PATH."
        )
    destination = get_cache_path(url)
    hash_prefix = get_hash_prefix(os.path.basename(destination))
    # Fast path without the lock: files only ever appear at the destination complete (by rename).
    if os.path.isfile(destination) and _has_hash(destination, hash_prefix):
        return destination
    with _exclusive_lock(url, destination):
        if os.path.isfile(destination):  # downloaded by a process this one waited for, or a wrong file
            _remove_if_wrong(url, destination, hash_prefix)
        else:
            _download(url, destination, hash_prefix, timeout)
    return destination


@contextlib.contextmanager
def _exclusive_lock(url: str, destination: str) -> Iterator[None]:
    """Hold ``<destination>.lock`` (a `filelock.FileLock`: ``flock`` on this kernel) while the block runs."""
    lock = FileLock(destination + ".lock", mode=0o666)  # any user of a shared cache may take it
    locked = _acquire(lock, url, destination)
    try:
        yield
    finally:
        if locked:
            lock.release()


def _acquire(lock: FileLock, url: str, destination: str) -> bool:
    """Take `lock`, waiting (and saying so) while another process holds it; False where locks do not work."""
    folder = os.path.dirname(destination)
    try:
        os.makedirs(folder, exist_ok=True)
        try:
            lock.acquire(blocking=False)
        except Timeout:
            logger.info("Waiting for another process to download %s to %s", url, destination)
            lock.acquire()
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise ConfigError(
                f"train.init_checkpoint={url}: cannot write torch hub's cache folder {folder} ({e}). Set "
                "TORCH_HOME to a writable folder, or download the file yourself and set train.init_checkpoint=PATH."
            ) from e
        # No lock support here (some network file systems): going on is still correct, as each process
        # installs a complete file by rename; at worst the file is downloaded more than once.
        logger.debug("No file lock on %s (%s): downloading without one.", folder, e)
        return False
    return True


def _has_hash(path: str, hash_prefix: str | None) -> bool:
    if hash_prefix is None:
        return True
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except FileNotFoundError:  # a wrong file removed by another process meanwhile: as if never there
        return False
    return digest.hexdigest().startswith(hash_prefix)


def _remove_if_wrong(url: str, destination: str, hash_prefix: str | None) -> None:
    """Under the lock: remove the cached file and raise when its sha256 does not start with `hash_prefix`."""
    if _has_hash(destination, hash_prefix):
        return
    os.remove(destination)
    raise CheckpointError(
        f"train.init_checkpoint={url}: the cached file {destination} is not the published file (its sha256 does "
        f"not start with {hash_prefix}, as its name says) and was removed. Run again to download it, or copy the "
        'right file there, or set train.init_checkpoint=PATH (a local copy) or train.init_checkpoint="" (random '
        "weights)."
    )


def _download(url: str, destination: str, hash_prefix: str | None, timeout: float) -> None:
    """Stream `url` to a temporary file next to `destination`, verify it, then rename it into place."""
    partial = f"{destination}.{uuid.uuid4().hex}.partial"
    digest = hashlib.sha256()
    received = 0
    start = time.perf_counter()
    logger.info("Downloading %s to %s", url, destination)
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "lazytrain"})
        with urllib.request.urlopen(request, timeout=timeout) as response, open(partial, "xb") as out:
            size = response.headers.get("Content-Length")
            total = f" of {int(size) / 2**20:.0f}" if size and size.isdigit() else ""
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                log_every_n_seconds(logging.INFO, f"  {received / 2**20:.0f}{total} MB of {url}", n=10)
        if hash_prefix is not None and not digest.hexdigest().startswith(hash_prefix):
            raise CheckpointError(
                f"train.init_checkpoint={url}: the downloaded file has sha256 {digest.hexdigest()[:16]}..., not "
                f"starting with {hash_prefix} as its name says; it was discarded and {destination} left as it "
                "was. Check the URL, or download the file yourself and set train.init_checkpoint=PATH."
            )
        os.replace(partial, destination)
    except (OSError, http.client.HTTPException) as e:  # URLError, HTTPError, refused, timeouts, DNS failures
        raise ConfigError(_offline_message(url, destination, e)) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
    verified = "sha256 verified" if hash_prefix else "not verified: its name carries no sha256 prefix"
    logger.info(
        "Downloaded %s (%.1f MB in %.1f s, %s)", url, received / 2**20, time.perf_counter() - start, verified
    )


def _offline_message(url: str, destination: str, error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        reason = f"HTTP {error.code} {error.reason}"
    elif isinstance(error, urllib.error.URLError):
        reason = str(error.reason)
    else:
        reason = str(error) or type(error).__name__
    return (
        f"train.init_checkpoint={url}: could not download it ({reason}). Without internet, copy the file to "
        f"{destination} (this machine's torch hub cache, looked at first), or set train.init_checkpoint=PATH "
        'to a local copy, or train.init_checkpoint="" to start from random weights.'
    )
