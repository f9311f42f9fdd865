"""`RegionProposalNetwork`: torchvision's RPN, giving the same proposals, without making the host wait.

torchvision's RPN makes the host wait for the accelerator (a "host sync", `lazytrain.utils.host_syncs`) about
20 times per image and step: per image it removes small and low-scoring boxes with ``torch.where``, runs one
``nms`` per FPN level (``batched_nms``, which above 4,000 box coordinates on the CPU and 100,000 on CUDA also
loops over the levels with ``unique`` and ``where``), samples the training anchors with ``where`` and
``randperm``, and its box coder copies Python numbers to the device on every call. This subclass does the
same work for all images at once, on tensors whose sizes do not depend on the data:

- proposals (`filter_proposals`): clip with a per-image size tensor; small and low-scoring boxes are masked,
  not removed; greedy NMS for every (image, level) group at once, from a bit matrix of who suppresses whom
  (IoUs computed with the float32 operations of torchvision's CPU ``nms`` kernel, so the same boxes
  survive) and steps repeated until nothing changes (`_nms`); the host reads one small tensor (the number of
  proposals per image) to return torchvision's per-image lists;
- training (`compute_loss`): `BalancedMaskSampler` draws the anchors as masks, the losses are masked sums,
  and the matcher adds low-quality matches with a mask (`lazytrain.modeling.box_coding.Matcher`).

Where torchvision's results depend on how a sort orders equal scores, this module orders them by position
(level, then rank within the level), which is what torchvision's own ``nms`` does; see `filter_proposals`.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.rpn import RegionProposalNetwork as TorchvisionRegionProposalNetwork

from lazytrain.modeling.box_coding import BoxCoder, Matcher
from lazytrain.modeling.sampling import BalancedMaskSampler

__all__ = ["RegionProposalNetwork"]

# Greedy NMS is solved by repeated steps on a bit matrix of who suppresses whom (see `_nms`); NMS_STEPS run
# before the host looks at the result. Measured on the demo model (192 px, 600 candidates per level), trained
# and at random initialisation: settled within 11 steps.
NMS_STEPS = 16
# NMS decides only each level's first DECIDED_PER_RESULT * post_nms_top_n() valid candidates (by score): lower
# ones rarely reach the result, which a check confirms (else every candidate is decided, at the cost of a
# second host read). Needed on the demo model: up to 1.33 at random initialisation, 1.0 trained.
DECIDED_PER_RESULT = 1.5
# Elements of one IoU tile (`_iou_above_tiles`): small enough on the CPU to stay in cache (fastest at 2**17 on one
# thread, measured), large on GPUs, where each tile costs a few kernel launches.
_TILE_ELEMENTS = {"cpu": 1 << 17}
_DEVICE_TILE_ELEMENTS = 1 << 24


class RegionProposalNetwork(TorchvisionRegionProposalNetwork):
    """torchvision's `RegionProposalNetwork` (same arguments, attributes and state-dict keys), with proposal
    filtering, anchor sampling and losses that run on all images at once and sync the host once per call.

    In eval mode the proposals equal torchvision's box for box (see `filter_proposals` for the order of
    equal scores); in training the losses are torchvision's for the anchors drawn, but the anchors are drawn
    by `BalancedMaskSampler`, so not the ones torchvision would draw for the same seed. To sample differently,
    assign ``rpn.fg_bg_sampler`` a callable that maps labels [N, A] to ``(positive, negative)`` masks, [N, A]
    or per image (torchvision's `BalancedPositiveNegativeSampler` works, with its host syncs).
    Under tracing (model export), and by default on the CPU (``batched``), `filter_proposals` is torchvision's.

    Args:
        anchor_generator: anchors for the feature maps.
        head: objectness logits and box deltas per anchor (torchvision's `RPNHead`).
        fg_iou_thresh: IoU with a ground-truth box from which an anchor is positive.
        bg_iou_thresh: IoU below which an anchor is negative (in between: ignored).
        batch_size_per_image: anchors sampled per image for the losses.
        positive_fraction: the largest share of positives among them.
        pre_nms_top_n: ``{"training": k, "testing": k}``, proposals kept per level and image before NMS.
        post_nms_top_n: ``{"training": k, "testing": k}``, proposals kept per image after NMS.
        nms_thresh: IoU above which NMS removes the lower-scoring box, in [0, 1].
        score_thresh: proposals scoring below it (objectness probability) are dropped.
        batched: select proposals for all images at once with one host read (True), or with torchvision's
            per-image loop (False). None (the default): batched on any device but the CPU, where nothing waits
            for a device and the loop is faster (demo step with 2 threads: RPN forward 41 ms with the loop,
            62 ms batched; one thread: about equal).
    """

    def __init__(
        self,
        anchor_generator: AnchorGenerator,
        head: nn.Module,
        fg_iou_thresh: float,
        bg_iou_thresh: float,
        batch_size_per_image: int,
        positive_fraction: float,
        pre_nms_top_n: dict[str, int],
        post_nms_top_n: dict[str, int],
        nms_thresh: float,
        score_thresh: float = 0.0,
        *,
        batched: bool | None = None,
    ) -> None:
        if not 0.0 <= nms_thresh <= 1.0:
            raise ValueError(f"RegionProposalNetwork(nms_thresh=) must be in [0, 1]; got {nms_thresh}")
        super().__init__(
            anchor_generator, head, fg_iou_thresh, bg_iou_thresh, batch_size_per_image, positive_fraction,
            pre_nms_top_n, post_nms_top_n, nms_thresh, score_thresh,
        )  # fmt: skip
        self.box_coder = BoxCoder(weights=(1.0, 1.0, 1.0, 1.0))
        self.proposal_matcher = Matcher(fg_iou_thresh, bg_iou_thresh, allow_low_quality_matches=True)
        self.fg_bg_sampler = BalancedMaskSampler(batch_size_per_image, positive_fraction)
        self.batched = batched

    def filter_proposals(
        self,
        proposals: Tensor,
        objectness: Tensor,
        image_shapes: list[tuple[int, int]],
        num_anchors_per_level: list[int],
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Per image, the best ``post_nms_top_n()`` proposals after NMS, best first, as torchvision's.

        The steps are torchvision's (top ``pre_nms_top_n()`` per level and image, clip, drop boxes smaller
        than ``min_size`` or scoring below ``score_thresh``, NMS per level, best ``post_nms_top_n()``), and
        so are the results, with one difference: equal scores. Boxes of equal score are ordered by position
        (level, then rank in the level's top-k), as torchvision's ``nms`` orders them; torchvision's
        ``batched_nms`` re-sorts the survivors with an unstable sort when it loops over the levels (above
        4,000 coordinates per image on the CPU), so there the order of equal scores, and which of them make
        the ``post_nms_top_n()`` cut, may differ. On every device the IoUs and their comparison with
        ``nms_thresh`` are those of torchvision's CPU kernel; torchvision on CUDA offsets each level's
        coordinates by multiples of the largest one (``batched_nms``'s coordinate trick, below 100,000
        coordinates) and rounds differently in its CUDA kernel, so it may decide an IoU within float32
        rounding of ``nms_thresh`` the other way.

        Args:
            proposals: [N, A, 4] decoded boxes of every anchor.
            objectness: [N * A, 1] (or [N, A]) objectness logits.
            image_shapes: (height, width) of each image.
            num_anchors_per_level: anchors per image on each level, in the order of `proposals`.

        Returns:
            ``(boxes, scores)``: per image [K_i, 4] boxes and [K_i] objectness probabilities.
        """
        batched = self.batched if self.batched is not None else proposals.device.type != "cpu"
        if torch.jit.is_tracing() or not batched:
            return super().filter_proposals(proposals, objectness, image_shapes, num_anchors_per_level)
        candidates = self._candidates(proposals, objectness, image_shapes, num_anchors_per_level)
        limit = self.post_nms_top_n()
        keep, is_final = _nms(candidates, self.nms_thresh, limit, math.ceil(DECIDED_PER_RESULT * limit))
        counts = keep.sum(dim=1).clamp(max=limit)
        # The one host read: how many proposals each image returns, and whether NMS needs more work.
        *counts, is_final = torch.cat((counts, is_final.reshape(1))).tolist()
        if not is_final:
            keep, _ = _nms(candidates, self.nms_thresh, limit, decided=None)
            counts = keep.sum(dim=1).clamp(max=limit).tolist()
        return _best_kept(candidates, keep, counts, limit)

    def _candidates(
        self,
        proposals: Tensor,
        objectness: Tensor,
        image_shapes: list[tuple[int, int]],
        num_anchors_per_level: list[int],
    ) -> _Candidates:
        """Each level's top ``pre_nms_top_n()`` of each image, clipped, and which of them take part in NMS (the
        valid ones, first in each level)."""
        num_images = proposals.shape[0]
        objectness = objectness.detach().reshape(num_images, -1)
        top = self._get_top_n_idx(objectness, num_anchors_per_level)
        scores = objectness.gather(1, top).sigmoid()
        boxes = proposals.gather(1, top[..., None].expand(-1, -1, 4))
        # Built on the host and copied without blocking: torch.tensor(..., device=) would wait for the device.
        sizes = torch.tensor(image_shapes, dtype=boxes.dtype).to(boxes.device, non_blocking=True)
        boxes = _clip_to_images(boxes, sizes)
        widths, heights = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
        valid = (widths >= self.min_size) & (heights >= self.min_size) & (scores >= self.score_thresh)
        level_sizes = [min(self.pre_nms_top_n(), count) for count in num_anchors_per_level]
        return _valid_first(_Candidates(boxes, scores, valid, level_sizes))

    def compute_loss(
        self,
        objectness: Tensor,
        pred_bbox_deltas: Tensor,
        labels: list[Tensor],
        regression_targets: list[Tensor],
    ) -> tuple[Tensor, Tensor]:
        """torchvision's RPN losses over the anchors that ``fg_bg_sampler`` draws, as masked sums.

        ``loss_objectness``: binary cross-entropy with logits, averaged over the drawn anchors of the batch;
        ``loss_rpn_box_reg``: smooth L1 (beta 1/9) of the drawn positives, summed and divided by the number
        of drawn anchors of the batch. Equal to torchvision's `compute_loss` for the same drawn anchors up to
        the order of float additions.

        Args:
            objectness: [N * A, 1] objectness logits, images one after the other.
            pred_bbox_deltas: [N * A, 4] predicted box deltas.
            labels: per image [A]: 1 positive, 0 negative, -1 ignored.
            regression_targets: per image [A, 4] encoded ground-truth boxes.

        Returns:
            ``(loss_objectness, loss_rpn_box_reg)``.
        """
        labels = torch.stack(labels)
        positive, negative = (_batch_mask(drawn) for drawn in self.fg_bg_sampler(labels))
        positive, drawn = positive.flatten(), (positive | negative).flatten()
        num_drawn = drawn.sum()
        # masked_fill, not a product with the mask: an anchor outside the sample may hold inf (log 0 in the
        # regression target of an image without boxes), and inf * 0 is nan; masked, its gradient is 0.
        per_anchor = F.smooth_l1_loss(
            pred_bbox_deltas, torch.cat(regression_targets), beta=1 / 9, reduction="none"
        )
        box_loss = per_anchor.sum(dim=1).masked_fill(~positive, 0.0).sum() / num_drawn
        per_anchor = F.binary_cross_entropy_with_logits(
            objectness.flatten(), labels.flatten().clamp(min=0), reduction="none"
        )
        objectness_loss = per_anchor.masked_fill(~drawn, 0.0).sum() / num_drawn
        return objectness_loss, box_loss


def _batch_mask(drawn: Tensor | list[Tensor]) -> Tensor:
    """A sampler's mask as one bool tensor: `BalancedMaskSampler` gives [N, A], torchvision's sampler a list of
    per-image uint8 masks."""
    return (torch.stack(drawn) if isinstance(drawn, (list, tuple)) else drawn).bool()


class _Candidates(NamedTuple):
    """The NMS candidates of a batch, [N, K] per image: the levels' blocks one after the other, each block
    holding its valid candidates (`valid`: large enough, scoring at least ``score_thresh``) in decreasing score
    order (top-k's order), then its invalid ones."""

    boxes: Tensor
    scores: Tensor
    valid: Tensor
    level_sizes: list[int]


def _clip_to_images(boxes: Tensor, sizes: Tensor) -> Tensor:
    """[N, K, 4] boxes clipped to [0, width] x [0, height] of their image; `sizes` [N, 2] holds (height,
    width). torchvision's clip_boxes_to_image, with one size per image."""
    heights, widths = sizes[:, None, None, 0], sizes[:, None, None, 1]
    x = boxes[..., 0::2].clamp(min=0).minimum(widths)
    y = boxes[..., 1::2].clamp(min=0).minimum(heights)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def _valid_first(candidates: _Candidates) -> _Candidates:
    """The same candidates with each level's valid ones moved first, in their order. torchvision removes the
    invalid ones; here a level's first candidates, which `_nms` may decide alone, are then all valid."""
    boxes, scores, valid, level_sizes = candidates
    level = torch.cat(
        [torch.full((size,), index, device=valid.device) for index, size in enumerate(level_sizes)]
    )
    order = (level * 2 + ~valid).sort(dim=1, stable=True).indices
    boxes = boxes.gather(1, order[..., None].expand(-1, -1, 4))
    return _Candidates(boxes, scores.gather(1, order), valid.gather(1, order), level_sizes)


def _best_kept(
    candidates: _Candidates, keep: Tensor, counts: list[int], limit: int
) -> tuple[list[Tensor], list[Tensor]]:
    """Per image, its `counts` best kept candidates (at most `limit`), best first (equal scores by position)."""
    ranked = candidates.scores.masked_fill(~keep, -math.inf)
    order = ranked.sort(dim=1, descending=True, stable=True).indices[:, :limit]
    boxes = candidates.boxes.gather(1, order[..., None].expand(-1, -1, 4))
    scores = candidates.scores.gather(1, order)
    return [b[:count] for b, count in zip(boxes, counts)], [s[:count] for s, count in zip(scores, counts)]


def _nms(
    candidates: _Candidates, iou_threshold: float, limit: int, decided: int | None
) -> tuple[Tensor, Tensor]:
    """Greedy NMS within every (image, level) group at once, for each level's first `decided` candidates
    (all when None, then stepping, with a host read per `NMS_STEPS` steps, until the result is final).

    Greedy NMS keeps a box unless an earlier kept box of its group overlaps it by IoU above the threshold.
    That is a fixed point, keep = valid & ~(some earlier kept box suppresses it), with one solution, which
    the step keep <- valid & ~suppressed_by(keep) reaches from any start within M steps (after step t the
    first t boxes of each group are final) and then no longer changes. A box's fate depends only on earlier
    boxes, so deciding each level's first candidates is exact for them; an image's best `limit` kept boxes are
    final once at least `limit` kept boxes score above every valid undecided candidate.

    Returns:
        ``(keep, is_final)``: [N, K] survivors among the decided candidates, and a 0-dim bool: false when the
        steps have not settled or an undecided candidate might belong among an image's best `limit`.
    """
    levels = _level_slices(candidates.level_sizes, decided)
    is_decided = torch.zeros_like(candidates.valid)
    if not levels:
        return is_decided, is_decided.new_ones(())
    for level in levels:
        is_decided[:, level] = True
    suppression = _suppression_bits(candidates, levels, iou_threshold)
    valid = _stack_levels(candidates.valid, levels, suppression.shape[2])
    keep, settled = _greedy_steps(suppression, valid, valid)
    if decided is None:
        keep, settled = _settle(suppression, valid, keep, settled)
    keep = _unstack_levels(keep, levels, is_decided)
    return keep, settled & _is_complete(candidates, keep, is_decided, limit)


def _settle(suppression: Tensor, valid: Tensor, keep: Tensor, settled: Tensor) -> tuple[Tensor, Tensor]:
    """More `_greedy_steps` until they change nothing, reading that on the host after each round."""
    # M steps always settle (see `_nms`): at most M // NMS_STEPS more rounds.
    for _ in range(suppression.shape[2] // NMS_STEPS):
        if bool(settled):
            break
        keep, settled = _greedy_steps(suppression, valid, keep)
    assert bool(settled), "greedy NMS steps did not settle within the number of boxes"
    return keep, settled


def _is_complete(candidates: _Candidates, keep: Tensor, is_decided: Tensor, limit: int) -> Tensor:
    """0-dim bool: whether every image's best `limit` kept candidates are final, that is, at least `limit` kept
    candidates score above every valid undecided one (or there is no such one)."""
    undecided = candidates.scores.masked_fill(is_decided | ~candidates.valid, -math.inf)
    best_undecided = undecided.amax(dim=1, keepdim=True)
    enough = (keep & (candidates.scores > best_undecided)).sum(dim=1) >= limit
    return (enough | (best_undecided[:, 0] == -math.inf)).all()


def _greedy_steps(suppression: Tensor, valid: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """`NMS_STEPS` steps of keep <- valid & ~(a kept box suppresses it), on [N, L, M] boxes with the bit matrix
    of `_suppression_bits`; returns keep and a 0-dim bool: whether the last step changed nothing."""
    previous = keep
    bit_values = _bit_values(keep.device)
    for _ in range(NMS_STEPS):
        previous = keep
        suppressed = (suppression & _pack_bits(previous, bit_values)[:, :, None, :]).any(dim=-1)
        keep = valid & ~suppressed
    return keep, (keep == previous).all()


def _suppression_bits(candidates: _Candidates, levels: list[slice], iou_threshold: float) -> Tensor:
    """[N, L, M, M / 64] int64: bit i of row j (as `_pack_bits` packs flag i) is set when
    candidate i of the level suppresses candidate j (`_iou_above_tiles`); M: the largest level's size rounded
    up to 64. Rows and bits past a level's size are 0."""
    size = _round_up(max(level.stop - level.start for level in levels), 64)
    num_images = candidates.valid.shape[0]
    bits = candidates.valid.new_zeros((num_images, len(levels), size, size // 64), dtype=torch.int64)
    bit_values = _bit_values(bits.device)
    for index, level in enumerate(levels):
        boxes = _nms_boxes(candidates.boxes[:, level])
        for columns, above in _iou_above_tiles(boxes, candidates.valid[:, level], iou_threshold):
            bits[:, index, columns, : above.shape[2] // 64] = _pack_bits(above, bit_values)
    return bits


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
    padded = _round_up(count, 64)
    # nan coordinates for invalid boxes and the padding: their IoUs are nan, above no threshold.
    x1, y1, x2, y2 = (
        F.pad(boxes[..., index].masked_fill(~valid, math.nan), (0, padded - count), value=math.nan)
        for index in range(4)
    )
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
        rows = _round_up(columns.stop, 64)
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
    as_bytes = flags.view(torch.uint8).unflatten(-1, (-1, 8)) * bit_values
    return as_bytes.sum(dim=-1, dtype=torch.uint8).view(torch.int64)


def _bit_values(device: torch.device) -> Tensor:
    """1, 2, 4, ..., 128 as uint8, made on `device` (no copy from the host)."""
    return 2 ** torch.arange(8, dtype=torch.uint8, device=device)


def _level_slices(level_sizes: list[int], first: int | None = None) -> list[slice]:
    """Each non-empty level's candidates, or only its `first` ones."""
    starts = [0, *itertools.accumulate(level_sizes)]
    ends = (
        starts[1:] if first is None else [min(start + first, stop) for start, stop in zip(starts, starts[1:])]
    )
    return [slice(start, stop) for start, stop in zip(starts, ends) if stop > start]


def _stack_levels(values: Tensor, levels: list[slice], size: int) -> Tensor:
    """[N, K] values as [N, L, size], one row per level, padded with 0 (False)."""
    stacked = values.new_zeros((values.shape[0], len(levels), size))
    for index, level in enumerate(levels):
        stacked[:, index, : level.stop - level.start] = values[:, level]
    return stacked


def _unstack_levels(stacked: Tensor, levels: list[slice], like: Tensor) -> Tensor:
    """The inverse of `_stack_levels`, into a tensor shaped like `like` (0 outside the levels)."""
    values = torch.zeros_like(like)
    for index, level in enumerate(levels):
        values[:, level] = stacked[:, index, : level.stop - level.start]
    return values


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


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
    (nearest,) = struct.unpack("<f", struct.pack("<f", value))
    if nearest <= value:
        return nearest
    (bits,) = struct.unpack("<I", struct.pack("<f", nearest))
    # One float32 step towards zero (value > 0 here: 0 and negative values are exact or round down).
    (below,) = struct.unpack("<f", struct.pack("<I", bits - 1))
    return below
