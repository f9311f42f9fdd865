"""A Hydra job's config made ready for the ranks: interpolations the ranks cannot resolve are resolved here
(``${hydra:...}``, ``${now:...}``), and a requeued SLURM job resumes. `prepare_job_config` does both."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from omegaconf import DictConfig, ListConfig
from omegaconf.errors import InterpolationResolutionError

from lazytrain.errors import ConfigError

__all__ = ["prepare_job_config", "resolve_values", "resume_if_requeued"]

logger = logging.getLogger(__name__)


def prepare_job_config(cfg: DictConfig) -> None:
    """Resolve `cfg`'s values in place and make a requeued SLURM job resume (see the two functions)."""
    resolve_values(cfg)
    resume_if_requeued(cfg)


def resolve_values(cfg: DictConfig) -> None:
    """Resolve interpolations of values in place (ranks cannot: ``${hydra:...}``, ``${now:...}``); a broken one
    is a config error naming the key and the target."""
    try:
        _resolve_in_place(cfg)
    except InterpolationResolutionError as e:
        reason = str(e).splitlines()[0]
        failing = list(_unresolvable(cfg))
        # Keys interpolating a broken key fail too: name the one whose own text holds the missing target.
        target = reason.split("'")[1] if reason.count("'") >= 2 else None
        direct = [item for item in failing if target and "${" + target in item[1]]
        key, raw = (direct or failing or [("a config value", "")])[0]
        raise ConfigError(
            f"{key}={raw}: cannot resolve the interpolation: {reason}. Point it at an existing key (e.g. "
            "${train.output_dir}) or give a plain value."
        ) from None


def _resolve_in_place(node: DictConfig | ListConfig) -> None:
    """Replace every interpolation under `node` by its value, except those referring to a whole config node
    (``sampler.dataset_dicts: ${..dataset}``): `instantiate` builds such a node once and shares it, and a
    resolved copy would be built twice (the train annotations loaded twice)."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in list(keys):
        child = node._get_node(key)
        if child._is_interpolation():
            if not isinstance(child._dereference_node(), (DictConfig, ListConfig)):
                node[key] = node[key]
        elif isinstance(child, (DictConfig, ListConfig)):
            _resolve_in_place(child)


def _unresolvable(node: DictConfig | ListConfig, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key path, raw value) of every interpolation under `node` that does not resolve."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        child = node._get_node(key)
        path = f"{prefix}{key}"
        if child._is_interpolation():
            try:
                node[key]
            except Exception:
                yield path, str(child._value())
        elif isinstance(child, (DictConfig, ListConfig)):
            yield from _unresolvable(child, path + ".")


def resume_if_requeued(cfg: DictConfig) -> None:
    """A requeued SLURM job (SLURM_RESTART_COUNT >= 1) runs its command again: it must continue from its last
    checkpoint, not start over and overwrite it."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    train = cfg.get("train")
    if restarts not in ("", "0") and train is not None and not train.get("resume", False):
        logger.warning(
            "Requeued SLURM job (SLURM_RESTART_COUNT=%s): resuming from the last checkpoint (train.resume=true).",
            restarts,
        )
        train.resume = True
