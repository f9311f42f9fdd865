"""A Hydra job's config made ready for the ranks: interpolations the ranks cannot resolve are resolved here
(``${hydra:...}``, ``${now:...}``), and a requeued SLURM job or restarted torchrun workers resume.
`prepare_job_config` does both."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from omegaconf import DictConfig
from omegaconf.errors import InterpolationResolutionError

from lazytrain.config import tree
from lazytrain.errors import ConfigError
from lazytrain.launch.environment import get_restart_count

__all__ = ["prepare_job_config", "resolve_values", "resume_if_requeued"]

logger = logging.getLogger(__name__)


def prepare_job_config(cfg: DictConfig) -> None:
    """Resolve `cfg`'s values in place and make a restarted job resume (see the two functions)."""
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


def _resolve_in_place(cfg: DictConfig) -> None:
    """Replace every interpolation under `cfg` by its value, except those referring to a whole config node
    (``sampler.dataset_dicts: ${..dataset}``): `instantiate` builds such a node once and shares it, and a
    resolved copy would be built twice (the train annotations loaded twice)."""
    for entry in tree.walk(cfg):
        if tree.is_interpolation(entry.node) and not tree.points_at_container(entry.node):
            entry.parent[entry.key] = entry.parent[entry.key]


def _unresolvable(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """(key path, raw value) of every interpolation under `cfg` that does not resolve."""
    for entry in tree.walk(cfg, join=tree.dotted_path):
        if tree.is_interpolation(entry.node):
            try:
                entry.parent[entry.key]
            except Exception:
                yield entry.path, str(tree.raw_value(entry.node))


_RESTARTED = {
    "SLURM_RESTART_COUNT": "Requeued SLURM job",
    "TORCHELASTIC_RESTART_COUNT": "Restarted torchrun workers",
}


def resume_if_requeued(cfg: DictConfig) -> None:
    """A requeued SLURM job (SLURM_RESTART_COUNT >= 1) or a worker group restarted by torchrun
    (TORCHELASTIC_RESTART_COUNT >= 1) runs its command again: it must continue from its last checkpoint, not
    start over and overwrite it."""
    train = cfg.get("train")
    restart = get_restart_count()
    if train is None or train.get("resume", False) or restart is None:
        return
    variable, count = restart
    logger.warning(
        "%s (%s=%s): resuming from the last checkpoint (train.resume=true).",
        _RESTARTED[variable],
        variable,
        count,
    )
    train.resume = True
