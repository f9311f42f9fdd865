"""Greedy non-maximum suppression (NMS) for many groups of boxes at once, with the host waiting at most once.

`grouped_nms` runs greedy NMS within every group of a batch on tensors whose sizes do not depend on the data:
each row of [N, K] candidates holds its groups one after the other (for the RPN, the FPN levels of one image),
each group in decreasing score order. torchvision's ``batched_nms`` instead loops over the groups with
``unique`` and ``where`` (above 4,000 box coordinates on the CPU and 100,000 on CUDA), and every ``nms`` call
makes the host wait for the accelerator (a "host sync", `lazytrain.utils.host_syncs`).

How:

- who suppresses whom is a bit matrix per group (`_suppression_bits`): bit i of row j is set when box i comes
  before box j and their IoU is above the threshold. The IoUs are computed by tiles of columns
  (`_iou_above_tiles`: small on the CPU, to stay in cache; large on devices, where each tile costs a few
  kernel launches) with the float32 operations of torchvision's CPU ``nms`` kernel, and compared with the
  threshold in double precision as that kernel does (`_float_below`), so the same boxes survive. Each tile
  is about a dozen element-wise passes over [rows, columns] arrays; ``compiled=True`` computes the packed
  words in one ``torch.compile``d kernel instead (`_iou_above_words`: the same operations, fused, nothing
  of the tile's size written), which pays where memory traffic costs more than a compile, on a GPU;
- greedy NMS keeps a box unless an earlier kept box of its group overlaps it by IoU above the threshold. That
  is a fixed point, keep = valid & ~(some earlier kept box suppresses it), with one solution, which the step
  keep <- valid & ~suppressed_by(keep) reaches from any start within M steps (after step t the first t boxes
  of each group are final) and then no longer changes. `NMS_STEPS` steps run before the host looks at the
  result (`_greedy_steps`), more only when they have not settled (`_settle`);
- a box's fate depends only on earlier boxes, so deciding only each group's first ``decided`` candidates is
  exact for them; a row's best ``limit`` kept boxes are final once at least ``limit`` kept boxes score above
  every valid undecided candidate (`_is_complete`), which the caller reads with its other results.

`grouped_batched_nms` uses it for the RoI heads' per-class NMS where the groups (classes) are many and of
any size: the classes in buckets of similar size, a few host reads in all.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.host_values import round_up, to_device

__all__ = ["NMS_STEPS", "GroupedNMS", "batched_nms", "grouped_batched_nms", "grouped_nms"]

# Greedy NMS is solved by repeated steps on a bit matrix of who suppresses whom; NMS_STEPS run before the host
# looks at the result: enough for the demo model's RPN, trained or at random initialisation (docs/benchmarks.md);
# `_settle` steps on where they are not.
NMS_STEPS = 16
# Elements of one IoU tile (`_iou_above_tiles`): small enough on the CPU to stay in cache (the fastest size on one
# thread, docs/benchmarks.md), large on GPUs, where each tile costs a few kernel launches.
_TILE_ELEMENTS = {"cpu": 1 << 17}
_DEVICE_TILE_ELEMENTS = 1 << 24
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
            boxes[rows], scores[rows], valid, [size], iou_threshold, limit=0, compiled=compiled
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
    limit: int,
    decided: int | None = None,
    compiled: bool = False,
) -> tuple[Tensor, Tensor]:
    """Greedy NMS within every group of every row at once, for each group's first `decided` candidates (all when
    None, then stepping, with a host read per `NMS_STEPS` steps, until the result is final): one
    `GroupedNMS.solve`. A caller that may solve twice (a first pass with `decided`, a second without when the
    first is not final) keeps a `GroupedNMS`, which shares the work of the two passes.

    Args and returns: `GroupedNMS` and `GroupedNMS.solve`.
    """
    problem = GroupedNMS(boxes, scores, valid, group_sizes, iou_threshold, compiled=compiled)
    return problem.solve(limit=limit, decided=decided)


class _Decision(NamedTuple):
    """What a `GroupedNMS.solve` decided: its groups' slices and their bit matrix, valid candidates and keep
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
            group's valid candidates first, so that its first `decided` are valid.
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
        self._last: _Decision | None = None

    def solve(self, *, limit: int, decided: int | None = None) -> tuple[Tensor, Tensor]:
        """The survivors among each group's first `decided` candidates (all when None, then stepping, with a
        host read per `NMS_STEPS` steps, until the result is final).

        Nothing is read on the host when `decided` is given: the caller reads ``is_final`` and, when it is
        false, solves again with ``decided=None``. That second solve computes no bit matrix again where the
        first decided every candidate (the greedy steps had not settled): it steps on from the first's flags.

        Args:
            limit: how many of each row's best survivors the caller needs (what ``is_final`` vouches for).
            decided: candidates decided per group, from its first; None: all.

        Returns:
            ``(keep, is_final)``: [N, K] survivors among the decided candidates, and a 0-dim bool: false when
            the steps have not settled or an undecided candidate might belong among a row's best `limit`
            survivors.
        """
        groups = _group_slices(self.group_sizes, decided)
        is_decided = torch.zeros_like(self.valid)
        if not groups:
            return is_decided, is_decided.new_ones(())
        for group in groups:
            is_decided[:, group] = True
        decision = self._decide(groups)
        keep, settled = self._steps(decision.suppression, decision.valid, decision.keep)
        if decided is None:
            keep, settled = _settle(self._steps, decision.suppression, decision.valid, keep, settled)
        self._last = decision._replace(keep=keep)
        keep = _unstack_groups(keep, groups, is_decided)
        return keep, settled & _is_complete(self.scores, self.valid, keep, is_decided, limit)

    def _decide(self, groups: list[slice]) -> _Decision:
        """The bit matrix of `groups` and the flags to step from: the last solve's where it decided the same
        candidates (any flags converge to the one solution), else all valid candidates."""
        if self._last is not None and self._last.groups == groups:
            return self._last
        suppression = _suppression_bits(
            self.boxes, self.valid, groups, self.iou_threshold, compiled=self.compiled
        )
        stacked_valid = _stack_groups(self.valid, groups, suppression.shape[2])
        return _Decision(groups, suppression, stacked_valid, stacked_valid)


def _settle(
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


def _is_complete(scores: Tensor, valid: Tensor, keep: Tensor, is_decided: Tensor, limit: int) -> Tensor:
    """0-dim bool: whether every row's best `limit` kept candidates are final, that is, at least `limit` kept
    candidates score above every valid undecided one (or there is no such one)."""
    undecided = scores.masked_fill(is_decided | ~valid, -math.inf)
    best_undecided = undecided.amax(dim=1, keepdim=True)
    enough = (keep & (scores > best_undecided)).sum(dim=1) >= limit
    return (enough | (best_undecided[:, 0] == -math.inf)).all()


def _greedy_steps(suppression: Tensor, valid: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """`NMS_STEPS` steps of keep <- valid & ~(a kept box suppresses it), on [N, G, M] boxes with the bit matrix
    of `_suppression_bits`; returns keep and a 0-dim bool: whether the last step changed nothing."""
    previous = keep
    bit_values = _bit_values(keep.device)
    for _ in range(NMS_STEPS):
        previous = keep
        suppressed = (suppression & _pack_bits(previous, bit_values)[:, :, None, :]).any(dim=-1)
        keep = valid & ~suppressed
    return keep, (keep == previous).all()


def _suppression_bits(
    boxes: Tensor, valid: Tensor, groups: list[slice], iou_threshold: float, *, compiled: bool = False
) -> Tensor:
    """[N, G, M, M / 64] int64: bit i of row j (as `_pack_bits` packs flag i) is set when candidate i of the
    group suppresses candidate j (`_iou_above_tiles`, or `_iou_above_words` when `compiled`); M: the largest
    group's size rounded up to 64. Rows and bits past a group's size are 0."""
    size = round_up(max(group.stop - group.start for group in groups), 64)
    bits = valid.new_zeros((valid.shape[0], len(groups), size, size // 64), dtype=torch.int64)
    bit_values = _bit_values(bits.device)
    # The compiled words put flag k at bit k: `_pack_bits`'s order on little-endian machines (all of torch's).
    compiled = compiled and sys.byteorder == "little"
    for index, group in enumerate(groups):
        group_boxes = _nms_boxes(boxes[:, group])
        if compiled:
            coordinates = _padded_coordinates(group_boxes, valid[:, group])
            threshold, by_product = _comparison(iou_threshold, group_boxes.dtype)
            words = _compiled_iou_above_words()(coordinates, threshold, by_product)
            bits[:, index, : words.shape[1], : words.shape[2]] = words
            continue
        for columns, above in _iou_above_tiles(group_boxes, valid[:, group], iou_threshold):
            bits[:, index, columns, : above.shape[2] // 64] = _pack_bits(above, bit_values)
    return bits


def _padded_coordinates(boxes: Tensor, valid: Tensor) -> Tensor:
    """[4, G, P] x1, y1, x2, y2 of G groups of M boxes, P = M rounded up to 64, nan for invalid boxes and the
    padding: their IoUs are nan, above no threshold. One operation each for all four coordinates, which then
    lie one after the other in memory."""
    padded = round_up(valid.shape[1], 64)
    coordinates = boxes.masked_fill(~valid[..., None], math.nan)
    return F.pad(coordinates, (0, 0, 0, padded - valid.shape[1]), value=math.nan).movedim(-1, 0).contiguous()


def _iou_above_words(coordinates: Tensor, threshold: float, by_product: bool) -> Tensor:
    """Who suppresses whom among G groups of P boxes (`_padded_coordinates`), packed: [G, P, P / 64] int64, bit
    i % 64 of word i // 64 in row j set where box i comes before box j (i < j) and their IoU is above the
    IoU threshold as torchvision's CPU kernel decides it (`_comparison` gives `threshold` and `by_product`).

    Written for ``torch.compile`` (`_compiled_iou_above_words`), which fuses it into one kernel that reads the
    coordinates and writes only the words (run eagerly it would allocate a dozen [G, P, P] arrays). The
    intersection and union are `_iou_above_tiles`'s float operations in its order, and the kernel is compiled
    without floating-point contraction, so that no multiply and add become one rounding. float32 IoUs are
    never rounded: compiled division may be approximate, so ``by_product`` decides ``inter / union > c``
    exactly, as ``inter > threshold * union`` in float64 (`_comparison`).
    """
    x1, y1, x2, y2 = coordinates.unbind()
    areas = (x2 - x1) * (y2 - y1)

    def pairs(values: Tensor) -> tuple[Tensor, Tensor]:
        # [G, j, i]: box j (the one suppressed) down the rows, box i (the one suppressing) along the columns.
        return values[:, None, :], values[:, :, None]

    width = (torch.minimum(*pairs(x2)) - torch.maximum(*pairs(x1))).clamp(min=0)
    height = torch.minimum(*pairs(y2)) - torch.maximum(*pairs(y1))
    intersection = width * height
    union = (areas[:, None, :] + areas[:, :, None]) - intersection
    if by_product:
        # float32 values times `threshold` are exact in float64: the comparison rounds nothing. A negative
        # union (a negative quotient) is above no threshold.
        exceeds = (intersection.double() > union.double() * threshold) & (union >= 0)
    else:
        exceeds = (intersection / union) > threshold
    index = torch.arange(coordinates.shape[-1], device=coordinates.device)
    above = exceeds & (index[None, :] < index[:, None])
    # Distinct powers of two: their sum is their bitwise or (bit 63 wraps to the sign, as in an int64 word).
    shifts = torch.arange(64, device=coordinates.device)
    return (above.long().unflatten(-1, (-1, 64)) << shifts).sum(dim=-1)


def _comparison(iou_threshold: float, dtype: torch.dtype) -> tuple[float, bool]:
    """`_iou_above_words`'s ``(threshold, by_product)`` for boxes of `dtype`.

    float32: with c = `_float_below` of `iou_threshold` and m the midpoint between c and the next float32 up,
    the float32 quotient ``inter / union`` (``inter >= 0``, ``union >= 0``, rounded to nearest) is above c
    exactly when ``inter > m * union``: from m on the quotient rounds above c, and it is never m itself (m
    has 25 significant bits, odd; m times a float32 is not a float32). float64 holds m and m times any float32
    (at most 49 bits) exactly. float64 boxes: the quotient is compared with `iou_threshold` itself (float64
    division is correctly rounded on every backend).
    """
    if dtype != torch.float32:
        return iou_threshold, False
    below = np.float32(_float_below(iou_threshold, dtype))
    next_up = np.nextafter(below, np.float32(math.inf))
    return (float(below) + float(next_up)) / 2, True


@functools.cache
def _compiled_greedy_steps() -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
    """`_greedy_steps` through ``torch.compile`` (about two kernels per step instead of six), made once per
    process, with dynamic shapes."""
    return torch.compile(_greedy_steps, dynamic=True)


@functools.cache
def _compiled_iou_above_words() -> Callable[[Tensor, float, bool], Tensor]:
    """`_iou_above_words` through ``torch.compile``, made once per process, with floating-point contraction
    off: inductor's ``emulate_precision_casts`` compiles its Triton kernels with ``enable_fp_fusion=False``,
    and its C++ kernels are built with ``-ffp-contract=off`` (its default, pinned here where the setting
    exists). Shapes are dynamic: other group sizes and counts do not compile again (a group of at most 64
    boxes compiles once more)."""
    import torch._inductor.config as inductor_config

    options: dict[str, object] = {"emulate_precision_casts": True}
    if hasattr(inductor_config.cpp, "enable_floating_point_contract_flag"):
        options["cpp.enable_floating_point_contract_flag"] = "off"
    return torch.compile(_iou_above_words, dynamic=True, options=options)


def _iou_above_tiles(boxes: Tensor, valid: Tensor, iou_threshold: float) -> Iterator[tuple[slice, Tensor]]:
    """Who suppresses whom among G groups of M boxes, by tiles of columns: yields ``(columns, above)`` with
    `above` [G, len(columns), R] uint8, R = columns.stop rounded up to 64, 1 at [g, j, i] where box i is
    valid, comes before box j (i < j) and IoU(i, j) > `iou_threshold`, else 0. `above` is overwritten by the
    next tile.

    IoUs are torchvision's CPU ``nms`` kernel's, bit for bit: the same float operations in the same order
    (areas (x2 - x1) * (y2 - y1); inter = w * h, w and h clamped at 0; IoU = inter / ((area_i + area_j) -
    inter)) and the comparison in double precision (`_float_below`).
    """
    groups, count = valid.shape
    padded = round_up(count, 64)
    x1, y1, x2, y2 = _padded_coordinates(boxes, valid).unbind()
    areas = (x2 - x1) * (y2 - y1)
    threshold = _float_below(iou_threshold, boxes.dtype)
    budget = _TILE_ELEMENTS.get(boxes.device.type, _DEVICE_TILE_ELEMENTS)
    width = min(count, max(1, budget // (groups * padded)))
    # One workspace for all tiles, written with out=: fresh temporaries per operation cost more than the
    # arithmetic on the CPU (allocation and first-touch page faults).
    workspace = boxes.new_empty((3, groups * width * padded))
    above_workspace = valid.new_empty(groups * width * padded, dtype=torch.uint8)
    for start in range(0, count, width):
        columns = slice(start, min(count, start + width))
        rows = round_up(columns.stop, 64)
        shape = (groups, columns.stop - columns.start, rows)
        overlap_x, overlap_y, union = (buffer[: math.prod(shape)].view(shape) for buffer in workspace)
        row = [values[:, None, :rows] for values in (x1, y1, x2, y2, areas)]
        column = [values[:, columns, None] for values in (x1, y1, x2, y2, areas)]
        torch.minimum(row[2], column[2], out=overlap_x)
        overlap_x.sub_(torch.maximum(row[0], column[0], out=overlap_y)).clamp_(min=0)
        torch.minimum(row[3], column[3], out=overlap_y)
        overlap_y.sub_(torch.maximum(row[1], column[1], out=union))
        # Only the width is clamped: with a negative height and a positive width the IoU comes out
        # negative, which no threshold in [0, 1] exceeds, as torchvision's 0 does not.
        intersection = overlap_x.mul_(overlap_y)
        torch.add(row[4], column[4], out=union).sub_(intersection)
        above = torch.gt(
            intersection.div_(union), threshold, out=above_workspace[: math.prod(shape)].view(shape)
        )
        # From the tile's first column on, box i suppresses box j only when i < j (rows past the last
        # column, up to the multiple of 64, included).
        above[:, :, columns.start :].tril_(-1)
        yield columns, above


def _pack_bits(flags: Tensor, bit_values: Tensor) -> Tensor:
    """[..., 64 * W] flags (bool or 0/1 uint8) as [..., W] int64 words, with `_bit_values`: flag k is bit k % 8
    of byte k // 8 (the words' bytes in memory order, so the packings of the matrix rows and of the kept boxes
    agree on any machine)."""
    # bool times uint8 is uint8 (no view of the bools as bytes: inductor in torch 2.11 cannot lower that).
    as_bytes = flags.unflatten(-1, (-1, 8)) * bit_values
    return as_bytes.sum(dim=-1, dtype=torch.uint8).view(torch.int64)


def _bit_values(device: torch.device) -> Tensor:
    """1, 2, 4, ..., 128 as uint8, made on `device` (no copy from the host)."""
    return 2 ** torch.arange(8, dtype=torch.uint8, device=device)


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


def _nms_boxes(boxes: Tensor) -> Tensor:
    """Boxes in the dtype torchvision's nms computes IoUs in: float32 for half and bfloat16 (its autocast
    kernel casts them; without autocast it refuses them), else their own."""
    return boxes.float() if boxes.dtype in (torch.float16, torch.bfloat16) else boxes


def _float_below(value: float, dtype: torch.dtype) -> float:
    """The largest number of `dtype` not above `value`: for x of that dtype, x > value exactly when x is
    above it. torchvision's CPU nms compares its float IoU with the threshold in double; a tensor compared
    with a Python float would round the float to the tensor's dtype instead (0.3 rounds up in float32)."""
    if dtype != torch.float32:
        return value  # float64 holds `value` exactly
    nearest = np.float32(value)
    if float(nearest) <= value:
        return float(nearest)
    return float(np.nextafter(nearest, np.float32(-math.inf)))
