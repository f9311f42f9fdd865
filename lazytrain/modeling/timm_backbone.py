"""Backbones from timm: `TimmBackbone` (any timm model with ``features_only``, an FPN on top) and the ViTDet-style
`SimpleFeaturePyramid` that plain ViTs (``vit_*``, ``eva_*``) get instead of the FPN.

`TimmBackbone` has the interface of torchvision's `BackboneWithFPN`, which the rest of the model reads:
``forward(images) -> OrderedDict`` of maps named ``"0"``, ``"1"``, ... from the finest, plus ``"pool"`` (a
max-pooled last level), and an ``out_channels`` attribute. Each map's stride and channels come from timm's
``feature_info`` of the chosen ``out_indices``, never from a table here. A model whose maps all have one stride
(a plain ViT) gets a `SimpleFeaturePyramid` over its last map, which makes strides 4, 8, 16, 32 of it.

How to use (in a recipe; the anchor generator needs one size group per map, ``len(out_indices) + 1``, and the
RoI poolers read ``"0"`` .. ``"3"``)::

    model.backbone = L(TimmBackbone)(model_name="convnext_tiny", pretrained=True, out_channels=256)
    model.backbone = L(TimmBackbone)(
        model_name="vit_base_patch16_224.mae", pretrained=True, out_indices=[-1],
        model_kwargs=dict(img_size=1024, dynamic_img_size=True, drop_path_rate=0.1),
    )

timm is the ``timm`` extra (``pip install "lazytrain[timm]"``), imported when a `TimmBackbone` is built.
Pretrained weights come through timm's own mechanism (its Hugging Face hub cache, once per machine), or from a
file or URL (``pretrained=PATH``; a URL is downloaded once per machine into torch hub's cache, as
``train.init_checkpoint`` is). Frozen batch norms are timm's (torchvision's ``FrozenBatchNorm2d``), not folded
into the convs as `build_resnet_fpn_backbone` does: timm's families name their layers too differently for
`fold_frozen_batch_norm`'s pairing.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import Tensor, nn
from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork, LastLevelMaxPool

from lazytrain.errors import ConfigError
from lazytrain.modeling.checkpointing import (
    check_grad_checkpointing,
    find_timm_checkpoint_problem,
    prepare_timm_checkpointing,
    set_timm_checkpointing,
)
from lazytrain.modeling.download import download_to_cache, is_url
from lazytrain.utils.optional_imports import import_optional

__all__ = ["SimpleFeaturePyramid", "TimmBackbone", "find_model_name_problem"]

logger = logging.getLogger(__name__)

_TIMM_LOAD_LOGGER = "timm.models._builder"
_MISSING = re.compile(r"Missing keys \((.*)\) discovered")
_UNEXPECTED = re.compile(r"Unexpected keys \((.*)\) found")


def _layer_norm_2d(channels: int) -> nn.Module:
    """LayerNorm over the channels of an NCHW map, at every position (ViTDet's "LN"): timm's ``LayerNorm2d``
    with torch's LayerNorm epsilon, which these pyramids have always used (timm's default is 1e-6)."""
    return _import_timm().layers.LayerNorm2d(channels, eps=1e-5)


def _norm(norm: str | None, channels: int) -> nn.Module:
    return _layer_norm_2d(channels) if norm == "LN" else nn.Identity()


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid: maps at several strides made from one map (a plain ViT's last block).

    Each scale factor makes one map from the input: 4 by two stride-2 transposed convs (a LayerNorm and a GELU
    between them), 2 by one, 1 as it is, 0.5 by a 2x2 max-pool; then a 1x1 and a 3x3 conv, each followed by the
    norm. From a stride-16 map the default factors give strides 4, 8, 16, 32, named ``"0"`` .. ``"3"``; a
    ``"pool"`` map (stride 64, the last level max-pooled as torchvision's `LastLevelMaxPool` does) follows, for
    the RPN's fifth anchor size.

    Args:
        in_channels: channels of the input map (the ViT's width).
        out_channels: channels of every output map.
        scale_factors: output sizes relative to the input, from the largest; each one of 4, 2, 1, 0.5.
        norm: ``"LN"`` (channels-first LayerNorm, ViTDet's) or None (plain convs with biases).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int = 256,
        *,
        scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
        norm: str | None = "LN",
    ) -> None:
        super().__init__()
        if norm not in ("LN", None):
            raise ValueError(f"SimpleFeaturePyramid(norm=) must be 'LN' or None; got {norm!r}")
        bad = [s for s in scale_factors if s not in (4.0, 2.0, 1.0, 0.5)]
        if bad or not scale_factors:
            raise ValueError(
                f"SimpleFeaturePyramid(scale_factors=) must be values from (4, 2, 1, 0.5); got {list(scale_factors)}"
            )
        self.scale_factors = tuple(float(s) for s in scale_factors)
        self.out_channels = out_channels
        self.stages = nn.ModuleList(
            nn.Sequential(
                *_resampling(in_channels, scale, norm), *_output_convs(in_channels, scale, out_channels, norm)
            )
            for scale in self.scale_factors
        )
        self.pool = LastLevelMaxPool()  # no weights: the state-dict keys are the stages'

    def forward(self, x: Tensor) -> OrderedDict[str, Tensor]:
        names = [str(i) for i in range(len(self.stages))]
        features = [stage(x) for stage in self.stages]
        features, names = self.pool(features, features, names)
        return OrderedDict(zip(names, features))


def _resampling(channels: int, scale: float, norm: str | None) -> list[nn.Module]:
    if scale == 4.0:
        return [
            nn.ConvTranspose2d(channels, channels // 2, kernel_size=2, stride=2),
            _norm(norm, channels // 2),
            nn.GELU(),
            nn.ConvTranspose2d(channels // 2, channels // 4, kernel_size=2, stride=2),
        ]
    if scale == 2.0:
        return [nn.ConvTranspose2d(channels, channels // 2, kernel_size=2, stride=2)]
    if scale == 0.5:
        return [nn.MaxPool2d(kernel_size=2, stride=2)]
    return []


def _output_convs(channels: int, scale: float, out_channels: int, norm: str | None) -> list[nn.Module]:
    width = {4.0: channels // 4, 2.0: channels // 2}.get(scale, channels)
    bias = norm is None  # a norm right after makes a conv bias redundant
    return [
        nn.Conv2d(width, out_channels, kernel_size=1, bias=bias),
        _norm(norm, out_channels),
        nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=bias),
        _norm(norm, out_channels),
    ]


class TimmBackbone(nn.Module):
    """A timm model's feature maps with an FPN on top, as torchvision's `BackboneWithFPN` (module docstring).

    ``body`` is timm's ``features_only`` model, ``fpn`` the torchvision `FeaturePyramidNetwork` (or, for a
    plain ViT, a `SimpleFeaturePyramid`). Maps timm returns channels-last (``output_fmt == "NHWC"``: Swin and
    other models that say so) are permuted to NCHW shape; the permute keeps their channels-last memory, which
    the FPN's convs take as they are.

    Args:
        model_name: a timm model name, with an optional pretrained tag (``convnext_tiny.fb_in22k``).
        pretrained: False (random init), True (timm's default weights for the name, through its hub cache) or a
            local path or http(s) URL of a weights file for the model (downloaded once per machine).
        out_indices: timm's ``out_indices``: which feature maps feed the FPN (an int takes the last N). For a
            plain ViT only the last index is used.
        frozen_stages: -1 trains everything; 0 freezes the stem (the modules before the first map's stage); N
            freezes the stem and the stages of the first N maps. Frozen parts get no gradients and their batch
            norms become ``FrozenBatchNorm2d`` (timm's ``freeze``). A plain ViT allows -1 or 0.
        freeze_bn: turn every batch norm of the body into ``FrozenBatchNorm2d`` (timm's
            ``freeze_batch_norm_2d``); the usual choice with pretrained weights and small per-GPU batches.
            LayerNorm models (ConvNeXt, Swin, ViT) have none and are left as they are.
        out_channels: channels of every output map.
        fpn_norm: None (torchvision's plain FPN convs) or ``"LN"``; the ViT pyramid uses ``"LN"`` when None.
        model_kwargs: more ``timm.create_model`` arguments (``drop_path_rate``, ``img_size``,
            ``dynamic_img_size``, ``strict_img_size``...).
        grad_checkpointing: recompute the trainable blocks' activations in the backward pass instead of keeping
            them (`lazytrain.modeling.checkpointing`: one block at a time, timm's own switches where timm has
            them), in training mode only; same gradients, less memory, about one more backbone forward.
    """

    def __init__(
        self,
        model_name: str,
        *,
        pretrained: bool | str = False,
        out_indices: int | Sequence[int] = 4,
        frozen_stages: int = -1,
        freeze_bn: bool = False,
        out_channels: int = 256,
        fpn_norm: str | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        _check_arguments(model_name, pretrained, frozen_stages, fpn_norm)
        check_grad_checkpointing("TimmBackbone", grad_checkpointing)
        self.body = _create_features(model_name, pretrained, out_indices, dict(model_kwargs or {}))
        info = self.body.feature_info
        self.strides, self.channels = list(info.reduction()), list(info.channels())
        self.is_plain = len(set(self.strides)) == 1
        self.channels_last_output = getattr(self.body, "output_fmt", "NCHW") == "NHWC"
        self.out_channels = out_channels
        if self.is_plain and frozen_stages > 0:
            raise ValueError(
                f"TimmBackbone(frozen_stages=) for {model_name}, a plain model (every map at stride "
                f"{self.strides[0]}), must be -1 or 0 (its patch embedding); got {frozen_stages}"
            )
        _freeze(self.body, frozen_stages, freeze_bn)
        self.grad_checkpointing = grad_checkpointing
        self._checkpointed = _prepare_checkpointing(self.body, model_name) if grad_checkpointing else []
        set_timm_checkpointing(self.body, self._checkpointed, self.training)
        if self.is_plain:
            self.fpn = SimpleFeaturePyramid(self.channels[-1], out_channels, norm=fpn_norm or "LN")
        else:
            self.fpn = FeaturePyramidNetwork(
                self.channels,
                out_channels,
                extra_blocks=LastLevelMaxPool(),
                norm_layer=_layer_norm_2d if fpn_norm == "LN" else None,
            )

    def forward(self, x: Tensor) -> OrderedDict[str, Tensor]:
        maps = self.body(x)
        if isinstance(maps, Mapping):
            maps = list(maps.values())
        if self.channels_last_output:
            maps = [m.permute(0, 3, 1, 2) for m in maps]
        if self.is_plain:
            return self.fpn(maps[-1])
        return self.fpn(OrderedDict((str(i), m) for i, m in enumerate(maps)))

    def train(self, mode: bool = True) -> TimmBackbone:
        """Training or evaluation mode; timm's checkpoint switches follow it (no recompute in evaluation)."""
        super().train(mode)
        set_timm_checkpointing(self.body, self._checkpointed, mode)
        return self

    def get_feature_map_names(self) -> list[str]:
        """Names of the returned maps, the RoI poolers' ``featmap_names`` and then ``"pool"``."""
        levels = len(self.fpn.stages) if self.is_plain else len(self.channels)
        return [str(i) for i in range(levels)] + ["pool"]


def _check_arguments(
    model_name: str, pretrained: bool | str, frozen_stages: int, fpn_norm: str | None
) -> None:
    if not isinstance(model_name, str) or not model_name:
        raise TypeError(
            f"TimmBackbone(model_name=) must be a timm model name, e.g. 'convnext_tiny'; got {model_name!r}"
        )
    if not isinstance(pretrained, (bool, str)):
        raise TypeError(
            f"TimmBackbone(pretrained=) must be True, False, a path or a URL; got {type(pretrained).__name__}"
        )
    if not isinstance(frozen_stages, int) or frozen_stages < -1:
        raise ValueError(
            f"TimmBackbone(frozen_stages=) must be an int >= -1 (-1: none frozen); got {frozen_stages!r}"
        )
    if fpn_norm not in (None, "LN"):
        raise ValueError(f"TimmBackbone(fpn_norm=) must be None or 'LN'; got {fpn_norm!r}")
    problem = find_model_name_problem(model_name)
    if problem:
        raise ValueError(f"TimmBackbone(model_name={model_name!r}): {problem}")


def _import_timm() -> Any:
    timm = import_optional("timm", component="TimmBackbone", extra="timm")
    import_optional("timm.utils.model", component="TimmBackbone", extra="timm")  # the freeze helpers
    return timm


def find_model_name_problem(model_name: str) -> str | None:
    """What is wrong with `model_name` as a timm model name with an optional pretrained tag
    (``convnext_tiny.fb_in22k``), with the closest names timm has; None when timm knows it.

    Raises:
        ModuleNotFoundError: timm is not installed (the message says how to install it).
    """
    timm = _import_timm()
    architecture, tag = timm.models.split_model_name_tag(model_name)
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=3, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return f"not a timm model.{hint} (timm.list_models('*{architecture[:4]}*') lists names like it.)"
    tags = [name.partition(".")[2] for name in timm.list_pretrained(f"{architecture}.*")]
    if tag and tag not in tags:
        close = difflib.get_close_matches(tag, tags, n=1, cutoff=0.5)
        hint = f" Did you mean {architecture}.{close[0]}?" if close else ""
        return f"timm has no pretrained tag '{tag}' for {architecture}.{hint} Its tags: {', '.join(tags) or 'none'}."
    return None


def _create_features(
    model_name: str, pretrained: bool | str, out_indices: int | Sequence[int], model_kwargs: dict
) -> nn.Module:
    """timm's ``features_only`` model, with its pretrained weights loaded by timm and a report logged."""
    timm = _import_timm()
    indices = out_indices if isinstance(out_indices, int) else tuple(out_indices)
    kwargs = {**model_kwargs, "features_only": True, "out_indices": indices}
    source = str(pretrained)
    if isinstance(pretrained, str) and pretrained:
        kwargs["pretrained_cfg_overlay"] = dict(file=_get_local_file(model_name, pretrained))
    if pretrained:
        # Non-strict, as train.init_checkpoint: what the file lacks keeps its fresh init, and the report says so.
        kwargs["pretrained_strict"] = False
    with _captured_records(_TIMM_LOAD_LOGGER) as records:
        try:
            body = timm.create_model(model_name, pretrained=bool(pretrained), **kwargs)
        except OSError as e:  # the hub's and urllib's network errors, a missing cache entry offline
            if pretrained is not True:
                raise
            raise ConfigError(_offline_message(timm, model_name, e)) from e
    if pretrained is True:
        cfg = getattr(body, "pretrained_cfg", None) or {}
        source = f"timm's hub ({cfg.get('hf_hub_id') or cfg.get('url') or model_name})"
    if pretrained:
        logger.info("%s", _load_report(model_name, source, records))
    return body


def _get_local_file(model_name: str, path: str) -> str:
    """A local file for ``pretrained=PATH``: URLs are downloaded once per machine into torch hub's cache."""
    local = download_to_cache(path) if is_url(path) else path
    if not os.path.isfile(local):
        raise FileNotFoundError(
            f"TimmBackbone(model_name={model_name!r}, pretrained=): no such file: {path}. Give a weights file "
            "for the model, pretrained=True (timm's default weights) or pretrained=False (random init)."
        )
    return local


def _offline_message(timm: Any, model_name: str, error: BaseException) -> str:
    cfg = timm.models.get_pretrained_cfg(model_name)
    where = (cfg and (cfg.hf_hub_id or cfg.url)) or "its weights"
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"TimmBackbone(model_name={model_name!r}, pretrained=True): could not get timm's weights ({reason}). "
        "Without internet, run once where there is (they stay in the Hugging Face cache, $HF_HOME), or download "
        f"{where} and set model.backbone.pretrained=PATH, or model.backbone.pretrained=False for random weights."
    )


@contextlib.contextmanager
def _captured_records(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records of logger `name` (INFO and up) while the block runs: timm logs its load report there."""

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    records: list[logging.LogRecord] = []
    target, handler = logging.getLogger(name), _Collect(logging.INFO)
    level, propagate = target.level, target.propagate
    target.setLevel(logging.INFO)
    target.propagate = False  # lazytrain's report says it once, in its own words
    target.addHandler(handler)
    try:
        yield records
    finally:
        target.removeHandler(handler)
        target.setLevel(level)
        target.propagate = propagate


def _load_report(model_name: str, source: str, records: list[logging.LogRecord]) -> str:
    """What timm's load did, from its log: tensors left at their fresh init and file tensors unused. The
    classifier, which ``features_only`` drops, is not listed. timm's loader returns nothing, so its log lines are
    the only record (tests/modeling/test_timm_backbone.py fails if a timm release words them differently)."""
    missing, unexpected = [], []
    for record in records:
        message = record.getMessage()
        for pattern, keys in ((_MISSING, missing), (_UNEXPECTED, unexpected)):
            if match := pattern.search(message):
                keys += [k for k in match.group(1).split(", ") if not _is_classifier(k)]
    lines = [f"TimmBackbone {model_name}: weights from {source}"]
    lines.append(
        f"  re-initialised (not in the weights): {', '.join(missing)}" if missing else "  every tensor loaded"
    )
    if unexpected:
        lines.append(f"  unused (not in the model): {', '.join(unexpected)}")
    return "\n".join(lines)


def _is_classifier(key: str) -> bool:
    return key.startswith(("fc.", "head.", "classifier.", "head_dist."))


def _prepare_checkpointing(body: nn.Module, model_name: str) -> list[str]:
    """The checkpointed modules of `body` (`prepare_timm_checkpointing`), refusing a setup that cannot work."""
    problem = find_timm_checkpoint_problem(_import_timm())
    if problem:
        raise ValueError(f"TimmBackbone(grad_checkpointing=True) needs non-reentrant checkpoints: {problem}.")
    checkpointed = prepare_timm_checkpointing(body, _get_trunk(body))
    if not checkpointed:
        raise ValueError(
            f"TimmBackbone(model_name={model_name!r}, grad_checkpointing=True): no trainable stage of blocks to "
            "checkpoint (every stage is frozen, or timm gives this model's stages no checkpoint switch); set "
            "grad_checkpointing=False."
        )
    return checkpointed


def _get_trunk(body: nn.Module) -> nn.Module:
    """The module whose children are the network's parts in order: timm's getter wrappers keep the model whole."""
    return body.model if type(body).__name__ == "FeatureGetterNet" else body


def _get_stage_children(body: nn.Module) -> tuple[list[str], list[int]]:
    """The trunk's children names, and for each returned map the index of the child that makes it."""
    trunk = _get_trunk(body)
    names = [name for name, _ in trunk.named_children()]
    positions = []
    for module_name in body.feature_info.module_name():
        candidates = (
            module_name,
            module_name.replace(".", "_"),
        )  # features_only flattens "stages.0" to "stages_0"
        found = [
            i for i, child in enumerate(names) for c in candidates if c == child or c.startswith(child + ".")
        ]
        if not found:
            raise ValueError(
                f"TimmBackbone(frozen_stages=): cannot find the module {module_name!r} of a feature map among the "
                f"model's parts {names}; use frozen_stages=-1 and freeze by hand."
            )
        positions.append(found[0])
    return names, positions


def _freeze(body: nn.Module, frozen_stages: int, freeze_bn: bool) -> None:
    timm = _import_timm()
    trunk = _get_trunk(body)
    if frozen_stages >= 0:
        names, positions = _get_stage_children(body)
        if frozen_stages > len(positions):
            raise ValueError(
                f"TimmBackbone(frozen_stages=) must be at most the number of feature maps, {len(positions)}; got "
                f"{frozen_stages}"
            )
        end = positions[0] if frozen_stages == 0 else positions[frozen_stages - 1] + 1
        # timm's helper: no gradients, and batch norms frozen, so their statistics stop drifting in train mode.
        # An empty list would mean the whole model to it.
        if names[:end]:
            timm.utils.model.freeze(trunk, submodules=names[:end], include_bn_running_stats=True)
    if freeze_bn:
        timm.layers.freeze_batch_norm_2d(trunk)
