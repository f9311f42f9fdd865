"""The weights a run starts from must be readable before any process starts: the checkpoint a resumed run
continues from (named in ``last_checkpoint``), or else a local ``train.init_checkpoint`` (a URL is fetched
by the job, `lazytrain.program.job`)."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from lazytrain.engine.checkpoint import Checkpointer, get_non_checkpoint_reason

__all__ = ["find_checkpoint_problems", "resumes_from_checkpoint"]


def resumes_from_checkpoint(cfg: DictConfig) -> bool:
    """Whether the run continues from a checkpoint of its own (``train.resume`` and a ``last_checkpoint``)."""
    train = cfg.get("train") or {}
    return bool(train.get("resume")) and _checkpointer(cfg).has_checkpoint()


def _checkpointer(cfg: DictConfig) -> Checkpointer:
    # Only reads last_checkpoint: no model, nothing to save.
    return Checkpointer(None, str(cfg.train.get("output_dir") or ""))


def find_checkpoint_problems(cfg: DictConfig) -> list[str]:
    """The problem with the file the run resumes from, or with a local ``train.init_checkpoint`` (none, or
    one message naming the key, the file and the fix)."""
    if resumes_from_checkpoint(cfg):
        return _resume_problems(_checkpointer(cfg).get_checkpoint_file())
    path = str((cfg.get("train") or {}).get("init_checkpoint") or "")
    if not path or "://" in path:
        return []
    if not os.path.exists(path):
        return [
            f"train.init_checkpoint={path}: no such file. Give the path of a checkpoint (a lazytrain .pth, "
            "torchvision detection or ImageNet ResNet weights), or train.init_checkpoint=null to start from "
            "random weights."
        ]
    reason = get_non_checkpoint_reason(path) if os.path.isfile(path) else None
    if reason:
        return [
            f"train.init_checkpoint={path}: not a checkpoint: {reason}. Give a lazytrain .pth, torchvision "
            "detection or ImageNet ResNet weights, or train.init_checkpoint=null."
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
