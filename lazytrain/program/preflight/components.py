"""Values a component of the run would refuse when it is built, checked before the run starts: the EMA's
settings (``train.ema``), a `WandbTracker` hook's ``mode``, a `TimmBackbone`'s ``model_name`` (timm's
registry, with the closest names), RoI heads' thresholds, the repeat-factor sampler's ``repeat_thresh``, and
a ResNet backbone's ``grad_checkpointing`` with ``norm="SyncBN"``.
Each problem is one line naming the key and the fix."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterator

from omegaconf import DictConfig, ListConfig
from torchvision.models.detection.roi_heads import RoIHeads

from lazytrain.config import locate, tree
from lazytrain.data.copy_paste import CopyPaste, find_copy_paste_problems
from lazytrain.engine.ema import find_setting_problems
from lazytrain.engine.trackers.wandb import WANDB_MODES, WandbTracker
from lazytrain.evaluation.long_tail_evaluation import LongTailEvaluator
from lazytrain.evaluation.lvis_evaluation import LVISEvaluator
from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.timm_backbone import TimmBackbone, find_model_name_problem

__all__ = ["find_component_problems"]


def find_component_problems(cfg: DictConfig) -> list[str]:
    """One line per value of the EMA, a W&B tracker, a timm backbone, RoI heads, Copy-Paste or the sampler's
    repeat-factor threshold that its constructor would refuse."""
    problems = find_ema_problems(cfg)
    for path, node, target in _iter_calls(cfg):
        if issubclass(target, WandbTracker):
            problems += _wandb_mode_problems(path, node)
        elif issubclass(target, TimmBackbone):
            problems += _timm_model_problems(path, node)
        elif issubclass(target, RoIHeads):
            problems += _roi_heads_problems(path, node)
        elif issubclass(target, CopyPaste):
            problems += _copy_paste_problems(path, node)
        elif issubclass(target, (LVISEvaluator, LongTailEvaluator)):
            problems += _fixed_ap_problems(path, node)
    return problems + _repeat_thresh_problems(cfg) + _checkpointed_sync_batch_norm_problems(cfg)


def find_ema_problems(cfg: DictConfig) -> list[str]:
    """``train.ema``: ``enabled`` a bool, ``decay`` and ``tau`` values `ModelEMA` takes (also while the EMA is
    off: such a value is never meant, and ``train.ema.enabled=true`` would fail on it)."""
    ema = (cfg.get("train") or {}).get("ema")
    if not isinstance(ema, DictConfig):
        return []
    enabled = ema.get("enabled", False)
    problems = [] if isinstance(enabled, bool) else [f"train.ema.enabled={enabled!r}: must be true or false."]
    settings = {key: ema[key] for key in ("decay", "tau") if key in ema}
    return problems + [
        f"train.ema.{name}={settings[name]!r}: {problem}."
        for name, problem in find_setting_problems(settings).items()
    ]


def _iter_calls(cfg: DictConfig) -> Iterator[tuple[str, DictConfig, type]]:
    """(key path, node, class) of every call node whose target is a class that imports (validation reports
    the others)."""
    for path, node, located in _iter_targets(cfg):
        if isinstance(located, type):
            yield path, node, located


def _iter_targets(cfg: DictConfig) -> Iterator[tuple[str, DictConfig, object]]:
    """(key path, node, target) of every call node whose target imports (a class or a function)."""
    for path, node in tree.nodes(cfg, join=tree.dotted_path):
        target = tree.raw_target(node)
        if not isinstance(target, str) or tree.is_interpolation(tree.child(node, "_target_")):
            continue
        try:
            located = locate(target)
        except ImportError:
            continue
        yield path, node, located


def _literal(node: DictConfig, key: str) -> object:
    """The value written for `key` (None when absent)."""
    return tree.raw_value(tree.child(node, key)) if key in node else None


def _wandb_mode_problems(path: str, node: DictConfig) -> list[str]:
    mode = _literal(node, "mode")
    if mode is None or mode in WANDB_MODES or tree.is_interpolation(tree.child(node, "mode")):
        return []
    close = difflib.get_close_matches(str(mode), WANDB_MODES, n=1, cutoff=0.5)
    hint = f"Did you mean {path}.mode={close[0]}? " if close else ""
    return [
        f"{path}.mode={mode!r}: W&B's mode is one of {', '.join(WANDB_MODES)}, or null (WANDB_MODE if set, else "
        f"online with W&B credentials and offline without). {hint}".rstrip()
    ]


def _timm_model_problems(path: str, node: DictConfig) -> list[str]:
    name = _literal(node, "model_name")
    if not isinstance(name, str) or tree.is_interpolation(tree.child(node, "model_name")):
        return []  # a missing or mistyped name is validation's
    try:
        problem = find_model_name_problem(name)
    except ModuleNotFoundError as e:
        return [f"{path}: {e}"]
    return [f"{path}.model_name={name}: {problem}"] if problem else []


def _roi_heads_problems(path: str, node: DictConfig) -> list[str]:
    """``score_thresh`` and ``nms_thresh`` are scores and IoUs in [0, 1] (a negative score threshold keeps
    every detection; predict refuses it too)."""
    problems = []
    for key in ("score_thresh", "nms_thresh"):
        value = _literal(node, key)
        if value is None or tree.is_interpolation(tree.child(node, key)):
            continue
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= value <= 1:
            problems.append(f"{path}.{key}={value!r}: must be a number in [0, 1].")
    return problems


def _copy_paste_problems(path: str, node: DictConfig) -> list[str]:
    """Each literal `CopyPaste` setting it would refuse (a sweep's every job would fail on it when its train
    loader is built)."""
    written = {
        key: _literal(node, key)
        for key in node
        if key != "_target_" and not tree.is_interpolation(tree.child(node, key))
    }
    return [
        f"{path}.{name}={written[name]!r}: {problem}."
        for name, problem in find_copy_paste_problems(written).items()
    ]


def _fixed_ap_problems(path: str, node: DictConfig) -> list[str]:
    """AP-fixed's K, which the evaluator would refuse only after training."""
    value = _literal(node, "max_dets_per_category")
    if value is None or tree.is_interpolation(tree.child(node, "max_dets_per_category")):
        return []
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return []
    return [
        f"{path}.max_dets_per_category={value!r}: must be an integer >= 1 (the K of AP-fixed and AP-pool; "
        "Dave et al. use 10000 on LVIS)."
    ]


def _is_threshold(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value >= 0


def _repeat_thresh_problems(cfg: DictConfig) -> list[str]:
    """Repeat factor sampling's threshold, where a config sets ``dataloader.train.sampler.repeat_thresh``."""
    sampler = ((cfg.get("dataloader") or {}).get("train") or {}).get("sampler")
    if not isinstance(sampler, DictConfig) or "repeat_thresh" not in sampler:
        return []
    node = tree.child(sampler, "repeat_thresh")
    value = tree.raw_value(node)
    if tree.is_interpolation(node) or _is_threshold(value):
        return []
    if isinstance(value, ListConfig) and all(v is None or _is_threshold(v) for v in value):
        return []  # one per source (MixtureTrainingSampler), None = uniform sampling in that source
    return [
        f"dataloader.train.sampler.repeat_thresh={value!r}: must be a number >= 0 (0 = uniform sampling; LVIS "
        "uses 0.001), or for MixtureTrainingSampler a list with one per source, each null or >= 0."
    ]


def _checkpointed_sync_batch_norm_problems(cfg: DictConfig) -> list[str]:
    """A ResNet backbone with ``norm="SyncBN"`` and ``grad_checkpointing=True`` and a trainable stage, which
    `build_resnet_fpn_backbone` refuses only when the model is built (its recompute would all-reduce the batch
    statistics again inside the backward), after the run folder and its config.yaml are written."""
    problems = []
    for path, node, target in _iter_targets(cfg):
        if target is not build_resnet_fpn_backbone:
            continue
        trainable = _literal(node, "trainable_layers")
        checkpointed = _literal(node, "grad_checkpointing") is True and (trainable is None or trainable != 0)
        if checkpointed and _literal(node, "norm") == "SyncBN":  # trainable_layers=0 checkpoints nothing
            problems.append(
                f"{path}.grad_checkpointing=True with {path}.norm='SyncBN': a checkpointed stage's recompute "
                "would all-reduce the batch statistics a second time, inside the backward pass; set "
                f"{path}.norm=BN (per-process statistics) or FrozenBN, or {path}.grad_checkpointing=false."
            )
    return problems
