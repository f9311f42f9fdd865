"""The batch settings must fit the processes before any starts: ``train.images_per_forward`` must divide each
process's share of ``dataloader.train.total_batch_size``, ``train.auto_scale_lr`` must be usable
(`lazytrain.program.batch_size`), and a `MixtureTrainingSampler` in ``dataloader.train.sampler`` must get
settings it and the train loader take (checked from the values: no data set is loaded)."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config import locate, tree
from lazytrain.data.mixture_sampler import MixtureTrainingSampler, find_mixture_problems
from lazytrain.errors import ConfigError
from lazytrain.launch.environment import get_env_rank_info
from lazytrain.program.batch_size import get_accumulation_steps, get_lr_scale
from lazytrain.program.job_plan import get_processes_per_machine

__all__ = ["find_batch_problems"]


def find_batch_problems(cfg: DictConfig) -> list[str]:
    """One message per problem of the batch settings (call once the ``launch.*`` values are sound)."""
    problems = []
    try:
        get_lr_scale(cfg)
    except ConfigError as e:
        problems.append(str(e))
    world_size = _get_world_size(cfg)
    try:
        get_accumulation_steps(cfg, world_size)
    except ConfigError as e:
        problems.append(str(e))
    return problems + _mixture_problems(cfg, world_size)


def _mixture_problems(cfg: DictConfig, world_size: int) -> list[str]:
    """What a `MixtureTrainingSampler` in ``dataloader.train.sampler`` and its loader would refuse only when the
    loader is built: after the run folder is written and every source data set loaded."""
    loader = OmegaConf.select(cfg, "dataloader.train", default=None)
    sampler = loader.get("sampler") if isinstance(loader, DictConfig) else None
    if not isinstance(sampler, DictConfig) or not _is_mixture(tree.raw_target(sampler)):
        return []
    names = sampler.get("names", sampler.get("sizes"))
    if (
        not isinstance(names, (str, ListConfig))
        or "ratios" not in sampler
        or "total_batch_size" not in sampler
    ):
        return []  # a missing argument is validation's
    values = {
        "ratios": sampler.ratios,
        "total_batch_size": sampler.total_batch_size,
        "aspect_ratio_grouping": loader.get("aspect_ratio_grouping", True),  # the loader's default
    }
    problems = find_mixture_problems(
        [names] if isinstance(names, str) else [str(name) for name in names],
        values["ratios"],
        values["total_batch_size"],
        world_size,
        loader_total_batch_size=loader.get("total_batch_size"),
        aspect_ratio_grouping=values["aspect_ratio_grouping"],
    )
    return [
        f"dataloader.train{'' if argument == 'aspect_ratio_grouping' else '.sampler'}.{argument}="
        f"{values[argument]}: {problem}"
        for argument, problem in problems.items()
    ]


def _is_mixture(target: object) -> bool:
    """Whether `target` (a ``_target_`` string) is `MixtureTrainingSampler` or one of its constructors."""
    if not isinstance(target, str):
        return False
    try:
        located = locate(target)
    except ImportError:
        return False  # validation reports it
    owner = located if isinstance(located, type) else getattr(located, "__self__", None)
    return isinstance(owner, type) and issubclass(owner, MixtureTrainingSampler)


def _get_world_size(cfg: DictConfig) -> int:
    """The job's process count: the launcher's (torchrun, SLURM) or what `launch` will start."""
    env_info = get_env_rank_info()
    if env_info is not None:
        return env_info["world_size"]
    return get_processes_per_machine(cfg) * int(cfg.launch.num_machines)
