"""detectron2 checkpoints of Mask R-CNN / Faster R-CNN with a ResNet-FPN: recognised, read safely, renamed.

detectron2's model zoo files (``model_final_*.pkl``) are pickles of ``{"model": {name: numpy array}, ...}``
(with ``__author__`` and ``matching_heuristics``); its training writes ``.pth`` files (``torch.save`` of
``{"model": state_dict, ...}``). `read_detectron2_pickle` reads a ``.pkl`` with an unpickler that builds numpy
arrays and plain containers only and refuses anything else in one line, before it runs; ``.pth`` files are
read by torch's weights-only loader (`lazytrain.modeling.weights`).

`convert_detectron2_state_dict` maps the names one to one onto lazytrain's `RCNN` (torchvision's names):

- ``backbone.bottom_up.stem.conv1`` -> ``backbone.body.conv1`` (+ ``.norm`` -> ``bn1``), with its input
  channels flipped: detectron2 reads BGR images, lazytrain's loaders give RGB;
- ``backbone.bottom_up.res{2-5}.{i}.conv{j}[.norm]`` -> ``backbone.body.layer{1-4}.{i}.conv{j}`` / ``bn{j}``,
  ``shortcut[.norm]`` -> ``downsample.0`` / ``downsample.1``;
- ``backbone.fpn_lateral{2-5}`` / ``fpn_output{2-5}`` -> ``backbone.fpn.inner_blocks.{0-3}.0`` /
  ``layer_blocks.{0-3}.0``;
- ``proposal_generator.rpn_head.conv`` / ``objectness_logits`` / ``anchor_deltas`` -> ``rpn.head.conv.0.0`` /
  ``cls_logits`` / ``bbox_pred``;
- ``roi_heads.box_head.fc1`` / ``fc2`` -> ``roi_heads.box_head.fc6`` / ``fc7``; ``roi_heads.box_predictor.*``
  with the background class moved from detectron2's last index to lazytrain's 0, and zero background rows
  added to a class-specific box regressor (detectron2 has none);
- ``roi_heads.mask_head.mask_fcn{1-4}`` -> ``roi_heads.mask_head.{0-3}.0``, ``deconv`` ->
  ``roi_heads.mask_predictor.conv5_mask``, ``predictor`` -> ``mask_fcn_logits`` with a zero background map.

The same weights give detectron2's detections only with detectron2's model options
(``recipes/models/mask_rcnn_fpn_detectron2.py``; scripts/detectron2_parity.py checks it). Parts lazytrain's
recipes do not build (the LSJ baselines' normalised FPN, two-conv RPN head and 4conv1fc box head with norms,
cascade heads, other backbones) are refused with their names.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lazytrain.errors import CheckpointError

__all__ = [
    "DETECTRON2_PIXEL_MEAN_RGB",
    "convert_detectron2_state_dict",
    "is_detectron2_state_dict",
    "read_detectron2_pickle",
]

# detectron2's MODEL.PIXEL_MEAN (BGR: 103.530, 116.280, 123.675) in RGB order; its MODEL.PIXEL_STD is 1.
DETECTRON2_PIXEL_MEAN_RGB = (123.675, 116.28, 103.53)

# What a zoo pickle may construct: numpy arrays, their dtypes and scalars, and ordered dicts.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "OrderedDict"),
}

# Keys of the parts lazytrain cannot build from a detectron2 checkpoint: (pattern, what it is).
_UNSUPPORTED = (
    (r"^backbone\.fpn_(lateral|output)\d\.norm\.", "a normalised FPN (the LSJ baselines' SyncBN FPN)"),
    (r"^proposal_generator\.rpn_head\.conv\.conv\d", "an RPN head with several convs (LSJ baselines)"),
    (r"^roi_heads\.box_head\.conv\d", "a box head with convs (4conv1fc, LSJ baselines)"),
    (r"^roi_heads\.mask_head\.mask_fcn\d\.norm\.", "a mask head with norms (LSJ baselines)"),
    (r"^roi_heads\.box_predictor\.\d", "cascade box heads"),
    (r"^roi_heads\.keypoint_head\.", "a keypoint head"),
)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it holds {module}.{name}, not only numpy arrays")


def read_detectron2_pickle(path: str, local_path: str | None = None) -> Any:
    """The object in a detectron2 zoo pickle, built from numpy arrays and plain containers only.

    Args:
        path: the name the user gave (shown in messages).
        local_path: the local file to read (default `path`).

    Raises:
        CheckpointError: the pickle refers to anything else (a payload that would run code is refused before
            it runs), or is damaged.
    """
    with open(local_path or path, "rb") as file:
        try:
            return _NumpyOnlyUnpickler(file).load()
        except pickle.UnpicklingError as error:
            raise CheckpointError(
                f"load_init_weights: refused to read {path} as a detectron2 pickle: {error}."
            ) from None
        except (EOFError, ValueError, TypeError, AttributeError) as error:
            raise CheckpointError(f"load_init_weights: {path} is not a readable pickle: {error}") from None


def is_detectron2_state_dict(state: Mapping[str, Any]) -> bool:
    """Whether `state` has detectron2's names (``backbone.bottom_up.*``, ``proposal_generator.*``)."""
    return any(key.startswith(("backbone.bottom_up.", "proposal_generator.")) for key in state)


def _block_key(stage: str, block: str, layer: str) -> str:
    return f"backbone.body.layer{int(stage) - 1}.{block}.{layer}."


# (detectron2's key prefix, lazytrain's prefix from its groups), in the order they are tried.
_RENAMES = (
    (r"backbone\.bottom_up\.stem\.conv1\.norm\.", lambda: "backbone.body.bn1."),
    (r"backbone\.bottom_up\.stem\.conv1\.", lambda: "backbone.body.conv1."),
    (r"backbone\.bottom_up\.res(\d)\.(\d+)\.conv(\d)\.norm\.", lambda s, b, i: _block_key(s, b, f"bn{i}")),
    (r"backbone\.bottom_up\.res(\d)\.(\d+)\.conv(\d)\.", lambda s, b, i: _block_key(s, b, f"conv{i}")),
    (r"backbone\.bottom_up\.res(\d)\.(\d+)\.shortcut\.norm\.", lambda s, b: _block_key(s, b, "downsample.1")),
    (r"backbone\.bottom_up\.res(\d)\.(\d+)\.shortcut\.", lambda s, b: _block_key(s, b, "downsample.0")),
    (r"backbone\.fpn_lateral(\d)\.", lambda level: f"backbone.fpn.inner_blocks.{int(level) - 2}.0."),
    (r"backbone\.fpn_output(\d)\.", lambda level: f"backbone.fpn.layer_blocks.{int(level) - 2}.0."),
    (r"proposal_generator\.rpn_head\.conv\.", lambda: "rpn.head.conv.0.0."),
    (r"proposal_generator\.rpn_head\.objectness_logits\.", lambda: "rpn.head.cls_logits."),
    (r"proposal_generator\.rpn_head\.anchor_deltas\.", lambda: "rpn.head.bbox_pred."),
    (r"roi_heads\.box_head\.fc1\.", lambda: "roi_heads.box_head.fc6."),
    (r"roi_heads\.box_head\.fc2\.", lambda: "roi_heads.box_head.fc7."),
    (r"roi_heads\.box_predictor\.(cls_score|bbox_pred)\.", lambda name: f"roi_heads.box_predictor.{name}."),
    (r"roi_heads\.mask_head\.mask_fcn(\d)\.", lambda i: f"roi_heads.mask_head.{int(i) - 1}.0."),
    (r"roi_heads\.mask_head\.deconv\.", lambda: "roi_heads.mask_predictor.conv5_mask."),
    (r"roi_heads\.mask_head\.predictor\.", lambda: "roi_heads.mask_predictor.mask_fcn_logits."),
)


def _rename(key: str) -> str | None:
    """lazytrain's name for detectron2's `key`, or None for a key no rule covers."""
    for pattern, prefix in _RENAMES:
        match = re.match(pattern, key)
        if match is not None and key.count(".") == match.group(0).count("."):  # weight, bias, running_*
            return prefix(*match.groups()) + key[match.end() :]
    return None


def _to_tensor(value: Any) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value


def _background_first(tensor: Tensor) -> Tensor:
    """Class scores with detectron2's background (last row) moved to row 0."""
    return torch.cat((tensor[-1:], tensor[:-1]))


def _with_background_rows(tensor: Tensor, rows: int) -> Tensor:
    """`rows` zero rows (the background's) put before `tensor`'s first."""
    return torch.cat((tensor.new_zeros((rows, *tensor.shape[1:])), tensor))


def convert_detectron2_state_dict(
    state: Mapping[str, Any], *, path: str = "<memory>"
) -> tuple[dict[str, Tensor], list[str]]:
    """detectron2's Mask/Faster R-CNN R-FPN weights under lazytrain's names (see the module docstring).

    Args:
        state: detectron2's ``model`` dict (numpy arrays or tensors).
        path: shown in messages.

    Returns:
        ``(state, notes)``: the renamed tensors, and one line per conversion applied (for the log).

    Raises:
        ValueError: the checkpoint holds parts lazytrain cannot build (named), or names no rule knows.
    """
    unsupported = sorted({what for key in state for pattern, what in _UNSUPPORTED if re.match(pattern, key)})
    if unsupported:
        raise ValueError(
            f"convert_detectron2_state_dict: {path} holds parts lazytrain does not build: "
            f"{'; '.join(unsupported)}. Supported: Mask/Faster R-CNN with a ResNet-FPN backbone (FrozenBN, BN or "
            "SyncBN), a one-conv RPN head and the 2fc box head (the model zoo's R50/R101-FPN models)."
        )
    converted: dict[str, Tensor] = {}
    unknown = []
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        new_key = _rename(key)
        if new_key is None:
            unknown.append(key)
        else:
            converted[new_key] = _to_tensor(value)
    if unknown:
        raise ValueError(
            f"convert_detectron2_state_dict: {path} has {len(unknown)} keys no rule maps, e.g. {unknown[:3]}; "
            "only Mask/Faster R-CNN R-FPN checkpoints convert."
        )
    notes = [f"{len(converted)} detectron2 tensors renamed to lazytrain's (torchvision's) names"]
    notes += _convert_values(converted)
    return converted, notes


def _convert_values(state: dict[str, Tensor]) -> list[str]:
    """The value changes, in place: conv1's BGR -> RGB, background classes first, background rows added."""
    notes = []
    if "backbone.body.conv1.weight" in state:
        state["backbone.body.conv1.weight"] = state["backbone.body.conv1.weight"].flip(1)
        notes.append("backbone.body.conv1: input channels flipped from BGR to RGB")
    for key in ("roi_heads.box_predictor.cls_score.weight", "roi_heads.box_predictor.cls_score.bias"):
        if key in state:
            state[key] = _background_first(state[key])
    if "roi_heads.box_predictor.cls_score.weight" in state:
        notes.append("roi_heads.box_predictor.cls_score: background moved from the last class to class 0")
        classes = state["roi_heads.box_predictor.cls_score.weight"].shape[0] - 1
        if state.get("roi_heads.box_predictor.bbox_pred.weight", torch.empty(0)).shape[:1] == (4 * classes,):
            for key in ("roi_heads.box_predictor.bbox_pred.weight", "roi_heads.box_predictor.bbox_pred.bias"):
                state[key] = _with_background_rows(state[key], 4)
            notes.append("roi_heads.box_predictor.bbox_pred: 4 zero background rows added before class 1")
    for key in (
        "roi_heads.mask_predictor.mask_fcn_logits.weight",
        "roi_heads.mask_predictor.mask_fcn_logits.bias",
    ):
        if key in state and state[key].shape[0] > 1:
            state[key] = _with_background_rows(state[key], 1)
    if "roi_heads.mask_predictor.mask_fcn_logits.weight" in state:
        notes.append("roi_heads.mask_predictor.mask_fcn_logits: a zero background map added as class 0")
    return notes
