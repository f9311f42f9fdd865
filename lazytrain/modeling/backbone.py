"""ResNet + FPN backbones for torchvision detectors, with every knob a plain argument a config can override.

torchvision's ``resnet_fpn_backbone`` fixes the FPN width at 256 channels and takes no norm choice by name;
`build_resnet_fpn_backbone` exposes depth, normalisation, trainable stages, returned stages and FPN width,
and returns torchvision's own `BackboneWithFPN`, so state-dict keys match torchvision's detection models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn
from torchvision.models import resnet
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.ops.misc import FrozenBatchNorm2d

from lazytrain.modeling.checkpointing import (
    check_grad_checkpointing,
    checkpoint_blocks,
    has_trainable_parameters,
)
from lazytrain.modeling.frozen_batch_norm import fold_frozen_batch_norm

__all__ = ["NORMS", "build_resnet_fpn_backbone", "get_feature_map_names", "freeze_batch_norm"]

_RESNETS: dict[int, Callable[..., resnet.ResNet]] = {
    18: resnet.resnet18,
    34: resnet.resnet34,
    50: resnet.resnet50,
    101: resnet.resnet101,
    152: resnet.resnet152,
}
# Stem first: `trainable_layers=k` trains the last k entries counted from the deep end.
_STAGES = ("conv1", "layer1", "layer2", "layer3", "layer4")
GROUP_NORM_GROUPS = 32


def _group_norm(num_channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUP_NORM_GROUPS, num_channels)


NORMS: dict[str, Callable[[int], nn.Module]] = {
    "FrozenBN": FrozenBatchNorm2d,  # fixed statistics and affine: the usual choice with pretrained weights
    "BN": nn.BatchNorm2d,  # trained statistics: for random init or large per-GPU batches
    "SyncBN": nn.SyncBatchNorm,  # statistics shared across processes (needs a process group while training)
    "GN": _group_norm,  # 32 groups; batch-size independent
}


def freeze_batch_norm(module: nn.Module) -> nn.Module:
    """Replace every ``BatchNorm2d``/``SyncBatchNorm`` inside `module` by a `FrozenBatchNorm2d` copy.

    Returns:
        `module` itself (changed in place), or the frozen copy when `module` is a batch norm layer.
    """
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        frozen = FrozenBatchNorm2d(module.num_features, eps=module.eps)
        if module.affine:
            frozen.weight.copy_(module.weight.detach())
            frozen.bias.copy_(module.bias.detach())
        if module.track_running_stats:
            frozen.running_mean.copy_(module.running_mean)
            frozen.running_var.copy_(module.running_var)
        return frozen
    for name, child in module.named_children():
        new_child = freeze_batch_norm(child)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


def _freeze_stages(body: resnet.ResNet, trainable_layers: int) -> None:
    """Stop gradients in all but the last `trainable_layers` stages; their batch norms stop updating too."""
    frozen = _STAGES[: len(_STAGES) - trainable_layers]
    for stage in frozen:
        modules = [body.conv1, body.bn1] if stage == "conv1" else [getattr(body, stage)]
        for module in modules:
            for parameter in module.parameters():
                parameter.requires_grad_(False)
    # A frozen stage with live batch statistics would still drift in train mode (detectron2 freezes them too).
    if "conv1" in frozen:
        body.bn1 = freeze_batch_norm(body.bn1)
    for stage in frozen[1:]:
        freeze_batch_norm(getattr(body, stage))


def build_resnet_fpn_backbone(
    depth: int = 50,
    *,
    norm: str = "FrozenBN",
    trainable_layers: int = 3,
    out_channels: int = 256,
    returned_layers: Sequence[int] = (1, 2, 3, 4),
    fpn_norm: str | None = None,
    fold_frozen_bn: bool = True,
    grad_checkpointing: bool = False,
    stride_in_1x1: bool = False,
) -> BackboneWithFPN:
    """A randomly initialised ResNet with an FPN on top (torchvision's `BackboneWithFPN`).

    The FPN returns one map per returned stage, named ``"0"``, ``"1"``, ... from the shallowest, plus a
    ``"pool"`` map (max-pooled last level): ``len(returned_layers) + 1`` maps in all, so the anchor generator
    needs that many size groups and the RoI poolers read ``"0"`` .. ``str(len(returned_layers) - 1)``.
    Pretrained weights are not downloaded here: load ImageNet or COCO weights with
    `lazytrain.modeling.weights.load_init_weights` (``train.init_checkpoint``).

    Args:
        depth: ResNet depth, one of 18, 34, 50, 101, 152.
        norm: normalisation in the ResNet: ``"FrozenBN"``, ``"BN"``, ``"SyncBN"`` or ``"GN"``.
        trainable_layers: how many stages, counted from ``layer4`` back to the stem, get gradients (0-5).
            Batch norms in the other stages are frozen whatever `norm` is.
        out_channels: FPN width. At small image sizes it dominates the CPU cost (64 is a good CPU size).
        returned_layers: ResNet stages (1-4) that feed the FPN.
        fpn_norm: ``None`` (plain convs, as torchvision) or a name from `NORMS` for the FPN convs.
        fold_frozen_bn: fold each frozen batch norm of the ResNet (``norm="FrozenBN"``, or the frozen stages
            of a trainable norm) into the conv before it (`fold_frozen_batch_norm`): under bf16 autocast the
            conv outputs stay bf16 and two activation-sized kernels per norm disappear. State-dict keys and
            results are unchanged (up to float rounding). False keeps torchvision's modules.
        grad_checkpointing: recompute the activations of the trainable stages' residual blocks in the backward
            pass instead of keeping them, one block at a time (`lazytrain.modeling.checkpointing`), in training
            mode only: the same gradients for less memory and about one more ResNet forward. The stages become
            `CheckpointedSequential` with the same blocks and state-dict keys; the stem and the FPN are not
            checkpointed.
        stride_in_1x1: in the first bottleneck of each stage, downsample in its 1x1 ``conv1`` instead of its
            3x3 ``conv2`` (torchvision's "ResNet v1.5"): the original MSRA ResNet, whose weights detectron2's
            model zoo holds (its ``stride_in_1x1=True``). Same parameters and keys; ResNet-50 and deeper only.
    """
    _check_choices(depth, norm, fpn_norm, trainable_layers)
    check_grad_checkpointing("build_resnet_fpn_backbone", grad_checkpointing)
    returned_layers = _checked_returned_layers(returned_layers)
    body = _RESNETS[depth](weights=None, norm_layer=NORMS[norm])
    if stride_in_1x1:
        _move_stride_to_1x1(body, depth)
    _freeze_stages(body, trainable_layers)
    if fold_frozen_bn:
        fold_frozen_batch_norm(body)
    if grad_checkpointing:
        # After freezing and folding: the blocks move into the new stages as they are, fold sites included.
        stages = [f"layer{k}" for k in (1, 2, 3, 4)]
        checkpoint_blocks(body, [s for s in stages if has_trainable_parameters(getattr(body, s))])
    # After construction `inplanes` is the width of layer4; each earlier stage has half the channels.
    stage_channels = {k: body.inplanes // 2 ** (4 - k) for k in (1, 2, 3, 4)}
    return BackboneWithFPN(
        body,
        return_layers={f"layer{k}": str(index) for index, k in enumerate(returned_layers)},
        in_channels_list=[stage_channels[k] for k in returned_layers],
        out_channels=out_channels,
        extra_blocks=LastLevelMaxPool(),
        norm_layer=NORMS[fpn_norm] if fpn_norm else None,
    )


def _move_stride_to_1x1(body: resnet.ResNet, depth: int) -> None:
    """Each stage's downsampling moved from the 3x3 conv of its first bottleneck to the 1x1 before it."""
    if depth < 50:
        raise ValueError(
            f"build_resnet_fpn_backbone(stride_in_1x1=True) needs bottleneck blocks (depth 50 or more); got "
            f"depth={depth}, whose blocks have no 1x1 conv. Set stride_in_1x1=false."
        )
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        first = getattr(body, stage)[0]
        first.conv1.stride, first.conv2.stride = first.conv2.stride, (1, 1)


def _check_choices(depth: int, norm: str, fpn_norm: str | None, trainable_layers: int) -> None:
    if depth not in _RESNETS:
        raise ValueError(
            f"build_resnet_fpn_backbone(depth=) must be one of {sorted(_RESNETS)}; got {depth!r}"
        )
    for name, value in (("norm", norm), ("fpn_norm", fpn_norm)):
        if value is not None and value not in NORMS:
            raise ValueError(
                f"build_resnet_fpn_backbone({name}=) must be one of {sorted(NORMS)}; got {value!r}"
            )
    if not 0 <= trainable_layers <= len(_STAGES):
        raise ValueError(
            f"build_resnet_fpn_backbone(trainable_layers=) must be in [0, 5]; got {trainable_layers}"
        )


def _checked_returned_layers(returned_layers: Sequence[int]) -> list[int]:
    """`returned_layers` as a list, checked to be increasing stage numbers from 1-4."""
    layers = list(returned_layers)
    if not layers or any(k not in (1, 2, 3, 4) for k in layers) or layers != sorted(set(layers)):
        raise ValueError(
            "build_resnet_fpn_backbone(returned_layers=) must be increasing stage numbers from 1-4, e.g. "
            f"[2, 3, 4]; got {layers!r}"
        )
    return layers


def get_feature_map_names(backbone: nn.Module) -> list[str] | None:
    """Names of the feature maps a `BackboneWithFPN` returns (or a backbone with its own
    ``get_feature_map_names()``, as `TimmBackbone`), or None for other backbones."""
    if callable(getattr(backbone, "get_feature_map_names", None)):
        return backbone.get_feature_map_names()
    if not isinstance(backbone, BackboneWithFPN):
        return None
    names = list(backbone.body.return_layers.values())
    extra = backbone.fpn.extra_blocks
    if isinstance(extra, LastLevelMaxPool):
        names.append("pool")
    elif extra is not None:
        return None  # other extra blocks add maps under names we cannot know without running them
    return names
