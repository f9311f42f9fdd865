"""Activation checkpointing for backbones: blocks whose activations are recomputed in the backward pass instead
of kept from the forward, which trades about one more forward of the backbone for most of its activation memory.

`CheckpointedSequential` is an ``nn.Sequential`` (the same children under the same names, so the same state-dict
keys) that runs each of its blocks under ``torch.utils.checkpoint`` in training steps; `checkpoint_blocks` swaps
it in for named stages (torchvision's ResNet layers, timm's plain ``nn.Sequential`` stages).
`prepare_timm_checkpointing` uses timm's own switches where timm checkpoints one block at a time, and
`set_timm_checkpointing` turns them on for training and off for evaluation.

Granularity: one block (a residual block, a transformer block) per checkpoint. A checkpoint keeps its input and
recomputes everything inside it during the backward pass, so the backward's peak is the kept block inputs plus
the inside of one block. A checkpoint per stage would keep fewer inputs but bring a whole stage back at once,
and one stage holds most blocks of the large backbones (ResNet-101's layer3, Swin-B's third stage), so little
would be saved; finer than a block (one per conv) saves nothing, since a layer's input is what it keeps anyway.
Stems and other runs of single layers are left alone for the same reason: each layer would be its own
checkpoint, keeping the input it keeps anyway.

Every checkpoint is torch's non-reentrant kind (``use_reentrant=False``), because it
- gets gradients to the parameters of a block whose input needs none (the first trainable stage after frozen
  ones); the reentrant kind returns none there;
- works under DDP whatever ``find_unused_parameters`` and ``static_graph`` are (DistributedDataParallel's
  documentation: the reentrant kind is unsupported with unused parameters or ``find_unused_parameters=True``,
  and where a layer is checkpointed more than once);
- recomputes under the forward's autocast state (bf16 stays bf16) and can be captured by ``torch.compile``.
The RNG state is saved before each block and restored for its recompute (torch's ``preserve_rng_state``
default), so dropout and drop-path draw the same masks twice and the gradients are those of the plain run.

Batch norms: a checkpointed part's running statistics end each step as the plain run's. The recompute runs a
batch norm in training mode a second time, which would move ``running_mean``/``running_var`` again and count
``num_batches_tracked`` twice; so each norm with running statistics in a checkpointed part gets a hook pair that
keeps its statistics as they were before any forward that runs while autograd executes a backward (the only
place a non-reentrant checkpoint recomputes). This covers lazytrain's checkpoints and timm's own alike (timm
gives its checkpoints no recompute context to pass), and the recompute still normalises with the batch's
statistics, so the saved tensors and the gradients are unchanged. A user's own reentrant checkpoint around
hooked norms recomputes inside the backward too and is kept out the same way (the copy back leaves the buffers'
version counters alone, which that recompute's graph checks), and a recompute stopped by Ctrl-C leaves no copy
for the next forward to restore. Under ``torch.compile`` the hooks stand aside: the captured graph applies
the forward's update once and its recompute updates nothing.
`torch.nn.SyncBatchNorm` is refused in a checkpointed part: its recompute would all-reduce its statistics a
second time, inside the backward, next to DDP's gradient all-reduces.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

__all__ = [
    "CheckpointedSequential",
    "check_grad_checkpointing",
    "checkpoint_blocks",
    "find_timm_checkpoint_problem",
    "has_trainable_parameters",
    "prepare_timm_checkpointing",
    "set_timm_checkpointing",
]

_TIMM_SWITCH = "grad_checkpointing"  # the boolean attribute timm's models and stages read in their forward


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` of blocks, each run under activation checkpointing in training steps.

    It checkpoints only in training mode while autograd records (``torch.is_grad_enabled()``): evaluation and
    ``torch.no_grad`` run the blocks as a plain ``nn.Sequential`` does, with no recompute and no RNG bookkeeping.
    Make one from a stage with `checkpoint_blocks`, which keeps the children and their names and keeps the
    running statistics of their batch norms out of the recompute (module docstring).
    """

    def forward(self, input: Tensor) -> Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(input)
        for block in self:
            input = checkpoint(block, input, use_reentrant=False)
        return input


def check_grad_checkpointing(component: str, value: object) -> None:
    """Refuse a `grad_checkpointing=` argument of `component` that is not a bool (a config's "yes", 1)."""
    if not isinstance(value, bool):
        raise TypeError(f"{component}(grad_checkpointing=) must be True or False; got {value!r}")


def has_trainable_parameters(module: nn.Module) -> bool:
    """Whether any parameter of `module` gets gradients (frozen stages have nothing to checkpoint)."""
    return any(p.requires_grad for p in module.parameters())


def checkpoint_blocks(parent: nn.Module, names: Iterable[str]) -> None:
    """Replace each named child of `parent`, an ``nn.Sequential`` of blocks, by a `CheckpointedSequential` that
    holds the same block modules under the same names (state-dict keys, frozen parameters and folded frozen
    batch norms are unchanged: the blocks are the same objects). Their batch norms' running statistics are
    updated by the forward only, not again by the recompute (module docstring).

    Raises:
        TypeError: a named child is not an ``nn.Sequential``.
        ValueError: a named child holds a ``SyncBatchNorm``.
    """
    for name in names:
        stage = getattr(parent, name)
        if not isinstance(stage, nn.Sequential):
            raise TypeError(
                f"checkpoint_blocks(names=): {name!r} must be an nn.Sequential of blocks; got {type(stage).__name__}"
            )
        _keep_statistics_in_recompute(stage, name)
        checkpointed = CheckpointedSequential(OrderedDict(stage.named_children()))
        checkpointed.train(stage.training)
        setattr(parent, name, checkpointed)


def _keep_statistics_in_recompute(part: nn.Module, name: str) -> None:
    """Hook each norm with running statistics in `part`, a module whose blocks are checkpointed (called `name`
    in messages), so that its recompute leaves the statistics as the forward left them (module docstring).

    Raises:
        ValueError: `part` holds a `torch.nn.SyncBatchNorm`.
    """
    for path, module in part.named_modules(prefix=name):
        if isinstance(module, nn.SyncBatchNorm):
            raise ValueError(
                f"grad_checkpointing=True cannot checkpoint {path!r}, a SyncBatchNorm: its recompute in the "
                "backward pass would all-reduce the batch statistics a second time; use per-process batch "
                "norms there (norm='BN') or frozen ones (norm='FrozenBN'), or grad_checkpointing=False"
            )
        if isinstance(module, _NormBase) and module.track_running_stats:
            module.register_forward_pre_hook(_save_statistics_before_recompute)
            # always_call: the recompute may stop early by raising inside the norm, once the backward has all
            # the tensors it needs (torch's checkpoint early stop), after the statistics have moved.
            module.register_forward_hook(_restore_statistics_after_recompute, always_call=True)


_SAVED_STATISTICS = "_statistics_before_recompute"
_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def _save_statistics_before_recompute(module: nn.Module, args: tuple) -> None:
    # A dynamo trace must not see the autograd engine's state; the compiled graph updates once by itself.
    if torch.compiler.is_compiling():
        return
    # A copy still here was left by a recompute that stopped between the two hooks without an Exception (a
    # KeyboardInterrupt: torch runs always_call hooks on Exception only); restored after this forward, it would
    # undo this forward's update, so it goes.
    module.__dict__.pop(_SAVED_STATISTICS, None)
    if not module.training:
        return
    # -1 outside a backward (the id torch's own checkpoint keys its recomputations by). A forward inside a
    # backward is a recompute: nothing else runs modules there.
    if torch._C._current_graph_task_id() != -1:
        saved = [getattr(module, key) for key in _STATISTICS]
        setattr(module, _SAVED_STATISTICS, [None if t is None else t.clone() for t in saved])


def _restore_statistics_after_recompute(module: nn.Module, args: tuple, output: object) -> None:
    saved = module.__dict__.pop(_SAVED_STATISTICS, None)
    if saved is None:
        return
    # Through .data, which shares the buffer's memory but not its version counter: under a reentrant
    # checkpoint (a user's own, around hooked norms) the recompute's graph saved the running statistics for
    # the norm's backward, and a version bump would make that backward refuse them ("modified by an inplace
    # operation"). Safe: a norm in training mode normalises with the batch's statistics, and its backward
    # reads the running ones not at all.
    for key, value in zip(_STATISTICS, saved):
        if value is not None:
            getattr(module, key).data.copy_(value)


def _is_block_sequence(module: nn.Module) -> bool:
    """An ``nn.Sequential`` whose every child is a block (has children of its own), not a run of single layers
    such as a deep stem's conv-norm-act."""
    children = list(module.children())
    return isinstance(module, nn.Sequential) and bool(children) and all(any(c.children()) for c in children)


def prepare_timm_checkpointing(body: nn.Module, trunk: nn.Module) -> list[str]:
    """Set up one-block-at-a-time checkpointing in a timm ``features_only`` model.

    - A model behind timm's feature getter (`trunk` is not `body`: plain ViTs) has its own switch
      (``set_grad_checkpointing``), which checkpoints each transformer block.
    - Flattened stages (`trunk` is `body`: ResNet, ConvNeXt, Swin, RegNet...): each trainable stage with timm's
      own switch (ConvNeXt's, Swin's, RegNet's stages checkpoint their blocks one by one) is listed; each
      trainable plain ``nn.Sequential`` of blocks (timm's ResNet layers) becomes a `CheckpointedSequential`.
      The feature net's own switch is not used: it checkpoints whole stages.

    Args:
        body: timm's ``features_only`` model.
        trunk: the module whose children are the network's parts (``body.model`` behind a feature getter).

    Returns:
        The names, relative to `body`, of the checkpointed modules (timm's switches, which
        `set_timm_checkpointing` turns, and the new `CheckpointedSequential` stages); empty when nothing
        trainable could be checkpointed. The batch norms of all of them keep their statistics out of the
        recompute (module docstring).

    Raises:
        ValueError: a checkpointed module holds a ``SyncBatchNorm``.
    """
    if trunk is not body:
        name = next(name for name, module in body.named_modules() if module is trunk)
        usable = callable(getattr(trunk, "set_grad_checkpointing", None)) and has_trainable_parameters(trunk)
        switches, sequences = ([name] if usable else []), []
    else:
        switches, sequences = [], []
        for name, stage in body.named_children():
            if not has_trainable_parameters(stage):
                continue
            if isinstance(getattr(stage, _TIMM_SWITCH, None), bool):
                switches.append(name)
            elif _is_block_sequence(stage):
                sequences.append(name)
    for name in switches:
        _keep_statistics_in_recompute(body.get_submodule(name), name)
    checkpoint_blocks(body, sequences)
    return switches + sequences


def set_timm_checkpointing(body: nn.Module, switches: Iterable[str], enable: bool) -> None:
    """Turn timm's checkpoint switches among `switches` (from `prepare_timm_checkpointing`) on or off; a
    `CheckpointedSequential` among them follows the training mode by itself."""
    for name in switches:
        module = body.get_submodule(name)
        if isinstance(module, CheckpointedSequential):
            continue
        if callable(getattr(module, "set_grad_checkpointing", None)):
            module.set_grad_checkpointing(enable)
        else:
            setattr(module, _TIMM_SWITCH, enable)


def find_timm_checkpoint_problem(timm: object) -> str | None:
    """Why timm's own checkpoints would be the reentrant kind (module docstring), or None when they are not.

    Args:
        timm: the imported ``timm`` package.
    """
    use_reentrant = getattr(timm.layers, "use_reentrant_ckpt", None)
    if use_reentrant is None:
        return (
            f"timm {timm.__version__} checkpoints with torch's reentrant default; upgrade timm "
            "(pip install -U timm) to a release with timm.layers.use_reentrant_ckpt"
        )
    if use_reentrant():
        return (
            "timm is set to reentrant checkpoints (the TIMM_REENTRANT_CKPT environment variable or "
            "timm.layers.set_reentrant_ckpt(True)); unset it"
        )
    return None
