"""Checks of the json data sets a config registers (`register_json_dataset` nodes), run before any process
is spawned and before anything is written to the output directory.

For each file: it parses as COCO/LVIS json, its image folder exists, every listed image is there (one
directory listing per folder, not one stat per image), its entries are well formed (ids, sizes, file names,
boxes, masks when the recipe trains masks), and a val set's categories are the train set's. Each problem is
one message naming the file, the config key to change and the fix. The check reads a large data set's json in
well under a second, so it runs on every start (docs/benchmarks.md; tests/data/test_preflight.py holds it to
a bound).
"""

from __future__ import annotations

import itertools
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lazytrain.config import LazyConfig, tree
from lazytrain.data.datasets.json_summary import JsonSummary, summarize_json

__all__ = [
    "find_json_dataset_problems",
    "find_swept_json_dataset_problems",
    "get_json_dataset_keys",
    "is_registering_node",
    "read_node_value",
]

_REGISTER = "register_json_dataset"
_FIRST = 5
_FIXES = {
    "repeated image ids": "give every image a unique 'id'",
    "images without 'file_name'": "give every image a 'file_name' (relative to the image folder, or absolute)",
    "images without 'height'/'width'": "give every image its 'height' and 'width' in pixels",
    "repeated category ids": "give every category a unique 'id'",
    "categories without a 'name'": "give every category a 'name'",
    "annotations whose image_id is not in 'images'": (
        "remove those annotations or add their images (an id in quotes is a string, not the number)"
    ),
    "annotations whose category_id is not in 'categories'": (
        "remove those annotations or add their categories (an id in quotes is a string, not the number)"
    ),
    "annotations without 'bbox'": "give every annotation a 'bbox' [x, y, width, height] in pixels",
    "annotations whose 'bbox' is not 4 numbers": (
        "write every 'bbox' as [x, y, width, height], four numbers in pixels (a number in quotes is a string)"
    ),
    "images whose 'height'/'width' is not a positive number": (
        "write each image's 'height' and 'width' as numbers of pixels (a number in quotes is a string)"
    ),
}
BOX_ONLY_HINT = (
    "For a box-only data set train Faster R-CNN: python -m lazytrain lazytrain://rfs_fasterrcnn_custom with the "
    "same data.* keys."
)


def _register_nodes(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """(key path, node) of every call of `register_json_dataset` in `cfg`."""
    return [(path, node) for path, node in tree.nodes(cfg) if is_registering_node(node)]


def is_registering_node(node: Any) -> bool:
    """Whether `node` calls `register_json_dataset`."""
    target = tree.raw_target(node) if isinstance(node, DictConfig) else None
    return isinstance(target, str) and target.rsplit(".", 1)[-1] == _REGISTER


def read_node_value(node: DictConfig, key: str, path: str) -> tuple[str | None, str]:
    """(value or None when unset, the key the user sets: the interpolated key, e.g. data.train.json)."""
    raw = tree.raw_value(tree.child(node, key)) if key in node else None
    match = re.fullmatch(r"\$\{([\w.]+)\}", raw) if isinstance(raw, str) else None
    user_key = match.group(1) if match else f"{path}.{key}"
    try:
        value = node.get(key)
    except Exception:  # missing (???) or an interpolation to a missing value
        return None, user_key
    return (None if value in (None, "", "???") else str(value)), user_key


def _missing_images(summary: JsonSummary, image_root: str) -> list[str]:
    # String splitting and one listing per folder: os.path calls or a stat per image would dominate the check.
    by_folder: dict[str, list[str]] = defaultdict(list)
    for name in summary.file_names:
        if name is not None:
            folder, _, base = name.rpartition("/")
            by_folder[folder].append(base)
    missing = []
    for folder, bases in by_folder.items():
        try:
            present = set(os.listdir(os.path.join(image_root, folder)))
        except OSError:
            present = set()
        if not present.issuperset(bases):
            missing += [f"{folder}/{base}" if folder else base for base in bases if base not in present]
    return missing


def _entry_problems(summary: JsonSummary, json_key: str, needs_masks: bool) -> list[str]:
    problems = [
        f"{summary.json_file}: {count} {what}"
        + (f" (first ids: {', '.join(ids)})" if ids else "")
        + f"; {_FIXES[what]}."
        for what, ids, count in summary.problems
    ]
    first, count = summary.without_segmentation
    if needs_masks and count:
        if count == summary.num_annotations:
            problems.append(
                f"{summary.json_file}: no annotation has a 'segmentation' (a box-only data set), but this recipe "
                f"trains masks (dataloader.train.mapper.use_instance_mask=true). {BOX_ONLY_HINT}"
            )
        else:
            problems.append(
                f"{summary.json_file}: {count} of {summary.num_annotations} annotations have no 'segmentation' "
                f"(first ids: {', '.join(first)}), and this recipe trains masks; give them polygons or RLE, or "
                f"drop them. {BOX_ONLY_HINT}"
            )
    return problems


def _file_problems(
    json_file: str, json_key: str, image_root: str, root_key: str, needs_masks: bool, is_train: bool
) -> list[str]:
    try:
        summary = summarize_json(json_file)
    except FileNotFoundError:
        return [
            f"{json_key}={json_file}: no such file; pass the path of the COCO/LVIS json ({json_key}=PATH)."
        ]
    except ValueError as e:
        return [f"{json_key}: {e}"]
    problems = _entry_problems(summary, json_key, needs_masks)
    if is_train and summary.num_annotations and not summary.images_with_annotations:
        problems.append(f"{json_file}: no image has an annotation; a train set needs annotated images.")
    elif is_train and not summary.num_annotations:
        problems.append(f"{json_file}: has no annotations; a train set needs annotated images.")
    if not os.path.isdir(image_root):
        problems.append(
            f"{root_key}={image_root}: no such folder; pass the folder that the 'file_name' entries of "
            f"{json_file} are relative to."
        )
        return problems
    missing = _missing_images(summary, image_root)
    if missing:
        problems.append(
            f"{json_file}: {len(missing)} of {summary.num_images} images are missing under {root_key}={image_root} "
            f"(first: {', '.join(missing[:_FIRST])}); fix {root_key} or the images' 'file_name', or remove the "
            "missing images from the json."
        )
    return problems


def _category_problems(val_json: str, train_json: str) -> list[str]:
    try:
        val, train = summarize_json(val_json).categories, summarize_json(train_json).categories
    except (OSError, ValueError):
        return []  # reported for the file itself
    if val == train:
        return []
    only_val, only_train = sorted(set(val) - set(train)), sorted(set(train) - set(val))
    return [
        f"{val_json}: its categories differ from those of {train_json} (as (id, name); only in val: "
        f"{only_val[:_FIRST]}{' ...' if len(only_val) > _FIRST else ''}, only in train: {only_train[:_FIRST]}"
        f"{' ...' if len(only_train) > _FIRST else ''}); export both splits with the same category list."
    ]


def find_json_dataset_problems(cfg: DictConfig, *, skip_unset: bool = False) -> list[str]:
    """One message per problem of the json data sets `cfg` registers (none when it registers none).

    Args:
        cfg: the whole config (unresolved is fine).
        skip_unset: ignore data sets whose paths are not set yet (a sweep sets them per job).
    """
    needs_masks = bool(OmegaConf.select(cfg, "dataloader.train.mapper.use_instance_mask", default=False))
    problems: list[str] = []
    checked: set[tuple[str, str]] = set()
    for path, node in _register_nodes(cfg):
        json_file, json_key = read_node_value(node, "json_file", path)
        image_root, root_key = read_node_value(node, "image_root", path)
        train_json, _ = read_node_value(node, "train_json_file", path)
        unset = [key for key, value in ((json_key, json_file), (root_key, image_root)) if value is None]
        if unset:
            if not skip_unset:
                problems += [f"{key} is not set; pass {key}=PATH on the command line." for key in unset]
            continue
        if (json_file, image_root) not in checked:
            checked.add((json_file, image_root))
            # a val set names the train json that bins its categories
            is_train = "train_json_file" not in node
            problems += _file_problems(json_file, json_key, image_root, root_key, needs_masks, is_train)
        if train_json:
            problems += _category_problems(json_file, train_json)
    return list(dict.fromkeys(problems))


def get_json_dataset_keys(cfg: DictConfig) -> set[str]:
    """The keys a user sets to point the config at its json data sets (``data.train.json``, ...)."""
    keys = set()
    for path, node in _register_nodes(cfg):
        for name in ("json_file", "image_root", "train_json_file"):
            keys.add(read_node_value(node, name, path)[1])
    return keys


def find_swept_json_dataset_problems(
    cfg: DictConfig, swept: Iterable[tuple[str, list[str]]], *, skip_unset: bool
) -> list[str]:
    """`find_json_dataset_problems` for every combination of the values a sweep gives the data set keys
    (``-m data.train.json=a.json,b.json``), so that every job's files are checked before the sweep starts.

    Args:
        cfg: the config with the command line's plain overrides applied.
        swept: (key, values) of the command line's listable sweeps; keys of other nodes are ignored.
        skip_unset: ignore data sets whose paths are not set (a search sweeper sets them per trial).
    """
    keys = get_json_dataset_keys(cfg)
    swept = [(key, values) for key, values in swept if key in keys]
    problems: list[str] = []
    for values in itertools.product(*(values for _, values in swept)):
        overrides = [f"{key}={value}" for (key, _), value in zip(swept, values)]
        variant = LazyConfig.apply_overrides(cfg.copy(), overrides) if overrides else cfg
        problems += find_json_dataset_problems(variant, skip_unset=skip_unset)
    return list(dict.fromkeys(problems))
