"""``python -m lazytrain cache [NAME|JSON ...] [--clear]``: where the annotation cache files are, and removing them.

    python -m lazytrain cache                          # every cache file: its json, format, size, state
    python -m lazytrain cache lvis_v1_train            # the cache file of a built-in data set
    python -m lazytrain cache data/train.json          # the cache files of a json (any image root, format)
    python -m lazytrain cache lvis_v1_train --clear    # remove it (it is rebuilt on the next load)
    python -m lazytrain cache --clear                  # remove every cache file

The first process that loads a COCO/LVIS json writes its records and arrays into a cache file, which every
rank and loader worker then maps (`lazytrain.data.datasets.annotation_cache`). The files live in
``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain`` (and in
``/dev/shm/lazytrain-cache-<uid>`` where that folder could not be written). A file is named after its json's
content and never rewritten: a changed json gets a new file, and the old one stays until cleared. Clearing is
for disk space only.

Clearing and running jobs: a process that has mapped a file keeps reading it after its removal on a local
disk, but on NFS and other network file systems a file removed while another machine maps it can kill that
job (SIGBUS, ESTALE), and a job's loader workers started later cannot reopen it. Clear when no job uses the
folder. ``--clear`` without names also removes files moved aside as damaged, lock files, hash memos and
unfinished temporary files (a writer still running then fails and its run must be started again).
"""

from __future__ import annotations

import glob
import os
import sys

from lazytrain.data.datasets.annotation_cache import (
    CacheFileError,
    get_cache_dir,
    get_cache_key,
    get_node_local_dir,
    is_same_source,
    list_cache_files,
    read_cache_file,
)
from lazytrain.data.datasets.builtin import get_annotation_source
from lazytrain.program.run_command import CommandLineError, run_command

__all__ = ["main"]


_RUNNING_JOBS = (
    "Jobs that mapped a removed file keep reading it on a local disk; on NFS and other network file systems "
    "they can fail (SIGBUS, ESTALE): clear only when no job uses these files."
)


def _state(key: dict) -> str:
    """``current``, ``stale`` (its json changed since: the next load writes a new file) or ``json missing``."""
    if not os.path.isfile(key["json_file"]):
        return "json missing"
    now = get_cache_key(key["json_file"], key["image_root"], lvis=key["lvis"])
    return "current" if is_same_source(now, key) else "stale"


def _describe(path: str) -> str:
    size = f"{os.path.getsize(path) / 2**20:.1f} MiB"
    try:
        cache = read_cache_file(path)
    except CacheFileError as e:
        return (
            f"{path}  {size}  (not a valid cache file: {e.reason}; moved aside and rebuilt on the next load)"
        )
    if cache is None:
        return f"{path}  (removed meanwhile)"
    key = cache.key
    kind = "lvis" if key["lvis"] else "coco"
    return (
        f"{path}  {size}  {len(cache)} images  {kind}  json={key['json_file']}  image_root={key['image_root']}"
        f"  {_state(key)}"
    )


def _folders() -> list[str]:
    node_local = get_node_local_dir()
    extra = [node_local] if node_local and node_local != get_cache_dir() and os.path.isdir(node_local) else []
    return [get_cache_dir(), *extra]


def _leftovers() -> list[str]:
    """Files moved aside as damaged, temporary files of unfinished (or running) writers, lock files (empty;
    removing one only lets two processes parse at once, which stays correct) and the jsons' hash memos."""
    found = []
    for folder in _folders():
        escaped = glob.escape(folder)
        found += glob.glob(os.path.join(escaped, "*.records.damaged-*"))
        found += glob.glob(os.path.join(escaped, ".*.records.tmp~*"))
        found += glob.glob(os.path.join(escaped, "*.records.lock"))
        found += glob.glob(os.path.join(escaped, ".sha256", "*"))
    return sorted(found)


def _json_of(argument: str) -> str:
    """The json file `argument` names: a built-in data set's, or the file itself."""
    source = get_annotation_source(argument)
    if source is not None:
        return source.json_file
    if os.path.isfile(argument) or argument.endswith(".json"):
        return argument
    raise CommandLineError(
        f"{argument!r} is neither a built-in data set name (coco_2017_*, lvis_v1_*, synthetic_lt_*) nor a json "
        "file; for a data set registered in a config (register_json_dataset), give its json_file"
    )


def _read_key(path: str) -> dict | None:
    try:
        cache = read_cache_file(path)
    except CacheFileError:
        return None
    return None if cache is None else cache.key


def _matching(arguments: list[str]) -> tuple[list[str], list[str]]:
    """(cache files of the jsons named, lines for names whose json has no cache file yet)."""
    files = [path for folder in _folders() for path in list_cache_files(folder)]
    if not arguments:
        return files, []
    keys = {path: _read_key(path) for path in files}
    found, missing = [], []
    for argument in arguments:
        json_file = os.path.realpath(_json_of(argument))
        content = get_cache_key(json_file, "", lvis=False)["sha256"] if os.path.isfile(json_file) else None
        matches = [
            path
            for path, key in keys.items()
            if key is not None and (key["json_file"] == json_file or key["sha256"] == content)
        ]
        found += [p for p in matches if p not in found]
        if not matches:
            missing.append(f"{argument}: no cache file yet (it will be in {get_cache_dir()})")
    return found, missing


def _cache(argv: list[str]) -> None:
    clear = "--clear" in argv
    arguments = [a for a in argv if a != "--clear"]
    unknown = [a for a in arguments if a.startswith("-")]
    if unknown:
        raise CommandLineError(f"unknown option {unknown[0]} (--help shows the options)")
    found, missing = _matching(arguments)
    print(f"cache folder: {get_cache_dir()}")
    if clear and not arguments:
        found += _leftovers()
    for path in found:
        if clear:
            try:
                os.remove(path)
            except FileNotFoundError:
                continue
            print(f"removed {path}")
        else:
            print(_describe(path))
    for line in missing:
        print(line)
    if not found and not missing:
        print("no cache files")
    elif clear and found:
        print(_RUNNING_JOBS)


def _cache_to_a_pipe(argv: list[str]) -> None:
    """`_cache`, quiet when the reader of stdout stops early (``| head``)."""
    try:
        _cache(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush does not fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: list[str]) -> None:
    """Run ``cache`` (argv without the word ``cache``)."""
    run_command("cache", argv, _cache_to_a_pipe, __doc__)
