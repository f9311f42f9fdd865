"""Config versions, the rename table that upgrades configs saved by older lazytrain versions, and the table of
arguments whose meaning changed.

Saved YAML configs start with a ``# lazytrain-config-version: N`` header (a comment, so the version never
becomes a config key). Loading an older file moves renamed keys to their new path and logs a warning
naming both. To rename a key: bump `CONFIG_VERSION` and add a row to `RENAMES`.

An argument that keeps its name but changes what it does cannot be moved: loading an older file that sets it
logs a one-line warning naming its key path, its value and the change, and a resumed run whose first
iterations ran under the old meaning says so (`lazytrain.program.default`). To change a meaning: bump
`CONFIG_VERSION` and add a row to `MEANING_CHANGES`.
"""

from __future__ import annotations

import logging
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config import tree
from lazytrain.config.lazy import locate

__all__ = [
    "CONFIG_VERSION",
    "MEANING_CHANGES",
    "RENAMES",
    "VERSION_HEADER",
    "find_meaning_changes",
    "read_version",
    "upgrade_config",
]

logger = logging.getLogger(__name__)

CONFIG_VERSION = 2
VERSION_HEADER = "# lazytrain-config-version: {version}\n"
# (version that introduced the new name, old key path, new key path)
RENAMES: list[tuple[int, str, str]] = [
    (1, "dataloader.train.sampler.threshold", "dataloader.train.sampler.repeat_thresh"),
]
# (version that changed the meaning, the component's _target_, its argument, what it does now and did before)
MEANING_CHANGES: list[tuple[int, str, str, str]] = [
    (
        2,
        "lazytrain.data.copy_paste.CopyPaste",
        "min_area",
        "it now leaves out pasted objects with fewer pixels on the image, where it dropped the image's own "
        "instances left with fewer visible pixels (those now stay unless fully covered; 1, the default, pastes "
        "every object that shows)",
    ),
]
_ABSENT = object()
_HEADER_PATTERN = re.compile(r"^#\s*lazytrain-config-version:\s*(\d+)\s*$", re.MULTILINE)


def read_version(text: str) -> int:
    """The version in a saved config's header; files without a header (hand-written) are current."""
    match = _HEADER_PATTERN.search(text[:200])
    return int(match.group(1)) if match else CONFIG_VERSION


def _pop_key(cfg: DictConfig, dotted: str) -> tuple[bool, object]:
    *parents, last = dotted.split(".")
    node = cfg
    for part in parents:
        if not isinstance(node, DictConfig) or part not in node:
            return False, None
        node = tree.child(node, part)
    if not isinstance(node, DictConfig) or last not in node:
        return False, None
    value = tree.child(node, last)
    if not isinstance(value, (DictConfig, ListConfig)):
        value = tree.raw_value(value)  # keeps an interpolation as its "${...}" string
    node.pop(last)
    return True, value


def upgrade_config(cfg: DictConfig, version: int, *, source: str = "config") -> DictConfig:
    """Apply every rename newer than `version` to `cfg` in place, oldest first, and return it.

    Args:
        cfg: a config loaded from a saved file.
        version: the version the file was saved with (see `read_version`).
        source: how to name the config in warnings (its path).
    """
    if version > CONFIG_VERSION:
        logger.warning(
            "%s was saved by a newer lazytrain (config version %d; this one reads up to %d): renamed keys "
            "may not be recognised.",
            source,
            version,
            CONFIG_VERSION,
        )
    for introduced_in, old, new in sorted(RENAMES, key=lambda row: row[0]):
        if introduced_in <= version:
            continue
        found, value = _pop_key(cfg, old)
        if not found:
            continue
        if OmegaConf.select(cfg, new, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT:
            logger.warning(
                "%s: key '%s' was renamed to '%s', which is also set; '%s' dropped.", source, old, new, old
            )
            continue
        OmegaConf.update(cfg, new, value, force_add=True)
        logger.warning(
            "%s was saved by config version %d: key '%s' was renamed to '%s' (moved). Save the config again "
            "to silence this warning.",
            source,
            version,
            old,
            new,
        )
    for change in find_meaning_changes(cfg, version):
        logger.warning(
            "%s was saved by config version %d: %s. Check the value, then save the config again to silence this "
            "warning.",
            source,
            version,
            change,
        )
    return cfg


def find_meaning_changes(cfg: DictConfig, version: int) -> list[str]:
    """One line for each argument `cfg` sets whose meaning changed after `version` (`MEANING_CHANGES`), naming
    its key path, its value as written, the version and the change.

    Args:
        cfg: a config saved with config version `version`.
        version: see `read_version`.
    """
    changes = []
    for introduced_in, target, argument, change in sorted(MEANING_CHANGES, key=lambda row: row[0]):
        if introduced_in <= version:
            continue
        for path, node in tree.nodes(cfg, join=tree.dotted_path):
            if _calls(node, target) and argument in node:
                value = tree.raw_value(tree.child(node, argument))
                changes.append(
                    f"'{tree.dotted_path(path, node, argument)}' ({value!r}) changed meaning in config version "
                    f"{introduced_in}: {change}"
                )
    return changes


def _calls(node: object, target: str) -> bool:
    """Whether `node` is a call of `target`, written as its dotted path or as another path to the same object
    (a package's re-export)."""
    written = tree.raw_target(node)
    if not isinstance(written, str) or written.rsplit(".", 1)[-1] != target.rsplit(".", 1)[-1]:
        return False
    if written == target:
        return True
    try:  # imports the component: only for a call of the same name
        return locate(written) is locate(target)
    except ImportError:
        return False
