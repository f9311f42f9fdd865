"""``python -m lazytrain cache [NAME|JSON ...] [--clear]``: where the annotation cache files are, and removing them.

    python -m lazytrain cache                          # every cache file: its json, format, size, state
    python -m lazytrain cache lvis_v1_train            # the cache file of a built-in data set
    python -m lazytrain cache data/train.json          # the cache files of a json (any image root, format)
    python -m lazytrain cache lvis_v1_train --clear    # remove it (it is rebuilt on the next load)
    python -m lazytrain cache --clear                  # remove every cache file

The first process that loads a COCO/LVIS json writes its records and arrays into a cache file, which every
rank and loader worker then maps (`lazytrain.data.datasets.annotation_cache`). The files live in
``$LAZYTRAIN_CACHE``, else ``$XDG_CACHE_HOME/lazytrain``, else ``~/.cache/lazytrain``. A file whose json
changed is rebuilt on its own; clearing is for disk space, or to force a rebuild. Removing a file a running
job maps is safe for that job's processes already started.
"""

from __future__ import annotations

import os

from lazytrain.data.datasets.annotation_cache import (
    get_cache_dir,
    get_cache_key,
    get_cache_path,
    list_cache_files,
    read_cache_file,
)
from lazytrain.data.datasets.builtin import get_annotation_source
from lazytrain.program.run_command import CommandLineError, run_command

__all__ = ["main"]


def _state(key: dict) -> str:
    """``current``, ``stale`` (its json changed: rebuilt on the next load) or ``json missing``."""
    if not os.path.isfile(key["json_file"]):
        return "json missing"
    now = get_cache_key(key["json_file"], key["image_root"], lvis=key["lvis"])
    same = all(now[field] == key[field] for field in now)
    return "current" if same else "stale"


def _describe(path: str) -> str:
    cache = read_cache_file(path)
    size = f"{os.path.getsize(path) / 2**20:.1f} MiB"
    if cache is None:
        return f"{path}  {size}  (not a complete cache file of this version: rebuilt on the next load)"
    key = cache.key
    kind = "lvis" if key["lvis"] else "coco"
    return (
        f"{path}  {size}  {len(cache)} images  {kind}  json={key['json_file']}  image_root={key['image_root']}"
        f"  {_state(key)}"
    )


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


def _matching(arguments: list[str]) -> tuple[list[str], list[str]]:
    """(cache files of the jsons named, lines for names whose json has no cache file yet)."""
    files = list_cache_files()
    if not arguments:
        return files, []
    keys = {path: read_cache_file(path) for path in files}
    found, missing = [], []
    for argument in arguments:
        json_file = os.path.realpath(_json_of(argument))
        matches = [
            p for p, cache in keys.items() if cache is not None and cache.key["json_file"] == json_file
        ]
        found += [p for p in matches if p not in found]
        if not matches:
            source = get_annotation_source(argument)
            where = None
            if source is not None:
                where = get_cache_path(source.json_file, source.image_root, lvis=source.lvis)
            missing.append(f"{argument}: no cache file yet" + (f" (it will be {where})" if where else ""))
    return found, missing


def _cache(argv: list[str]) -> None:
    clear = "--clear" in argv
    arguments = [a for a in argv if a != "--clear"]
    unknown = [a for a in arguments if a.startswith("-")]
    if unknown:
        raise CommandLineError(f"unknown option {unknown[0]} (--help shows the options)")
    found, missing = _matching(arguments)
    print(f"cache folder: {get_cache_dir()}")
    for path in found:
        if clear:
            os.remove(path)
            print(f"removed {path}")
        else:
            print(_describe(path))
    for line in missing:
        print(line)
    if not found and not missing:
        print("no cache files")


def main(argv: list[str]) -> None:
    """Run ``cache`` (argv without the word ``cache``)."""
    run_command("cache", argv, _cache, __doc__)
