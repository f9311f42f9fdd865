"""Frozen batch norms folded into the convolution before them, for speed with the same numbers.

torchvision's `FrozenBatchNorm2d` applies ``x * scale + shift`` with fp32 buffers, so under bf16 autocast every
bf16 conv output is promoted to fp32, the ReLU runs in fp32 and the next conv casts back. Folding the affine into
the conv's weight and bias keeps the conv output in the autocast dtype and removes two activation-sized kernels
per norm. Only modules and functions for that fold belong here: `FoldedFrozenBatchNorm2d` (same buffers and
state-dict keys as torchvision's, identity forward), `FrozenBatchNormConv2d` (a conv that applies the norm) and
`fold_frozen_batch_norm` (swaps them into a torchvision ResNet).

The fold follows the modules that are really there: a folded pair remembers where it sits in its parent, and
when either module has been replaced since (a user swapping the frozen norms for ``BatchNorm2d`` to fine-tune
them, or the conv for another), the conv that is left computes a plain convolution and the norm that is left
normalises by itself, so nothing is normalised twice or not at all.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn
from torchvision.ops.misc import FrozenBatchNorm2d

__all__ = ["FoldedFrozenBatchNorm2d", "FrozenBatchNormConv2d", "fold_frozen_batch_norm"]

_NORM_BUFFERS = ("weight", "bias", "running_mean", "running_var")
# Only tensors of these exact types are cached: fake, functorch-wrapped or other subclass tensors belong to a
# transform or tracer and must not outlive it in a cache.
_PLAIN_TENSORS = (Tensor, nn.Parameter)
_CONV_NAME = re.compile(r"conv(\d+)")


class _ForgetsCacheOnMove(nn.Module):
    """A module with a `_cache` of computed tensors that moves, casts, copies and pickles without it: its
    tensors keep the old dtype and device and would pin the old memory; a copy recomputes them."""

    _cache: tuple | None = None

    def _apply(self, fn, recurse: bool = True):
        self._cache = None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_cache"] = None
        return state


class _FoldSite:
    """Where a folded conv and norm sit in their parent: the fold holds while both are still there."""

    def __init__(self, parent: nn.Module, conv_name: str, norm_name: str) -> None:
        self.parent, self.conv_name, self.norm_name = parent, conv_name, norm_name

    def holds(self, conv: nn.Module, norm: nn.Module) -> bool:
        return (
            getattr(self.parent, self.conv_name, None) is conv
            and getattr(self.parent, self.norm_name, None) is norm
        )


class FoldedFrozenBatchNorm2d(_ForgetsCacheOnMove, FrozenBatchNorm2d):
    """A `FrozenBatchNorm2d` whose affine the `FrozenBatchNormConv2d` before it applies; its forward is the identity.

    Buffers and state-dict keys are torchvision's (``weight``, ``bias``, ``running_mean``, ``running_var``; a
    ``num_batches_tracked`` key is dropped on load, as torchvision does), so checkpoints load either way.
    Used on its own, without that conv, it does not normalise anything; placed by `fold_frozen_batch_norm`, it
    normalises as torchvision's does once its conv has been replaced in the parent.

    Args:
        num_features: number of channels ``C`` of an ``(N, C, H, W)`` input.
        eps: added to the running variance before the square root.
    """

    _conv: nn.Module | None = None
    _fold_site: _FoldSite | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self._fold_site is None or self._fold_site.holds(self._conv, self):
            return x
        return super().forward(x)

    def scale_and_shift(self) -> tuple[Tensor, Tensor]:
        """``(scale, shift)`` with ``norm(x) == x * scale + shift`` per channel, by torchvision's formula.

        Computed once and cached until a buffer is replaced or changed in place (the buffers are frozen, so a
        trainable conv before the norm folds with one multiplication per step).

        Returns:
            Two ``(C,)`` tensors in float32, or in the buffers' dtype where that is wider (float64).
        """
        sources = [getattr(self, name) for name in _NORM_BUFFERS]
        if not _cacheable(sources):
            self._cache = None
            return self._scale_and_shift()
        key = _cache_key(sources, self.eps)
        if self._cache is not None and _same_key(self._cache[0], key):
            return self._cache[1], self._cache[2]
        with torch.no_grad():
            scale, shift = self._scale_and_shift()
        self._cache = (key, scale, shift)
        return scale, shift

    def _scale_and_shift(self) -> tuple[Tensor, Tensor]:
        dtype = torch.promote_types(self.weight.dtype, torch.float32)
        weight, bias, mean, var = (getattr(self, name).to(dtype) for name in _NORM_BUFFERS)
        scale = weight * (var + self.eps).rsqrt()
        return scale, bias - mean * scale

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.weight.shape[0]}, eps={self.eps}, applied by the preceding conv)"


class FrozenBatchNormConv2d(_ForgetsCacheOnMove, nn.Conv2d):
    """A `Conv2d` followed by a `FoldedFrozenBatchNorm2d`, computed as one conv with folded weight and bias.

    It shares the original conv's ``weight`` (and ``bias``) parameters, so its state-dict keys are the conv's.
    The norm is referenced, not registered as a submodule: it stays registered under its own name in the
    parent, which keeps the norm's state-dict keys and lets ``.to()``, deepcopy and DDP treat it as before.
    When no source tensor requires grad (frozen stages), the folded weight and bias are cached and recomputed
    only when a source tensor is replaced or changed in place. Otherwise the fold is recomputed every forward,
    so gradients reach the conv weight, and so fused optimizers, which update weights without bumping their
    version counters, never leave a stale fold behind. Writes through ``.data`` bypass version counters too:
    change a frozen tensor in place under ``torch.no_grad()`` or with ``load_state_dict`` instead.

    Args:
        conv: the convolution whose output goes straight into `norm`; its parameters are shared, not copied.
        norm: the norm, with ``norm.weight.numel() == conv.out_channels``.

    Raises:
        TypeError: `conv` is not a `Conv2d` or `norm` not a `FoldedFrozenBatchNorm2d`.
        ValueError: the norm's channel count is not the conv's output channel count.
    """

    def __init__(self, conv: nn.Conv2d, norm: FoldedFrozenBatchNorm2d) -> None:
        _check_pair(conv, norm)
        # Built on the meta device so no weight is allocated or initialised only to be replaced at once.
        super().__init__(
            conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
            dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
            padding_mode=conv.padding_mode, device="meta",
        )  # fmt: skip
        self.weight = conv.weight
        self.bias = conv.bias
        self.train(conv.training)
        # object.__setattr__ keeps nn.Module from registering the norm a second time, under this conv.
        object.__setattr__(self, "_folded_norm", norm)

    @property
    def norm(self) -> FoldedFrozenBatchNorm2d:
        """The frozen batch norm this conv applies (registered in the parent module, not here)."""
        return self._folded_norm

    _fold_site: _FoldSite | None = None

    def forward(self, input: Tensor) -> Tensor:
        if self._fold_site is not None and not self._fold_site.holds(self, self._folded_norm):
            return super().forward(input)  # the norm was replaced: whatever stands there now normalises
        weight, bias = self.folded_weight_and_bias()
        # _conv_forward handles padding_mode; under autocast F.conv2d casts the folded weight and bias itself.
        return self._conv_forward(input, weight, bias)

    def folded_weight_and_bias(self) -> tuple[Tensor, Tensor]:
        """The conv weight times the norm's scale, and the conv bias times the scale plus the norm's shift.

        Returns:
            ``(weight, bias)`` in the conv weight's dtype; the cached tensors when the cache applies.
        """
        sources = self._sources()
        if not _cacheable(sources):
            self._cache = None  # a later cached forward must not trust a fold from before this one
            return self._fold()
        key = _cache_key(sources, self._folded_norm.eps)
        cache = self._cache
        if cache is not None and _same_key(cache[0], key):
            return cache[1], cache[2]
        with torch.no_grad():
            weight, bias = self._fold()
        self._cache = (key, weight, bias)
        return weight, bias

    def _sources(self) -> list[Tensor]:
        conv = [self.weight] if self.bias is None else [self.weight, self.bias]
        return conv + [getattr(self._folded_norm, name) for name in _NORM_BUFFERS]

    def _fold(self) -> tuple[Tensor, Tensor]:
        scale, shift = self._folded_norm.scale_and_shift()
        dtype = torch.promote_types(self.weight.dtype, scale.dtype)
        weight = self.weight.to(dtype) * scale.to(dtype).reshape(-1, 1, 1, 1)
        bias = shift if self.bias is None else torch.addcmul(shift, self.bias.to(dtype), scale)
        return weight.to(self.weight.dtype), bias.to(self.weight.dtype)

    def _replicate_for_data_parallel(self):
        raise TypeError(
            "FrozenBatchNormConv2d: nn.DataParallel cannot replicate a conv with a folded norm (the replica "
            "would read the original device's norm); expected DistributedDataParallel or a single device, "
            "got a DataParallel replica. Build the backbone with fold_frozen_bn=False to use DataParallel."
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, folded_frozen_batch_norm=(eps={self._folded_norm.eps})"


def _check_pair(conv: nn.Module, norm: nn.Module) -> None:
    if not isinstance(conv, nn.Conv2d):
        raise TypeError(f"FrozenBatchNormConv2d(conv=) must be an nn.Conv2d; got {type(conv).__name__}")
    if not isinstance(norm, FoldedFrozenBatchNorm2d):
        raise TypeError(
            f"FrozenBatchNormConv2d(norm=) must be a FoldedFrozenBatchNorm2d; got {type(norm).__name__}"
        )
    if norm.weight.numel() != conv.out_channels:
        raise ValueError(
            f"FrozenBatchNormConv2d(norm=) must have conv.out_channels={conv.out_channels} channels; "
            f"got {norm.weight.numel()}"
        )


def _cacheable(sources: list[Tensor]) -> bool:
    # Tracing and compiling must record the fold itself, not a constant; an inference tensor cached inside
    # inference_mode could not be saved for backward by a later training forward.
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_inference_mode_enabled():
        return False
    return all(type(t) in _PLAIN_TENSORS and not t.requires_grad and not t.is_inference() for t in sources)


def _cache_key(sources: list[Tensor], eps: float) -> tuple:
    # `.to()` swaps `param.data` without bumping `_version`: the pointer, dtype and device catch that too.
    signature = tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in sources)
    return tuple(sources), signature, eps


def _same_key(old: tuple, new: tuple) -> bool:
    old_sources, new_sources = old[0], new[0]
    same_objects = len(old_sources) == len(new_sources) and all(
        a is b for a, b in zip(old_sources, new_sources)
    )
    return same_objects and old[1:] == new[1:]


def fold_frozen_batch_norm(module: nn.Module) -> nn.Module:
    """Fold every torchvision `FrozenBatchNorm2d` that directly follows an ``nn.Conv2d`` into that conv.

    A pair is a plain ``nn.Conv2d`` (not a subclass) and a ``FrozenBatchNorm2d`` (exactly that type) with as
    many channels, found as siblings named ``conv<k>`` and ``bn<k>`` (the stem and the blocks of torchvision's
    ResNet) or as consecutive entries of an ``nn.Sequential`` (``downsample``). The conv becomes a
    `FrozenBatchNormConv2d` and the norm a `FoldedFrozenBatchNorm2d`, sharing the same parameter and buffer
    tensors (``requires_grad`` unchanged), so state-dict keys, values and outputs stay the same. Trainable
    norms (``BatchNorm2d``, ``GroupNorm``) are left alone. Replacing either module of a pair afterwards undoes
    that pair's fold (see the module docstring).

    The names are trusted to mean that the conv's output goes straight into the norm, as in torchvision's
    ResNet (``convN -> bnN``) and its `IntermediateLayerGetter` body; use it on such modules only.

    Args:
        module: a torchvision ResNet, a `BackboneWithFPN` body, or a module containing them.

    Returns:
        `module` itself, changed in place.

    Raises:
        TypeError: `module` is not an ``nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"fold_frozen_batch_norm(module=) must be an nn.Module; got {type(module).__name__}")
    for parent in list(module.modules()):  # a snapshot: the walk replaces children as it goes
        for conv_name, norm_name in _candidate_pairs(parent):
            conv, norm = getattr(parent, conv_name), getattr(parent, norm_name, None)
            if _foldable(conv, norm):
                folded_norm = _folded_copy(norm)
                folded_conv = FrozenBatchNormConv2d(conv, folded_norm)
                setattr(parent, conv_name, folded_conv)
                setattr(parent, norm_name, folded_norm)
                site = _FoldSite(parent, conv_name, norm_name)
                # Plain attributes, not submodules: the parent already registers both.
                object.__setattr__(folded_conv, "_fold_site", site)
                object.__setattr__(folded_norm, "_fold_site", site)
                object.__setattr__(folded_norm, "_conv", folded_conv)
    return module


def _candidate_pairs(parent: nn.Module) -> list[tuple[str, str]]:
    names = [name for name, _ in parent.named_children()]
    pairs = list(zip(names, names[1:])) if isinstance(parent, nn.Sequential) else []
    pairs += [(name, f"bn{match[1]}") for name in names if (match := _CONV_NAME.fullmatch(name))]
    return pairs


def _foldable(conv: nn.Module, norm: nn.Module | None) -> bool:
    return (
        type(conv) is nn.Conv2d
        and type(norm) is FrozenBatchNorm2d
        and conv.out_channels == norm.weight.numel()
    )


def _folded_copy(norm: FrozenBatchNorm2d) -> FoldedFrozenBatchNorm2d:
    folded = FoldedFrozenBatchNorm2d(norm.weight.numel(), eps=norm.eps)
    for name in _NORM_BUFFERS:
        setattr(folded, name, getattr(norm, name))  # the same tensors: no copy, same device and dtype
    folded.train(norm.training)
    return folded
