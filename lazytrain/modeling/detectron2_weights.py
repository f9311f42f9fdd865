"""detectron2 checkpoints of Mask R-CNN / Faster R-CNN with a ResNet-FPN: recognised, read safely, renamed.

detectron2's model zoo files (``model_final_*.pkl``) are pickles of ``{"model": {name: numpy array}, ...}``
(with ``__author__`` and ``matching_heuristics``); its training writes ``.pth`` files (``torch.save`` of
``{"model": state_dict, ...}``). `read_detectron2_pickle` reads a ``.pkl`` (protocols 0-5, Python 2's
Detectron-era files as latin-1) with an unpickler that builds numeric numpy arrays and plain containers only:
each allowed name is a wrapper that checks its arguments (dtype numeric or bool, shape, data as long as the
shape says, all arrays together no larger than the file) before numpy builds anything, and anything else is
refused in one line. ``.pth`` files are read by torch's weights-only loader (`lazytrain.modeling.weights`).

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
  added to the box regressor (detectron2 has none);
- ``roi_heads.mask_head.mask_fcn{1-4}`` -> ``roi_heads.mask_head.{0-3}.0``, ``deconv`` ->
  ``roi_heads.mask_predictor.conv5_mask``, ``predictor`` -> ``mask_fcn_logits`` with a zero background map.

The class count K is the class scores' rows - 1 (a single-class model's mask predictor has one row, as a
class-agnostic one has); class-agnostic box regression or masks, a weight without its bias and a file without a
backbone stem, RPN or box predictor are refused by name.

The same weights give detectron2's detections only with detectron2's model options
(``recipes/models/mask_rcnn_fpn_detectron2.py``; scripts/detectron2_parity.py checks it). Parts lazytrain's
recipes do not build (the LSJ baselines' normalised FPN, two-conv RPN head and 4conv1fc box head with norms,
cascade heads, other backbones) are refused with their names.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
from collections import OrderedDict
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

logger = logging.getLogger(__name__)

# detectron2's MODEL.PIXEL_MEAN (BGR: 103.530, 116.280, 123.675) in RGB order; its MODEL.PIXEL_STD is 1.
DETECTRON2_PIXEL_MEAN_RGB = (123.675, 116.28, 103.53)

# Buffers older detectron2 versions saved beside the weights: the input normalisation (BGR, [3, 1, 1]) and the
# anchor generator's cell anchors. They are not weights; lazytrain's model takes them from its keys.
_BUFFERS = re.compile(r"^(pixel_mean|pixel_std|proposal_generator\.anchor_generator\.cell_anchors\.\d+)$")

# Keys of the parts lazytrain cannot build from a detectron2 checkpoint: (pattern, what it is).
_UNSUPPORTED = (
    (r"^backbone\.fpn_(lateral|output)\d\.norm\.", "a normalised FPN (the LSJ baselines' SyncBN FPN)"),
    (r"^proposal_generator\.rpn_head\.conv\.conv\d", "an RPN head with several convs (LSJ baselines)"),
    (r"^roi_heads\.box_head\.conv\d", "a box head with convs (4conv1fc, LSJ baselines)"),
    (r"^roi_heads\.mask_head\.mask_fcn\d\.norm\.", "a mask head with norms (LSJ baselines)"),
    (r"^roi_heads\.box_predictor\.\d", "cascade box heads"),
    (r"^roi_heads\.keypoint_head\.", "a keypoint head"),
)


# What a zoo pickle may construct, each through a wrapper that checks its arguments before numpy sees them:
# numpy arrays of numeric or bool dtypes (protocols 0-5, Python 2's str data), their scalars, ordered dicts, and
# the bytes protocol 2 writes through _codecs.encode. numpy's own functions are never handed a pickle's state:
# an object or structured dtype there can crash the interpreter (an object array whose list is shorter than its
# shape is read out of bounds).
_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")
_NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex
# Bytes an array may hold beyond the file's size: a pickle's arrays are their data, stored once each.
_SIZE_SLACK = 4096

# What every Mask/Faster R-CNN checkpoint holds: (lazytrain's key, what it is under detectron2's name).
_REQUIRED = (
    ("backbone.body.conv1.weight", "backbone stem (backbone.bottom_up.stem.conv1.weight)"),
    ("rpn.head.cls_logits.weight", "RPN (proposal_generator.rpn_head.objectness_logits.weight)"),
    ("roi_heads.box_predictor.cls_score.weight", "box predictor (roi_heads.box_predictor.cls_score.weight)"),
)


class _RefusedPickle(Exception):
    """A pickle that builds anything but numeric numpy arrays and plain containers (its message says what)."""


def _numeric_dtype(value: Any) -> np.dtype:
    if isinstance(value, _PendingDtype):
        value = value.resolve()
    if not isinstance(value, np.dtype):
        raise _RefusedPickle(f"an array's dtype is a {type(value).__name__}, not a numpy dtype")
    return value


def _check_shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise _RefusedPickle(f"an array's shape is {shape!r}, not a tuple of sizes")
    return shape


def _as_bytes(data: Any) -> bytes:
    """An array's data: bytes, or Python 2's str (read as latin1, one character per byte)."""
    if isinstance(data, str):
        return data.encode("latin1")
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    raise _RefusedPickle(f"an array's data is a {type(data).__name__}, not bytes in the file")


class _PendingDtype:
    """``numpy.dtype(typestr, align, copy)`` before its state: built only once the state says a plain numeric
    type (no fields, subarray or metadata)."""

    def __init__(self, typestr: Any, *_flags: Any) -> None:
        if not isinstance(typestr, str):
            raise _RefusedPickle(f"a dtype named {typestr!r}")
        try:
            self._dtype = np.dtype(typestr)
        except TypeError:
            raise _RefusedPickle(f"a dtype named {typestr!r}") from None
        if self._dtype.kind not in _NUMERIC_KINDS or self._dtype.fields is not None or self._dtype.subdtype:
            raise _RefusedPickle(f"an array of dtype {typestr!r}; only numeric and bool arrays are read")
        self._byteorder = "="

    def __setstate__(self, state: Any) -> None:
        plain = (None, None, None, -1, -1, 0)
        if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[2:] == plain):
            raise _RefusedPickle(f"a dtype with the state {state!r}; only plain numeric dtypes are read")
        if state[1] not in ("<", ">", "=", "|"):
            raise _RefusedPickle(f"a dtype with the byte order {state[1]!r}")
        self._byteorder = state[1]

    def resolve(self) -> np.dtype:
        return self._dtype if self._byteorder in "=|" else self._dtype.newbyteorder(self._byteorder)


class _Budget:
    """The bytes of array data built so far, refused beyond the file's size (a tiny pickle can name a huge
    array, or reuse one buffer for many)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise _RefusedPickle(f"its arrays claim {self.used} bytes or more, beyond the file's size")


def _array(data: Any, dtype: Any, shape: Any, fortran: bool, budget: _Budget) -> np.ndarray:
    dtype, shape = _numeric_dtype(dtype), _check_shape(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    budget.take(nbytes)
    data = _as_bytes(data)
    if len(data) != nbytes:
        raise _RefusedPickle(f"an array of shape {shape} and dtype {dtype} with {len(data)} bytes of data")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C").copy()


class _PendingArray:
    """``numpy.core.multiarray._reconstruct(ndarray, ...)`` before its state: an array built from the state's
    shape, dtype and bytes once they are checked (`_resolve` puts the array in its place after loading)."""

    def __init__(self, budget: _Budget) -> None:
        self._budget = budget
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5) or self.array is not None:
            raise _RefusedPickle("an array with a malformed state")
        shape, dtype, fortran, data = state[-4:]
        self.array = _array(data, dtype, shape, bool(fortran), self._budget)


# Stands for ``numpy.ndarray`` in a pickle: only `_reconstruct`'s first argument, never called or built.
_NDARRAY = object()


def _codecs_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """Protocol 2's bytes: ``_codecs.encode(str, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _RefusedPickle(f"_codecs.encode of a {type(text).__name__} with {encoding!r}")
    return text.encode("latin1")


def _resolve(value: Any) -> Any:
    """The loaded object with the pending arrays and dtypes replaced by numpy's (containers rebuilt)."""
    if isinstance(value, _PendingArray):
        if value.array is None:
            raise _RefusedPickle("an array without its data")
        return value.array
    if isinstance(value, _PendingDtype):
        return value.resolve()
    if isinstance(value, OrderedDict):
        return OrderedDict((_resolve(k), _resolve(v)) for k, v in value.items())
    if isinstance(value, dict):
        return {_resolve(k): _resolve(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v) for v in value)
    return value


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, size: int) -> None:
        super().__init__(file, encoding="latin1")  # detectron2's zoo holds Python 2 pickles (Detectron1's)
        self._budget = _Budget(size + _SIZE_SLACK)

    def find_class(self, module: str, name: str) -> Any:
        budget = self._budget
        if module in _NUMPY_MODULES and name == "_reconstruct":

            def reconstruct(subtype: Any, *_unused: Any) -> _PendingArray:
                if subtype is not _NDARRAY:
                    raise _RefusedPickle(f"_reconstruct of a {subtype!r}, not numpy.ndarray")
                return _PendingArray(budget)

            return reconstruct
        if module in _NUMPY_MODULES and name == "scalar":
            return lambda dtype, data: _array(data, dtype, (), False, budget)[()]
        if module in ("numpy.core.numeric", "numpy._core.numeric") and name == "_frombuffer":
            return lambda data, dtype, shape, order: _array(data, dtype, shape, order == "F", budget)
        if (module, name) == ("numpy", "ndarray"):
            return _NDARRAY
        if (module, name) == ("numpy", "dtype"):
            return _PendingDtype
        if (module, name) == ("_codecs", "encode"):
            return _codecs_encode
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise _RefusedPickle(f"it holds {module}.{name}, not only numpy arrays")


def read_detectron2_pickle(path: str, local_path: str | None = None) -> Any:
    """The object in a detectron2 zoo pickle, built from numpy arrays and plain containers only.

    Args:
        path: the name the user gave (shown in messages).
        local_path: the local file to read (default `path`).

    Raises:
        CheckpointError: the pickle refers to anything else (a payload that would run code is refused before
            it runs), or is damaged.
    """
    local_path = local_path or path
    with open(local_path, "rb") as file:
        try:
            return _resolve(_NumpyOnlyUnpickler(file, os.path.getsize(local_path)).load())
        except (_RefusedPickle, pickle.UnpicklingError) as error:
            raise CheckpointError(
                f"load_init_weights: refused to read {path} as a detectron2 pickle: {error}."
            ) from None
        except (EOFError, ValueError, TypeError, AttributeError, MemoryError, RecursionError) as error:
            detail = str(error) or f"{type(error).__name__} (it claims more data than fits in memory)"
            raise CheckpointError(f"load_init_weights: {path} is not a readable pickle: {detail}") from None


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
        CheckpointError (a ValueError): the checkpoint holds parts lazytrain cannot build (named), names no
            rule knows, or has class-agnostic predictors; the message names `path`. Buffers older detectron2
            versions saved (``pixel_mean``, ``pixel_std``, the RPN's ``cell_anchors``) are dropped with a note.
    """
    unsupported = sorted({what for key in state for pattern, what in _UNSUPPORTED if re.match(pattern, key)})
    if unsupported:
        raise CheckpointError(
            f"convert_detectron2_state_dict: {path} holds parts lazytrain does not build: "
            f"{'; '.join(unsupported)}. Supported: Mask/Faster R-CNN with a ResNet-FPN backbone (FrozenBN, BN or "
            "SyncBN), a one-conv RPN head and the 2fc box head (the model zoo's R50/R101-FPN models)."
        )
    converted: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    unknown = []
    buffers = {key: value for key, value in state.items() if _BUFFERS.match(key)}
    for key, value in state.items():
        if key.endswith("num_batches_tracked") or key in buffers:
            continue
        new_key = _rename(key)
        if new_key is None:
            unknown.append(key)
        else:
            converted[new_key], origin[new_key] = _to_tensor(value), key
    if unknown:
        raise CheckpointError(
            f"convert_detectron2_state_dict: {path} has {len(unknown)} keys no rule maps, e.g. {unknown[:3]}; "
            "only Mask/Faster R-CNN R-FPN checkpoints convert."
        )
    absent = [what for key, what in _REQUIRED if key not in converted]
    if absent:
        raise CheckpointError(
            f"convert_detectron2_state_dict: {path} is not a whole Mask/Faster R-CNN: it has no {', '.join(absent)}."
        )
    notes = [f"{len(converted)} detectron2 tensors renamed to lazytrain's (torchvision's) names"]
    notes += _convert_values(converted, origin)
    if buffers:
        notes.append(f"{len(buffers)} buffers that are not weights dropped ({', '.join(sorted(buffers))})")
        notes += _pixel_statistics_notes(buffers, path)
    return converted, notes


def _pixel_statistics_notes(buffers: Mapping[str, Any], path: str) -> list[str]:
    """A warning (logged, and returned as a note) when a file's ``pixel_mean``/``pixel_std`` differ from
    detectron2's defaults, which recipes/models/mask_rcnn_fpn_detectron2.py sets: the model was trained on
    other input statistics, which its keys must then give."""
    mean = buffers.get("pixel_mean")
    std = buffers.get("pixel_std")
    mean_rgb = None if mean is None else _to_tensor(mean).double().flatten().flip(0)
    std_rgb = None if std is None else _to_tensor(std).double().flatten().flip(0)
    same_mean = mean_rgb is None or torch.allclose(mean_rgb, torch.tensor(DETECTRON2_PIXEL_MEAN_RGB).double())
    same_std = std_rgb is None or torch.allclose(std_rgb, torch.ones_like(std_rgb))
    if same_mean and same_std:
        return []
    keys = []
    if not same_mean:
        keys.append(f"model.pixel_mean=[{','.join(f'{v:g}' for v in mean_rgb.tolist())}]")
    if not same_std:
        keys.append(f"model.pixel_std=[{','.join(f'{v:g}' for v in std_rgb.tolist())}]")
    note = (
        f"{path}'s pixel_mean/pixel_std differ from detectron2's defaults (mean {list(DETECTRON2_PIXEL_MEAN_RGB)} "
        f"RGB, std 1) that the detectron2 recipe sets: give {' '.join(keys)}"
    )
    logger.warning("convert_detectron2_state_dict: %s", note)
    return [note]


def _pair(state: dict[str, Tensor], layer: str, origin: dict[str, str]) -> tuple[Tensor, Tensor] | None:
    """The weight and bias of `layer`, None when it has neither; one without the other is refused, named by
    its detectron2 key (`origin` maps lazytrain's names to detectron2's)."""
    weight, bias = state.get(layer + ".weight"), state.get(layer + ".bias")
    if weight is None and bias is None:
        return None
    if weight is None or bias is None:
        present, absent = (".bias", ".weight") if weight is None else (".weight", ".bias")
        name = origin[layer + present].removesuffix(present) + absent
        raise CheckpointError(
            f"convert_detectron2_state_dict: the checkpoint has no {name} (it has its {present[1:]})."
        )
    return weight, bias


def _convert_values(state: dict[str, Tensor], origin: dict[str, str]) -> list[str]:
    """The value changes, in place: conv1's BGR -> RGB, background classes first, background rows added.

    The class count K is the class scores' rows - 1; the box regressor and mask predictor must have K classes
    (detectron2's ``MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG`` and ``MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK``
    give one for all classes, which lazytrain's predictors do not have: refused).
    """
    notes = []
    if "backbone.body.conv1.weight" in state:
        state["backbone.body.conv1.weight"] = state["backbone.body.conv1.weight"].flip(1)
        notes.append("backbone.body.conv1: input channels flipped from BGR to RGB")
    scores = _pair(state, "roi_heads.box_predictor.cls_score", origin)
    if scores is None:
        return notes
    classes = scores[0].shape[0] - 1
    for name, tensor in zip(("weight", "bias"), scores, strict=True):
        state[f"roi_heads.box_predictor.cls_score.{name}"] = _background_first(tensor)
    notes.append(f"roi_heads.box_predictor.cls_score: {classes} classes, background moved from the last to 0")
    for layer, per_class, config_key in (
        ("roi_heads.box_predictor.bbox_pred", 4, "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG"),
        ("roi_heads.mask_predictor.mask_fcn_logits", 1, "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK"),
    ):
        pair = _pair(state, layer, origin)
        if pair is None:
            continue
        rows = pair[0].shape[0]
        if rows != per_class * classes:
            name = origin[layer + ".weight"].removesuffix(".weight")
            agnostic = f", class-agnostic ({config_key}=True)" if rows == per_class else ""
            raise CheckpointError(
                f"convert_detectron2_state_dict: {name} has {rows} rows for {classes} classes{agnostic}; "
                f"lazytrain's predictors have {per_class} per class: convert a model trained without {config_key}."
            )
        for name, tensor in zip(("weight", "bias"), pair, strict=True):
            state[f"{layer}.{name}"] = _with_background_rows(tensor, per_class)
        notes.append(f"{layer}: {per_class} zero background row(s) added before class 1")
    return notes
