"""The weights a run starts from must be readable before any process starts: the checkpoint a resumed run
continues from (named in ``last_checkpoint``), or else a local ``train.init_checkpoint`` (a URL is fetched
by the job, `lazytrain.program.job`)."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from lazytrain.program.job_plan import get_resume_checkpoint, resumes_from_checkpoint
from lazytrain.utils.file_io import get_non_checkpoint_reason

__all__ = ["find_checkpoint_problems"]


def find_checkpoint_problems(cfg: DictConfig) -> list[str]:
    """The problem with the file the run resumes from, or with a local ``train.init_checkpoint`` (none, or
    one message naming the key, the file and the fix)."""
    if resumes_from_checkpoint(cfg):
        return _resume_problems(get_resume_checkpoint(cfg))
    path = str((cfg.get("train") or {}).get("init_checkpoint") or "")
    if not path or "://" in path:
        return []
    if not os.path.exists(path):
        return [
            f"train.init_checkpoint={path}: no such file. Give the path of a checkpoint (a lazytrain .pth, "
            "torchvision detection, ImageNet ResNet or detectron2 weights), or train.init_checkpoint=null to start "
            "from random weights."
        ]
    reason = get_non_checkpoint_reason(path) if os.path.isfile(path) else None
    if reason:
        return [
            f"train.init_checkpoint={path}: not a checkpoint: {reason}. Give a lazytrain .pth, torchvision "
            "detection, ImageNet ResNet or detectron2 weights, or train.init_checkpoint=null."
        ]
    return []


def _resume_problems(last: str) -> list[str]:
    reason = get_non_checkpoint_reason(last) if os.path.isfile(last) else None
    if not reason:
        return []
    return [
        f"train.resume=true: {last} (named in last_checkpoint) is not a checkpoint: {reason}. Delete it and "
        "write the name of an earlier checkpoint into last_checkpoint, or start afresh."
    ]
