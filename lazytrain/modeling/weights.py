"""Initial weights (``train.init_checkpoint``): lazytrain checkpoints, torchvision detection and ImageNet files.

`load_init_weights` recognises three kinds of files and loads them non-strictly, skipping tensors whose
shape differs from the model's (a new box predictor for another class count), and returns a readable
`WeightsReport`:

- a lazytrain checkpoint (``{"model": state_dict, ...}``; the other entries are ignored here);
- a torchvision detection state dict (``backbone.body.*``, ``rpn.*``, ``roi_heads.*``): `RCNN` keeps
  torchvision's module names, so keys map one to one;
- an ImageNet classification ResNet state dict (``conv1.*``, ``layer1.*``, ``fc.*``): loaded into the
  model's ResNet (found by its keys, ``backbone.body.`` for `RCNN`); the classifier ``fc`` is ignored;
- a detectron2 Mask/Faster R-CNN R-FPN checkpoint: a model zoo pickle (``model_final_*.pkl``, read by an
  unpickler that builds numpy arrays only) or a ``.pth`` its training wrote (``backbone.bottom_up.*`` keys),
  converted by `lazytrain.modeling.detectron2_weights` (the report says what was converted).

Paths may be local files or http(s) URLs. A URL is downloaded once per machine into torch hub's cache
(``torch.hub.get_dir()/checkpoints/``), verified by the sha256 prefix in its name and reused after
(`lazytrain.modeling.download`); `prefetch_init_weights` does it in the launching process, before the ranks
start, so that a machine without internet fails with one line saying where to put the file.

With another number of classes than the file (fine-tuning a COCO Mask R-CNN on LVIS or on a user's data), the
class-dependent layers (``roi_heads.box_predictor.cls_score``/``bbox_pred``,
``roi_heads.mask_predictor.mask_fcn_logits``) differ in shape: they keep the model's fresh initialisation, and
a warning names them as re-initialised. For evaluation (``train.eval_only``, ``for_evaluation=True``) a head
the file does not fill is an error naming ``model.num_classes`` and the file's class count.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from lazytrain.modeling.detectron2_weights import (
    convert_detectron2_state_dict,
    is_detectron2_state_dict,
    read_detectron2_pickle,
)
from lazytrain.modeling.download import download_to_cache, is_url
from lazytrain.utils.file_io import load_torch_file

__all__ = [
    "WeightsReport",
    "get_local_path",
    "load_init_weights",
    "load_state_dict_report",
    "prefetch_init_weights",
    "read_state_dict",
]

logger = logging.getLogger(__name__)

_IMAGENET_RESNET_KEYS = ("conv1.weight", "layer1.0.conv1.weight")


@dataclass
class WeightsReport:
    """What `load_init_weights` did. ``str(report)`` is a short readable summary.

    Attributes:
        path: the file or URL read.
        source: the detected kind of file.
        loaded: model keys that received a tensor.
        missing: model keys the file did not provide (they keep their initial values).
        unexpected: file keys the model does not have (ignored).
        shape_mismatched: ``(key, shape in file, shape in model)`` for tensors skipped; their modules, listed by
            `reinitialised`, keep the model's fresh initialisation.
        ignored: file keys dropped on purpose (e.g. the ImageNet classifier ``fc``).
    """

    path: str
    source: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def reinitialised(self) -> list[str]:
        """Modules whose tensors were not loaded because their shape differs from the file's (in the file's
        order): with another class count, the box and mask predictors' last layers. They keep
        the model's fresh initialisation."""
        return list(dict.fromkeys(key.rpartition(".")[0] for key, _, _ in self.shape_mismatched))

    def __str__(self) -> str:
        total = len(self.loaded) + len(self.missing) + len(self.shape_mismatched)
        lines = [
            f"init weights from {self.path} ({self.source}): {len(self.loaded)} of {total} model tensors loaded"
        ]
        if self.shape_mismatched:
            lines.append(
                f"  re-initialised (shape differs from the file's, e.g. another number of classes): "
                f"{', '.join(self.reinitialised)}"
            )
            lines += [
                f"    {key}: {tuple(a)} in the file, {tuple(b)} in the model"
                for key, a, b in self.shape_mismatched
            ]
        for title, keys in (
            ("missing in file (kept at init)", self.missing),
            ("unexpected in file (unused)", self.unexpected),
            ("dropped on purpose", self.ignored),
        ):
            if keys:
                lines.append(f"  {title}: {_summarise_keys(keys)}")
        return "\n".join(lines)


def _summarise_keys(keys: list[str]) -> str:
    """``roi_heads.box_predictor (4), rpn.head (6)``: keys grouped by their first two components."""
    groups: dict[str, int] = defaultdict(int)
    for key in keys:
        groups[".".join(key.split(".")[:2])] += 1
    return ", ".join(f"{name} ({count})" for name, count in groups.items())


def prefetch_init_weights(path: str) -> str:
    """Make ``train.init_checkpoint`` a local file now: download a URL into this machine's cache (once).

    Call it in the launching process before the ranks start: they then find the file in the cache instead of
    each trying to download it, and a machine without internet stops before any expensive work with one line
    naming the URL, the cache path to put the file at, and ``train.init_checkpoint=PATH`` /
    ``train.init_checkpoint=""``. Concurrent calls (one per machine of a multi-machine job, or ranks started
    by torchrun) download once; the others wait.

    Args:
        path: a local path (returned as it is) or an ``http(s)://`` URL.

    Returns:
        The local path to read.

    Raises:
        ConfigError: the URL could not be downloaded, or is not http(s).
        CheckpointError: the file's sha256 does not match the prefix in its name.
    """
    return download_to_cache(path) if is_url(path) else path


def get_local_path(path: str) -> str:
    """A local file for `path`, downloading URLs (`prefetch_init_weights`).

    Raises:
        FileNotFoundError: the local file does not exist.
        ConfigError, CheckpointError: as `prefetch_init_weights`.
    """
    local = prefetch_init_weights(path)
    if not os.path.isfile(local):
        raise FileNotFoundError(
            f"load_init_weights: init checkpoint not found: {path}. Check train.init_checkpoint."
        )
    return local


def _is_plain_pickle(local_path: str) -> bool:
    """A pickle that is not a torch file: protocol 2+ and not torch's zip (torch's legacy format is a pickle
    too, but starts with a number, which `read_state_dict` tells apart)."""
    with open(local_path, "rb") as file:
        return file.read(1) == b"\x80"


def read_state_dict(path: str, *, allow_unsafe: bool = False) -> tuple[dict, str]:
    """The tensors (or numpy arrays, from a detectron2 pickle) of an initial-weights file and the kind of file.

    A plain pickle is read by `read_detectron2_pickle` (numpy arrays only, anything else refused before it
    runs); every other file by torch's weights-only loader (`load_torch_file`).
    """
    local = get_local_path(path)
    if _is_plain_pickle(local):
        data = read_detectron2_pickle(path, local)
        if isinstance(data, Mapping):
            model = data.get("model", data)
            if not isinstance(model, Mapping):
                raise ValueError(
                    f"load_init_weights: {path}'s 'model' is a {type(model).__name__}, not a dict."
                )
            return {str(k): v for k, v in model.items()}, "detectron2 pickle"
    return _read_state_dict(path, allow_unsafe)


def _read_state_dict(path: str, allow_unsafe: bool) -> tuple[dict[str, torch.Tensor], str]:
    data = load_torch_file(path, get_local_path(path), allow_unsafe=allow_unsafe, reader="load_init_weights")
    if not isinstance(data, Mapping):
        raise ValueError(f"load_init_weights: {path} holds a {type(data).__name__}, not a state dict.")
    source = "state dict"
    if isinstance(data.get("model"), Mapping):
        # A run trained with train.ema keeps its trained weights in "training_model": "model" is the EMA.
        ema = " (its EMA weights)" if "training_model" in data else ""
        data, source = data["model"], f"lazytrain checkpoint{ema}"
    elif isinstance(data.get("state_dict"), Mapping):
        data = data["state_dict"]
    state = {str(k): v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state, source


def _find_resnet_prefix(model: nn.Module) -> str | None:
    """The key prefix of the model's ResNet trunk (``backbone.body.`` for `RCNN`), or None."""
    own = model.state_dict()
    prefixes = [
        key[: -len(_IMAGENET_RESNET_KEYS[0])] for key in own if key.endswith(_IMAGENET_RESNET_KEYS[0])
    ]
    for prefix in sorted(prefixes, key=len):
        if prefix + _IMAGENET_RESNET_KEYS[1] in own and (not prefix or prefix.endswith(".")):
            return prefix
    return None


def _convert(
    model: nn.Module, state: dict[str, torch.Tensor], source: str, path: str
) -> tuple[dict, str, list[str]]:
    """Rename file keys to model keys; returns (state, source, keys dropped on purpose)."""
    if is_detectron2_state_dict(state):
        state, notes = convert_detectron2_state_dict(state, path=path)
        kind = "detectron2 pickle" if source == "detectron2 pickle" else "detectron2 checkpoint"
        return state, f"{kind}, converted: " + "; ".join(notes), []
    if source == "detectron2 pickle":
        raise ValueError(
            "load_init_weights: the pickle holds no detectron2 model (no backbone.bottom_up.* or "
            "proposal_generator.* keys); give a detectron2 Mask/Faster R-CNN checkpoint or a torch file."
        )
    if source == "state dict" and all(key in state for key in _IMAGENET_RESNET_KEYS):
        prefix = _find_resnet_prefix(model)
        if prefix is None:
            raise ValueError(
                "load_init_weights: the file is an ImageNet ResNet state dict but the model has no ResNet "
                "trunk (no '<prefix>conv1.weight' and '<prefix>layer1.0.conv1.weight' keys)."
            )
        ignored = [key for key in state if key.startswith("fc.")]
        converted = {prefix + key: value for key, value in state.items() if not key.startswith("fc.")}
        return converted, f"ImageNet ResNet state dict, loaded into {prefix or 'the model'}", ignored
    if source == "state dict" and any(key.startswith("roi_heads.") for key in state):
        source = "torchvision detection state dict"
    return state, source, []


def load_state_dict_report(
    model: nn.Module, state: Mapping[str, torch.Tensor], *, path: str = "<memory>", source: str = "state dict"
) -> WeightsReport:
    """Load `state` into `model` non-strictly, skipping shape mismatches; return what matched.

    Args:
        model: the module to fill (unwrap DDP first).
        state: tensors keyed like ``model.state_dict()``.
        path: shown in the report.
        source: shown in the report.
    """
    own = model.state_dict()
    report = WeightsReport(path=path, source=source)
    accepted = {}
    for key, value in state.items():
        if key in own and own[key].shape != value.shape:
            report.shape_mismatched.append((key, tuple(value.shape), tuple(own[key].shape)))
        else:
            accepted[key] = value
    result = model.load_state_dict(accepted, strict=False)
    skipped = {key for key, _, _ in report.shape_mismatched}
    # BatchNorm's step counter is bookkeeping, not a weight; FrozenBatchNorm2d drops it on load.
    report.missing = [
        k for k in result.missing_keys if k not in skipped and not k.endswith("num_batches_tracked")
    ]
    report.unexpected = [k for k in result.unexpected_keys if not k.endswith("num_batches_tracked")]
    not_loaded = skipped | set(result.missing_keys)
    report.loaded = [key for key in own if key not in not_loaded and key in accepted]
    return report


def load_init_weights(
    model: nn.Module, path: str, *, allow_unsafe: bool = False, for_evaluation: bool = False
) -> WeightsReport:
    """Load initial weights from a lazytrain checkpoint, torchvision detection, ImageNet ResNet or detectron2
    file.

    Loading is non-strict: missing and unexpected keys and shape mismatches are reported (and logged),
    never fatal, so a COCO checkpoint can start an LVIS model with a fresh predictor.

    Args:
        model: the model (not DDP-wrapped).
        path: local path or URL (``https://...``; downloaded once per machine, see `prefetch_init_weights`).
        allow_unsafe: allow files that need arbitrary unpickling (only for files you trust).
        for_evaluation: the weights are evaluated as they are (``train.eval_only``): a head the file does not
            fill (another class count, or absent) is an error instead of a warning, as it would be evaluated
            at its random initialisation.

    Returns:
        A `WeightsReport`; ``str(report)`` is the logged summary.

    Raises:
        FileNotFoundError: `path` does not exist.
        ConfigError: the URL could not be downloaded. CheckpointError: a download's sha256 is wrong.
        ValueError: the file is not a state dict, or is an ImageNet ResNet file and the model has no ResNet;
            with `for_evaluation`, the file does not fill the model's heads.
    """
    state, source = read_state_dict(path, allow_unsafe=allow_unsafe)
    state, source, ignored = _convert(model, state, source, path)
    report = load_state_dict_report(model, state, path=path, source=source)
    report.ignored = ignored
    unfilled = _unfilled_heads(report)
    if for_evaluation and unfilled:
        raise ValueError(_evaluation_error(model, state, path, unfilled))
    if not report.loaded:
        logger.warning("%s\nNo tensor matched: is this file meant for this model?", report)
    elif unfilled:
        logger.warning("%s\nThese heads start from random weights: %s.", report, ", ".join(unfilled))
    else:
        logger.info("%s", report)
    return report


# The modules after the backbone: evaluated at random initialisation when the file does not fill them.
_HEAD_PREFIXES = ("rpn.", "roi_heads.")


def _unfilled_heads(report: WeightsReport) -> list[str]:
    """The head modules with a tensor missing in the file or of another shape (re-initialised)."""
    keys = [key for key, _, _ in report.shape_mismatched] + report.missing
    return list(dict.fromkeys(key.rpartition(".")[0] for key in keys if key.startswith(_HEAD_PREFIXES)))


def _evaluation_error(
    model: nn.Module, state: Mapping[str, torch.Tensor], path: str, heads: list[str]
) -> str:
    """Why ``train.eval_only`` cannot evaluate `path`'s weights: the class counts when they differ."""
    key = "roi_heads.box_predictor.cls_score.weight"
    theirs, own = state.get(key), model.state_dict().get(key)
    random = f"{', '.join(heads)} would be evaluated at their random initialisation"
    if theirs is not None and own is not None and theirs.shape[0] != own.shape[0]:
        return (
            f"load_init_weights: train.eval_only=true with model.num_classes={own.shape[0] - 1} but {path} has "
            f"{theirs.shape[0] - 1} classes: {random}. Set model.num_classes={theirs.shape[0] - 1}."
        )
    return (
        f"load_init_weights: train.eval_only=true but {path} lacks weights of this model's heads: {random}. "
        "Evaluate a checkpoint of this model (the report of `load_init_weights` lists the keys)."
    )
