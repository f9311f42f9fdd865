"""The batch settings must fit the processes before any starts: ``train.images_per_forward`` must divide each
process's share of ``dataloader.train.total_batch_size``, and ``train.auto_scale_lr`` must be usable
(`lazytrain.program.batch_size`)."""

from __future__ import annotations

from omegaconf import DictConfig

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
    try:
        get_accumulation_steps(cfg, _get_world_size(cfg))
    except ConfigError as e:
        problems.append(str(e))
    return problems


def _get_world_size(cfg: DictConfig) -> int:
    """The job's process count: the launcher's (torchrun, SLURM) or what `launch` will start."""
    env_info = get_env_rank_info()
    if env_info is not None:
        return env_info["world_size"]
    return get_processes_per_machine(cfg) * int(cfg.launch.num_machines)
