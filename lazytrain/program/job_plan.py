"""What a job plans before it starts its processes: how many on this machine, whether they use GPUs, and
whether the run continues from a checkpoint of its own. `lazytrain.program.preflight` checks the same config
(and calls these to see that they succeed); `lazytrain.program.job` acts on them."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from lazytrain.engine.checkpoint import get_last_checkpoint
from lazytrain.errors import ConfigError
from lazytrain.launch.environment import get_env_rank_info

__all__ = ["get_processes_per_machine", "get_resume_checkpoint", "resumes_from_checkpoint", "uses_gpu"]


def resumes_from_checkpoint(cfg: DictConfig) -> bool:
    """Whether the run continues from a checkpoint of its own (``train.resume`` and a ``last_checkpoint``)."""
    train = cfg.get("train") or {}
    return bool(train.get("resume")) and get_resume_checkpoint(cfg) != ""


def get_resume_checkpoint(cfg: DictConfig) -> str:
    """The checkpoint file the run's ``last_checkpoint`` names ("" when there is none)."""
    return get_last_checkpoint(str((cfg.get("train") or {}).get("output_dir") or "")) or ""


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
        return 1  # launch.process_group.get_gpu_index picks this process's GPU
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
