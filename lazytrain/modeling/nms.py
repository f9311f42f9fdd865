"""Greedy non-maximum suppression (NMS) for many groups of boxes at once, with the host waiting at most once.

`grouped_nms` runs greedy NMS within every group of a batch on tensors whose sizes do not depend on the data:
each row of [N, K] candidates holds its groups one after the other (for the RPN, the FPN levels of one image),
each group in decreasing score order. torchvision's ``batched_nms`` instead loops over the groups with
``unique`` and ``where`` (above 4,000 box coordinates on the CPU and 100,000 on CUDA), and every ``nms`` call
makes the host wait for the accelerator (a "host sync", `lazytrain.utils.host_syncs`).

How:

- who suppresses whom is a bit matrix per group (`lazytrain.modeling.suppression.suppression_bits`): bit i of
  row j is set when box i comes before box j and their IoU is above the threshold, decided as torchvision's
  CPU ``nms`` kernel decides it, so the same boxes survive (by IoU tiles, or with ``compiled=True`` one
  ``torch.compile``d kernel per group);
- greedy NMS keeps a box unless an earlier kept box of its group overlaps it by IoU above the threshold. That
  is a fixed point, keep = valid & ~(some earlier kept box suppresses it), with one solution, which the step
  keep <- valid & ~suppressed_by(keep) reaches from any start within M steps (after step t the first t boxes
  of each group are final) and then no longer changes. `NMS_STEPS` steps run before the host looks at the
  result (`_greedy_steps`), more only when they have not settled (`_step_until_settled`);
- a box's fate depends only on earlier boxes, so deciding only each group's first ``decide_first`` candidates
  is exact for them; a row's best ``needed`` kept boxes are final once at least ``needed`` kept boxes score above
  every valid undecided candidate (`_is_complete`), which the caller reads with its other results.

`grouped_batched_nms` uses it for the RoI heads' per-class NMS where the groups (classes) are many and of
any size: the classes in buckets of similar size, a few host reads in all.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.host_values import to_device
from lazytrain.modeling.suppression import byte_bit_values, pack_bits, suppression_bits

__all__ = ["NMS_STEPS", "GroupedNMS", "batched_nms", "grouped_batched_nms", "grouped_nms"]

# Greedy NMS is solved by repeated steps on a bit matrix of who suppresses whom; NMS_STEPS run before the host
# looks at the result: enough for the demo model's RPN, trained or at random initialisation (docs/benchmarks.md);
# `_step_until_settled` steps on where they are not.
NMS_STEPS = 16  # even: `GroupedNMS.survivors(never_suppressed=True)` relies on it
# Box coordinates above which torchvision's ``batched_nms`` loops over the groups (its CUDA threshold); there
# `batched_nms` below runs `grouped_batched_nms` instead, except on the CPU, where nothing waits for a device.
_GROUPED_ABOVE_ELEMENTS = {"cpu": None}
_DEVICE_GROUPED_ABOVE_ELEMENTS = 100_000


def batched_nms(
    boxes: Tensor,
    scores: Tensor,
    groups: Tensor,
    iou_threshold: float,
    image_shape: tuple[int, int],
    *,
    compiled: bool = False,
) -> Tensor:
    """Indices of the boxes kept by NMS within each group, by decreasing score: torchvision's ``batched_nms``,
    except where it would loop over the groups on a device (`grouped_batched_nms`: a few host reads instead of
    two per group; LVIS's 1,203 classes at score threshold 1e-4 make thousands) and under ``torch.export``.

    torchvision's chooses between a loop over the groups and its coordinate trick by the number of boxes, a
    branch on a size that depends on the data, where ``torch.export`` stops. When exporting, every group's
    boxes are moved apart by a multiple of the image's larger side (boxes clipped to `image_shape` never
    reach it) and one ``nms`` runs on them: the coordinate trick, which a TorchScript trace also records, with
    an offset known without reading the boxes, so that no size or value of the data is needed.

    `compiled`: `grouped_batched_nms`'s, where it runs (nothing changes where torchvision's runs).
    """
    if not torch.compiler.is_exporting():
        above = _GROUPED_ABOVE_ELEMENTS.get(boxes.device.type, _DEVICE_GROUPED_ABOVE_ELEMENTS)
        if above is not None and boxes.numel() > above and not torch.jit.is_tracing():
            return grouped_batched_nms(boxes, scores, groups, iou_threshold, compiled=compiled)
        return box_ops.batched_nms(boxes, scores, groups, iou_threshold)
    stride = torch.sym_max(image_shape[0], image_shape[1]) + 1
    offsets = groups.to(boxes.dtype) * stride
    return box_ops.nms(boxes + offsets[:, None], scores, iou_threshold)


def grouped_batched_nms(
    boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float, *, compiled: bool = False
) -> Tensor:
    """torchvision's ``batched_nms`` (the indices of the boxes kept within each group, by decreasing score, ties
    by index) with a few host reads for any number of groups, where its loop makes two per group.

    The boxes are ordered by group and score, and the groups stacked in buckets of similar size (64, 128, 256,
    ... candidates, `_size_buckets`); `grouped_nms` solves each bucket at once. Host reads: the group sizes,
    one or two per bucket, the survivors' number.

    Args:
        boxes: [C, 4] boxes (x1, y1, x2, y2).
        scores: [C] scores.
        groups: [C] integer group of each box (NMS runs within a group only).
        iou_threshold: IoU above which a box suppresses the lower-scoring boxes of its group.
        compiled: `grouped_nms`'s (each bucket's bit matrix and greedy steps in ``torch.compile``d kernels).
    """
    order = scores.sort(descending=True, stable=True).indices
    order = order[groups[order].sort(stable=True).indices]  # by group, then by decreasing score
    counts = torch.unique_consecutive(groups[order], return_counts=True)[1].tolist()  # the host read
    starts = [0, *itertools.accumulate(counts)][:-1]
    kept = torch.zeros_like(order)
    for size, members in _size_buckets(counts).items():
        # Each member group's candidates as one row of `size` columns; the columns past its count are invalid
        # and point at its own last candidate (any candidate would do: they neither suppress nor survive).
        first = to_device([starts[g] for g in members], boxes.device)
        count = to_device([counts[g] for g in members], boxes.device)
        columns = torch.arange(size, device=boxes.device)
        valid = columns < count[:, None]
        rows = order[first[:, None] + torch.minimum(columns, count[:, None] - 1)]
        keep, _ = grouped_nms(
            boxes[rows], scores[rows], valid, [size], iou_threshold, needed=0, compiled=compiled
        )
        kept.index_put_((rows.flatten(),), (keep & valid).flatten().to(kept.dtype), accumulate=True)
    survivors = torch.nonzero(kept)[:, 0]  # ascending index, as torchvision's
    return survivors[scores[survivors].sort(descending=True, stable=True).indices]


def _size_buckets(counts: list[int]) -> dict[int, list[int]]:
    """The groups (positions in `counts`) by their size rounded up to a power of two, at least 64."""
    buckets: dict[int, list[int]] = {}
    for group, count in enumerate(counts):
        buckets.setdefault(max(64, 1 << (count - 1).bit_length()), []).append(group)
    return buckets


def grouped_nms(
    boxes: Tensor,
    scores: Tensor,
    valid: Tensor,
    group_sizes: list[int],
    iou_threshold: float,
    *,
    needed: int,
    decide_first: int | None = None,
    compiled: bool = False,
) -> tuple[Tensor, Tensor]:
    """Greedy NMS within every group of every row at once, for each group's first `decide_first` candidates (all
    None, then stepping, with a host read per `NMS_STEPS` steps, until the result is final): one
    `GroupedNMS.survivors`. A caller that may solve twice (a first pass with `decide_first`, a second without when the
    first is not final) keeps a `GroupedNMS`, which shares the work of the two passes.

    Args and returns: `GroupedNMS` and `GroupedNMS.survivors`.
    """
    problem = GroupedNMS(boxes, scores, valid, group_sizes, iou_threshold, compiled=compiled)
    return problem.survivors(needed=needed, decide_first=decide_first)


class _Pass(NamedTuple):
    """What a pass of `GroupedNMS.survivors` left: its groups' slices and their bit matrix, valid candidates and keep
    flags, stacked one group per row (`_stack_groups`)."""

    groups: list[slice]
    suppression: Tensor
    valid: Tensor
    keep: Tensor


class GroupedNMS:
    """Greedy NMS within every group of every row at once.

    The survivors are those of torchvision's ``nms`` run on each group's valid boxes, bit for bit (the same
    float32 IoUs, compared with the threshold as its CPU kernel does).

    Args:
        boxes: [N, K, 4] boxes (x1, y1, x2, y2); half and bfloat16 boxes are compared in float32.
        scores: [N, K] scores, decreasing within each group among the valid candidates.
        valid: [N, K] bool: the candidates that take part (the others neither suppress nor survive). Put each
            group's valid candidates first, so that its first `decide_first` are valid.
        group_sizes: the groups' sizes, one after the other in each row (they sum to K).
        iou_threshold: IoU above which a box suppresses the later boxes of its group.
        compiled: compute who suppresses whom with one ``torch.compile``d kernel per group (`_iou_above_words`)
            instead of the element-wise tiles, and the greedy steps compiled too; same result (on the CPU bit
            for bit; CUDA code may fuse a multiply and add into one rounding, as torchvision's CUDA ``nms``
            kernel does). The first call compiles (seconds), once per process.
    """

    def __init__(
        self,
        boxes: Tensor,
        scores: Tensor,
        valid: Tensor,
        group_sizes: list[int],
        iou_threshold: float,
        *,
        compiled: bool = False,
    ) -> None:
        self.boxes, self.scores, self.valid = boxes, scores, valid
        self.group_sizes, self.iou_threshold, self.compiled = list(group_sizes), iou_threshold, compiled
        self._steps = _compiled_greedy_steps() if compiled else _greedy_steps
        self._last: _Pass | None = None

    def survivors(
        self, *, needed: int, decide_first: int | None = None, never_suppressed: bool = False
    ) -> tuple[Tensor, Tensor]:
        """The survivors among each group's first `decide_first` candidates (all when None, then stepping, with a
        host read per `NMS_STEPS` steps, until the result is final).

        Nothing is read on the host when `decide_first` is given: the caller reads ``is_final`` and, when it is
        false, asks again with ``decide_first=None``. That second pass computes no bit matrix again where the
        first decided every candidate (the greedy steps had not settled): it steps on from the first's flags.

        Args:
            needed: how many of each row's best survivors the caller needs (what ``is_final`` vouches for).
            decide_first: candidates decided per group, from its first; None: all.
            never_suppressed: for a caller that takes the first pass as it is (no second pass: the fixed-shape
                training step), one more step after the pass's `NMS_STEPS`. From all valid candidates, the
                iterates alternate around greedy NMS's survivors (the step reverses inclusion): after an even
                number of steps a superset (boxes greedy NMS suppresses still kept), after an odd number a
                subset (some survivors missing, no suppressed box kept). Settled, the step changes nothing.

        Returns:
            ``(keep, is_final)``: [N, K] survivors among the decided candidates, and a 0-dim bool: false when
            the steps have not settled or an undecided candidate might belong among a row's best `needed`
            survivors.
        """
        groups = _group_slices(self.group_sizes, decide_first)
        is_decided = torch.zeros_like(self.valid)
        if not groups:
            return is_decided, is_decided.new_ones(())
        for group in groups:
            is_decided[:, group] = True
        decision = self._start_pass(groups)
        keep, settled = self._steps(decision.suppression, decision.valid, decision.keep)
        if decide_first is None:
            keep, settled = _step_until_settled(
                self._steps, decision.suppression, decision.valid, keep, settled
            )
        self._last = decision._replace(keep=keep)
        if never_suppressed:  # NMS_STEPS is even: from all valid candidates, the odd step after it
            keep = _greedy_step(decision.suppression, decision.valid, keep, byte_bit_values(keep.device))
        keep = _unstack_groups(keep, groups, is_decided)
        return keep, settled & _is_complete(self.scores, self.valid, keep, is_decided, needed)

    def _start_pass(self, groups: list[slice]) -> _Pass:
        """The bit matrix of `groups` and the flags to step from: the last pass's where it decided the same
        candidates (any flags converge to the one solution), else all valid candidates."""
        if self._last is not None and self._last.groups == groups:
            return self._last
        suppression = suppression_bits(
            self.boxes, self.valid, groups, self.iou_threshold, compiled=self.compiled
        )
        stacked_valid = _stack_groups(self.valid, groups, suppression.shape[2])
        return _Pass(groups, suppression, stacked_valid, stacked_valid)


def _step_until_settled(
    steps: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
    suppression: Tensor,
    valid: Tensor,
    keep: Tensor,
    settled: Tensor,
) -> tuple[Tensor, Tensor]:
    """More `steps` (`_greedy_steps`) until they change nothing, reading that on the host after each round."""
    # M steps always settle (see the module's docstring): at most M // NMS_STEPS more rounds.
    for _ in range(suppression.shape[2] // NMS_STEPS):
        if bool(settled):
            break
        keep, settled = steps(suppression, valid, keep)
    if not bool(settled):
        # Impossible in exact arithmetic (M steps decide M boxes); raised, not asserted, so that -O keeps it.
        raise RuntimeError(
            f"GroupedNMS: the greedy steps did not settle within {suppression.shape[2]} boxes; please report "
            "this with the boxes that caused it"
        )
    return keep, settled


def _is_complete(scores: Tensor, valid: Tensor, keep: Tensor, is_decided: Tensor, needed: int) -> Tensor:
    """0-dim bool: whether every row's best `needed` kept candidates are final, that is, at least `needed` kept
    candidates score above every valid undecided one (or there is no such one)."""
    undecided = scores.masked_fill(is_decided | ~valid, -math.inf)
    best_undecided = undecided.amax(dim=1, keepdim=True)
    enough = (keep & (scores > best_undecided)).sum(dim=1) >= needed
    return (enough | (best_undecided[:, 0] == -math.inf)).all()


def _greedy_steps(suppression: Tensor, valid: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """`NMS_STEPS` steps of keep <- valid & ~(a kept box suppresses it), on [N, G, M] boxes with the bit matrix
    of `suppression_bits`; returns keep and a 0-dim bool: whether the last step changed nothing."""
    previous = keep
    bit_values = byte_bit_values(keep.device)
    for _ in range(NMS_STEPS):
        previous = keep
        keep = _greedy_step(suppression, valid, previous, bit_values)
    return keep, (keep == previous).all()


def _greedy_step(suppression: Tensor, valid: Tensor, keep: Tensor, bit_values: Tensor) -> Tensor:
    """One step of keep <- valid & ~(a kept box suppresses it) (`_greedy_steps`)."""
    suppressed = (suppression & pack_bits(keep, bit_values)[:, :, None, :]).any(dim=-1)
    return valid & ~suppressed


@functools.cache
def _compiled_greedy_steps() -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
    """`_greedy_steps` through ``torch.compile`` (about two kernels per step instead of six), made once per
    process, with dynamic shapes."""
    return torch.compile(_greedy_steps, dynamic=True)


def _group_slices(group_sizes: list[int], first: int | None = None) -> list[slice]:
    """Each non-empty group's candidates, or only its `first` ones."""
    starts = [0, *itertools.accumulate(group_sizes)]
    ends = (
        starts[1:] if first is None else [min(start + first, stop) for start, stop in zip(starts, starts[1:])]
    )
    return [slice(start, stop) for start, stop in zip(starts, ends) if stop > start]


def _stack_groups(values: Tensor, groups: list[slice], size: int) -> Tensor:
    """[N, K] values as [N, G, size], one row per group, padded with 0 (False)."""
    stacked = values.new_zeros((values.shape[0], len(groups), size))
    for index, group in enumerate(groups):
        stacked[:, index, : group.stop - group.start] = values[:, group]
    return stacked


def _unstack_groups(stacked: Tensor, groups: list[slice], like: Tensor) -> Tensor:
    """The inverse of `_stack_groups`, into a tensor shaped like `like` (0 outside the groups)."""
    values = torch.zeros_like(like)
    for index, group in enumerate(groups):
        values[:, group] = stacked[:, index, : group.stop - group.start]
    return values
