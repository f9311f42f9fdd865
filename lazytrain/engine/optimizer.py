"""Optimizer parameter groups built from a model (the program fills ``optimizer.params.model``), and loading a
saved optimizer state into them (`load_optimizer_state`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import torch

from lazytrain.errors import CheckpointError
from lazytrain.utils import comm

__all__ = [
    "get_default_optimizer_params",
    "get_layer_decay_optimizer_params",
    "get_layer_id",
    "load_optimizer_state",
]

logger = logging.getLogger(__name__)

_NORM_TYPES = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.GroupNorm,
    torch.nn.LayerNorm,
    torch.nn.LocalResponseNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
)


def get_default_optimizer_params(
    model: torch.nn.Module,
    *,
    weight_decay: float | None = None,
    weight_decay_norm: float | None = None,
    weight_decay_bias: float | None = None,
) -> list[dict]:
    """Parameter groups of the trainable parameters, with no (or another) weight decay for norm layers/biases.

    Parameters that share their settings share a group (in `model.modules()` order), so that a multi-tensor
    optimizer step (``foreach``, torch's default on CUDA, or ``fused``) updates each group with a handful of
    kernels instead of several per parameter. (Older checkpoints hold one group per parameter;
    `load_optimizer_state` converts them.)

    Args:
        model: the (unwrapped) model.
        weight_decay: decay for ordinary weights (None: the optimizer's own value).
        weight_decay_norm: decay for parameters of normalization layers (None: as ordinary weights).
        weight_decay_bias: decay for biases (None: as ordinary weights).
    """
    groups = []
    for _, param, decay in _iter_parameters(model, weight_decay, weight_decay_norm, weight_decay_bias):
        group = {"params": [param]}
        if decay is not None:
            group["weight_decay"] = decay
        groups.append(group)
    return _merge_same_settings(groups)


def _iter_parameters(
    model: torch.nn.Module,
    weight_decay: float | None,
    weight_decay_norm: float | None,
    weight_decay_bias: float | None,
) -> Iterator[tuple[str, torch.nn.Parameter, float | None]]:
    """``(name, parameter, its weight decay or None)`` for each trainable parameter once, in module order."""
    seen = set()
    for module_name, module in model.named_modules():
        is_norm = isinstance(module, _NORM_TYPES) or type(module).__name__ == "FrozenBatchNorm2d"
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or param in seen:
                continue
            seen.add(param)
            decay = weight_decay
            if is_norm and weight_decay_norm is not None:
                decay = weight_decay_norm
            elif name == "bias" and weight_decay_bias is not None:
                decay = weight_decay_bias
            yield f"{module_name}.{name}" if module_name else name, param, decay


def _merge_same_settings(groups: list[dict]) -> list[dict]:
    """One group per distinct setting (everything but ``params``), in the order settings first appear."""
    merged: dict[tuple, dict] = {}
    for group in groups:
        settings = tuple(sorted((key, value) for key, value in group.items() if key != "params"))
        merged.setdefault(settings, {**group, "params": []})["params"] += group["params"]
    return list(merged.values())


# Where a backbone's parameters sit in its depth, by their names under `RCNN`'s ``backbone.body.`` (timm's
# features_only names: ``stages_0`` flattened, ``model.`` under its getter wrapper for ViTs).
_BODY = "backbone.body."
_STEM = re.compile(r"(model\.)?(patch_embed|pos_embed|cls_token|reg_token|stem|conv_stem|conv1|bn1)([._]|$)")
_BLOCK = re.compile(r"(model\.)?blocks\.(\d+)\.")
_STAGE = re.compile(r"(model\.)?(stages|layers)[._](\d+)\.")
_RESNET_STAGE = re.compile(r"layer(\d)\.")
_EMBEDDINGS = ("pos_embed", "cls_token", "reg_token")


def get_layer_id(name: str, num_layers: int) -> int:
    """A parameter's depth for layer-wise LR decay: 0 for the stem, 1..`num_layers` for the backbone's blocks or
    stages, ``num_layers + 1`` for everything after (FPN, RPN, RoI heads) and what it cannot place.

    For a model built as ``RCNN(backbone=TimmBackbone(...))`` (names under ``backbone.body.``):

    - stem (0): ``patch_embed``, ``pos_embed``, ``cls_token``, ``reg_token``, ``stem``, ``conv_stem``, ResNet's
      ``conv1``/``bn1``;
    - ViT and Eva (``blocks.<i>``): ``i + 1``, so ``num_layers`` is the block count (12 for ViT-B), as detectron2's
      ViTDet ``get_vit_lr_decay_rate``;
    - stage models (``stages.<s>``: ConvNeXt; ``layers.<s>``: Swin; ResNet's ``layer<s+1>``): ``s + 1``, so
      ``num_layers`` is the stage count (4), one LR per stage.
    """
    depth = _get_body_depth(name)
    return num_layers + 1 if depth is None else depth


def _get_body_depth(name: str) -> int | None:
    """0 for a stem parameter, the block or stage number (from 1) for a deeper one, None for the rest."""
    if not name.startswith(_BODY):
        return None
    rest = name[len(_BODY) :]
    if _STEM.match(rest):
        return 0
    if block := _BLOCK.match(rest):
        return int(block.group(2)) + 1
    if stage := _STAGE.match(rest):
        return int(stage.group(3)) + 1
    if stage := _RESNET_STAGE.match(rest):
        return int(stage.group(1))
    return None


def get_layer_decay_optimizer_params(
    model: torch.nn.Module,
    *,
    base_lr: float,
    layer_decay: float,
    num_layers: int,
    weight_decay: float | None = None,
    weight_decay_norm: float | None = None,
    weight_decay_bias: float | None = None,
    weight_decay_embed: float | None = None,
) -> list[dict]:
    """Parameter groups with layer-wise LR decay (ViTDet's, BEiT's fine-tuning): deeper layers learn faster.

    A parameter at depth ``layer_id`` (`get_layer_id`) gets ``lr = base_lr * layer_decay ** (num_layers + 1 -
    layer_id)``: the FPN and heads ``base_lr``, the last block or stage ``base_lr * layer_decay``, the stem
    ``base_lr * layer_decay ** (num_layers + 1)``. Weight decay is chosen as in `get_default_optimizer_params`
    (and `weight_decay_embed` for ``pos_embed``/``cls_token``/``reg_token``). Parameters that share lr and decay
    share a group, named ``layer<id>`` plus ``_wd<decay>`` when the group sets one (``layer13_wd0.1``,
    ``layer0_wd0``), with its ``lr_scale``. Groups come with the largest lr first, so the logged ``lr`` (the first
    group's) is the base lr. The LR schedule multiplies each group's own lr.

    Args:
        model: the (unwrapped) model.
        base_lr: the optimizer's lr (``base_lr="${..lr}"`` in a recipe).
        layer_decay: factor per layer, in (0, 1] (0.7 in ViTDet-B, 1 turns decay off).
        num_layers: the backbone's blocks (ViT) or stages (ConvNeXt, Swin, ResNet); at least the deepest found.
        weight_decay, weight_decay_norm, weight_decay_bias: as `get_default_optimizer_params`.
        weight_decay_embed: decay for position embeddings and class/register tokens (None: as ordinary weights;
            ViTDet uses 0 for ``pos_embed``).
    """
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(
            f"get_layer_decay_optimizer_params(layer_decay=) must be in (0, 1]; got {layer_decay}"
        )
    if not isinstance(num_layers, int) or num_layers < 0:
        raise ValueError(
            f"get_layer_decay_optimizer_params(num_layers=) must be an int >= 0; got {num_layers!r}"
        )
    groups = []
    for name, param, decay in _iter_parameters(model, weight_decay, weight_decay_norm, weight_decay_bias):
        layer_id = get_layer_id(name, num_layers)
        if layer_id > num_layers and _get_body_depth(name) is not None:
            raise ValueError(
                f"get_layer_decay_optimizer_params(num_layers=) must count every block or stage of the backbone: "
                f"{name} is at depth {layer_id}; got num_layers={num_layers}. Give the block count (ViT) or the "
                "stage count (ConvNeXt, Swin)."
            )
        if weight_decay_embed is not None and name.rpartition(".")[2] in _EMBEDDINGS:
            decay = weight_decay_embed
        scale = layer_decay ** (num_layers + 1 - layer_id)
        group = {"params": [param], "name": f"layer{layer_id}", "lr": base_lr * scale, "lr_scale": scale}
        if decay is not None:
            group["name"] += f"_wd{decay:g}"
            group["weight_decay"] = decay
        groups.append(group)
    return sorted(_merge_same_settings(groups), key=lambda group: -group["lr_scale"])


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, state: dict, model: torch.nn.Module, *, source: str = "the checkpoint"
) -> None:
    """Load `state` (``optimizer.state_dict()`` of a saved run) into `optimizer`, whose parameters are
    `model`'s.

    A state with the optimizer's layout (as many groups, of the same sizes) loads as torch loads it. A state of
    one group per parameter, as `get_default_optimizer_params` made before parameters with the same settings
    shared a group, is converted to the optimizer's groups when that is exact: its groups are the model's
    trainable parameters in module order, each parameter's saved values (momentum, ...) have that parameter's
    shape, and the parameters now in one group had the same settings. Anything else is an error.

    Args:
        optimizer: the run's optimizer.
        state: the saved state.
        model: the model (DDP-wrapped or not) whose parameters the optimizer updates.
        source: the file, for messages.

    Raises:
        CheckpointError: the layouts differ and the state cannot be converted exactly; the message says how to
            go on (the weights kept, the optimizer started afresh).
    """
    saved, current = state["param_groups"], optimizer.param_groups
    if [len(g["params"]) for g in saved] == [len(g["params"]) for g in current]:
        optimizer.load_state_dict(state)
        return
    converted, reason = _convert_per_parameter_groups(state, optimizer, comm.unwrap_model(model))
    if converted is None:
        raise CheckpointError(
            f"Checkpointer: the optimizer state in {source} has {_describe_groups(saved)} and this run's optimizer "
            f"{_describe_groups(current)}: it was saved with other parameter groups (another optimizer config, "
            f"or a lazytrain before parameters with the same settings shared a group) and cannot be converted "
            f"exactly ({reason}). To go on from its weights with a fresh optimizer, schedule and iteration count: "
            f"train.resume=false train.init_checkpoint={source}."
        )
    optimizer.load_state_dict(converted)
    logger.info(
        "Checkpointer: the optimizer state in %s had one group per parameter; converted exactly into this "
        "optimizer's %d groups.",
        source,
        len(current),
    )


def _describe_groups(groups: list[dict]) -> str:
    sizes = [len(g["params"]) for g in groups]
    shown = ", ".join(map(str, sizes[:6])) + (", ..." if len(sizes) > 6 else "")
    return f"{len(groups)} parameter group(s) of {shown} parameters"


def _convert_per_parameter_groups(
    state: dict, optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> tuple[dict | None, str]:
    """`state` (one group per trainable parameter of `model`, in module order) in `optimizer`'s groups, or
    (None, why not)."""
    saved = state["param_groups"]
    order = [param for _, param, _ in _iter_parameters(model, None, None, None)]
    current = [param for group in optimizer.param_groups for param in group["params"]]
    if any(len(g["params"]) != 1 for g in saved):
        return None, "its groups are not one per parameter"
    if len(saved) != len(order) or {id(p) for p in order} != {id(p) for p in current}:
        return None, f"{len(saved)} saved parameters for the model's {len(order)} trainable ones"
    saved_index = {id(param): index for index, param in enumerate(order)}
    groups, values, next_id = [], {}, 0
    for group in optimizer.param_groups:
        members = [saved[saved_index[id(p)]] for p in group["params"]]
        settings = [{k: v for k, v in g.items() if k != "params"} for g in members]
        if not all(_same_settings(settings[0], other) for other in settings[1:]):
            return None, "parameters now in one group had different settings"
        ids = list(range(next_id, next_id + len(members)))
        next_id += len(members)
        groups.append({**settings[0], "params": ids})
        for new_id, param, member in zip(ids, group["params"], members):
            entry = state["state"].get(member["params"][0])
            if entry is None:
                continue
            if any(
                isinstance(v, torch.Tensor) and v.dim() and v.shape != param.shape for v in entry.values()
            ):
                return None, "a saved parameter's values have another shape than the parameter in its place"
            values[new_id] = entry
    return {"state": values, "param_groups": groups}, ""


def _same_settings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        tensors = isinstance(value, torch.Tensor), isinstance(other, torch.Tensor)
        if any(tensors) and not (all(tensors) and torch.equal(value, other)):
            return False
        if not any(tensors) and value != other:
            return False
    return True
