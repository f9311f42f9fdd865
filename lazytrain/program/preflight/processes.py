"""How many processes a job starts on this machine, and the ``launch.*`` values that decide it: checked before
anything is spawned, so that a bad count or a missing GPU ends in one line naming the key."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from lazytrain.errors import ConfigError
from lazytrain.launch.launch import get_env_rank_info, parse_timeout

__all__ = ["find_launch_problems", "get_processes_per_machine", "uses_gpu"]


def find_launch_problems(launch_cfg: DictConfig) -> list[str]:
    """Process counts, the machine rank and the timeout must be usable (one message per bad key)."""
    problems = []
    for key in ("num_processes", "num_machines"):
        value = launch_cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"launch.{key}={value}: must be an integer >= 1.")
    try:
        if launch_cfg.get("timeout") is not None:
            parse_timeout(launch_cfg.timeout)
    except ValueError as e:
        problems.append(str(e))
    rank, machines = launch_cfg.get("machine_rank"), launch_cfg.get("num_machines")
    if any(p.startswith("launch.num_machines") for p in problems):
        return problems  # the rank's range is unknown
    if not isinstance(rank, int) or not 0 <= rank < machines:
        problems.append(
            f"launch.machine_rank={rank}: must be in [0, launch.num_machines - 1] = [0, {machines - 1}]."
        )
    return problems


def uses_gpu(cfg: DictConfig) -> bool:
    """Whether ``train.device`` is a CUDA device."""
    return str((cfg.get("train") or {}).get("device", "cpu")).startswith("cuda")


def get_processes_per_machine(cfg: DictConfig) -> int:
    """One process per GPU (``launch.num_gpus``, ``auto`` = all visible) or ``launch.num_processes`` on CPU;
    one under torchrun/SLURM with several tasks per node (the launcher started one process per GPU).

    Raises:
        ConfigError: GPUs asked for on CPU, none visible, or more than visible.
    """
    num_gpus = cfg.launch.num_gpus
    if not uses_gpu(cfg):
        if num_gpus not in (0, None, "auto"):
            raise ConfigError(
                f"launch.num_gpus={num_gpus} but train.device is not cuda; set train.device=cuda, or use "
                "launch.num_processes=N for N CPU processes."
            )
        return int(cfg.launch.num_processes)
    env_info = get_env_rank_info()
    if env_info is not None and env_info["local_size"] > 1:
        return 1  # launch.get_gpu_index picks this process's GPU
    return _count_gpus(num_gpus)


def _count_gpus(requested: Any) -> int:
    visible = torch.cuda.device_count()
    if visible == 0:
        raise ConfigError(
            "train.device=cuda but no GPU is visible (torch.cuda.device_count() is 0); use train.device=cpu "
            "(and launch.num_processes=N for N CPU processes)."
        )
    if requested == "auto" or requested is None:
        return visible
    requested = int(requested)
    if requested > visible:
        raise ConfigError(
            f"launch.num_gpus={requested} but only {visible} GPU(s) are visible; lower launch.num_gpus or use "
            "train.device=cpu with launch.num_processes."
        )
    return max(requested, 1)
