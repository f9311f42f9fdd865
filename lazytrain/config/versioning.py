"""Config versions and the rename table that upgrades configs saved by older lazytrain versions.

Saved YAML configs start with a ``# lazytrain-config-version: N`` header (a comment, so the version never
becomes a config key). Loading an older file moves renamed keys to their new path and logs a warning
naming both. To rename a key: bump `CONFIG_VERSION` and add a row to `RENAMES`.
"""

from __future__ import annotations

import logging
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config import tree

__all__ = ["CONFIG_VERSION", "RENAMES", "VERSION_HEADER", "read_version", "upgrade_config"]

logger = logging.getLogger(__name__)

CONFIG_VERSION = 1
VERSION_HEADER = "# lazytrain-config-version: {version}\n"
# (version that introduced the new name, old key path, new key path)
RENAMES: list[tuple[int, str, str]] = [
    (1, "dataloader.train.sampler.threshold", "dataloader.train.sampler.repeat_thresh"),
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
    return cfg
