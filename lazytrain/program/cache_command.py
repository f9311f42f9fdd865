"""``python -m lazytrain cache [NAME|JSON ...] [--clear]``: where the annotation cache files are, and removing them.

    python -m lazytrain cache                          # every cache file: its json, format, size, state
    python -m lazytrain cache lvis_v1_train            # the cache file of a built-in data set
    python -m lazytrain cache data/train.json          # the cache files of a json (any image root, format)
    python -m lazytrain cache lvis_v1_train --clear    # remove it (it is rebuilt on the next load)
    python -m lazytrain cache --clear                  # remove every cache file

The first process that loads a COCO/LVIS json writes its records and arrays into a cache file, which every
rank and loader worker then maps (`lazytrain.data.datasets.annotation_cache`). The files live in
``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain`` (and in
``/dev/shm/lazytrain-cache-<uid>`` where that folder could not be written: this machine's memory, listed and
cleared only by this command on this machine, else kept until reboot). A file is named after its json's
content and never rewritten: a changed json gets a new file, and the old one stays until cleared. Clearing is
for disk space only. The state a listing gives is this machine's view: ``not this machine's json`` means the
json at that path here has other content; another machine with other content there may still use the file.

Clearing and running jobs: a process that has mapped a file keeps reading it after its removal on a local
disk, but on NFS and other network file systems a file removed while another machine maps it can kill that
job (SIGBUS, ESTALE), and a job's loader workers started later cannot reopen it. Clear when no job uses the
folder. The listing without names also gives each leftover file with its size: unfinished temporary files
(of a writer still running, or of one that died on another machine or before a reboot: a writer removes only
those of writers provably dead on its own machine) and files moved aside as damaged. ``--clear`` without names
removes them, and lock files, hash memos and recorded parse failures (a writer still running then fails and
its run must be started again).
"""

from __future__ import annotations

import glob
import os
import sys

from lazytrain.data.datasets.annotation_cache import (
    get_cache_dir,
    get_cache_key,
    get_node_local_dir,
    get_private_folder_problem,
    is_same_source,
    list_cache_files,
    read_cache_file,
)
from lazytrain.data.datasets.builtin import get_annotation_source
from lazytrain.data.datasets.cache_file import CacheFile, CacheFileError
from lazytrain.program.run_command import CommandLineError, run_command

__all__ = ["main"]


_RUNNING_JOBS = (
    "Jobs that mapped a removed file keep reading it on a local disk; on NFS and other network file systems "
    "they can fail (SIGBUS, ESTALE): clear only when no job uses these files."
)


def _state(key: dict) -> str:
    """``current``, ``not this machine's json`` (the json at that path here has other content: a load here
    writes a new file; another machine may still use this one) or ``json missing here``."""
    if not os.path.isfile(key["json_file"]):
        return "json missing here"
    now = get_cache_key(key["json_file"], key["image_root"], lvis=key["lvis"])
    return "current" if is_same_source(now, key) else "not this machine's json"


def _format(cache: CacheFile) -> str:
    """The json's format (LVIS categories carry a frequency) and, where it differs, the loader that read it
    (`register_json_dataset` reads COCO jsons with the LVIS loader, which reads both)."""
    is_lvis = any(isinstance(c, dict) and "frequency" in c for c in cache.metadata["categories"])
    kind = "lvis" if is_lvis else "coco"
    return (
        kind
        if cache.key["lvis"] == is_lvis
        else f"{kind} (read by the {'lvis' if cache.key['lvis'] else 'coco'} loader)"
    )


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
    return (
        f"{path}  {size}  {len(cache)} images  {_format(cache)}  json={key['json_file']}  "
        f"image_root={key['image_root']}  {_state(key)}"
    )


def _folders() -> list[str]:
    """The cache folder, and this machine's fallback folder where it exists and is this user's own (another
    user's folder at that name is left alone: its files are not ours to list or remove)."""
    node_local = get_node_local_dir()
    if not node_local or node_local == get_cache_dir() or not os.path.lexists(node_local):
        return [get_cache_dir()]
    if get_private_folder_problem(node_local) is not None:
        return [get_cache_dir()]
    return [get_cache_dir(), node_local]


def _leftovers() -> list[str]:
    """Files moved aside as damaged, temporary files of unfinished (or running) writers, lock files (empty;
    removing one only lets two processes parse at once, which stays correct) and the jsons' hash memos."""
    found = []
    for folder in _folders():
        escaped = glob.escape(folder)
        found += glob.glob(os.path.join(escaped, "*.records.damaged-*"))
        found += glob.glob(os.path.join(escaped, ".*.records.tmp~*"))
        found += glob.glob(os.path.join(escaped, "*.records.lock"))
        found += glob.glob(os.path.join(escaped, "*.records.failed"))
        found += glob.glob(os.path.join(escaped, "*.records.failed.tmp~*"))
        found += glob.glob(os.path.join(escaped, ".sha256", "*"))
    return sorted(found)


def _describe_leftovers() -> list[str]:
    """A line for each temporary file and each file moved aside as damaged, with its size: a writer that died
    on another machine or before a reboot leaves its temporary file (up to the cache file's size) until
    ``--clear``. Lock files, hash memos and failure records are a few bytes each and not listed."""
    lines = []
    for path in _leftovers():
        if ".tmp~" in os.path.basename(path) or ".records.damaged-" in os.path.basename(path):
            try:
                size = os.lstat(path).st_size
            except FileNotFoundError:
                continue
            lines.append(f"leftover {path}  {size / 2**20:.1f} MiB  (--clear removes it)")
    return lines


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
    """(cache files of the jsons named, lines for names whose json has no cache file yet); a json path that is
    not there and is no cache file's json is an error."""
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
        if not matches and content is None and get_annotation_source(argument) is None:
            raise CommandLineError(
                f"{argument}: no such json file ({json_file}) and no cache file of one at that path; check the "
                "path, or run 'python -m lazytrain cache' to list every cache file with its json"
            )
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
    if clear:
        found = _clear(found + (_leftovers() if not arguments else []))
    print(f"cache folder: {get_cache_dir()}")
    problem = _node_local_problem()
    if problem:
        print(problem)
    for path in found:
        print(f"removed {path}" if clear else _describe(path))
    for line in missing:
        print(line)
    if not clear and not arguments:
        for line in _describe_leftovers():
            print(line)
    if not found and not missing:
        print("no cache files")
    elif clear and found:
        print(_RUNNING_JOBS)


def _clear(paths: list[str]) -> list[str]:
    """Remove `paths` (all of them before anything is printed: a reader of stdout that stops early, ``| head``,
    must not stop the clearing); the ones removed."""
    removed = []
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    for folder in _folders():
        try:
            os.rmdir(os.path.join(folder, ".sha256"))
        except OSError:
            pass  # not there, or holds another file
    return removed


def _node_local_problem() -> str | None:
    """A line naming this machine's fallback folder where another user made it or may write it (left alone)."""
    node_local = get_node_local_dir()
    if not node_local or not os.path.lexists(node_local):
        return None
    problem = get_private_folder_problem(node_local)
    return None if problem is None else f"left alone: {node_local} ({problem}); lazytrain does not use it"


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
