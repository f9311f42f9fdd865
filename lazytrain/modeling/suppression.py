"""Who suppresses whom in greedy NMS: for groups of boxes, the bit matrix of the pairs whose IoU is above the
threshold, bit for bit as torchvision's CPU ``nms`` kernel decides them (the same float32 operations in the same
order, compared with the threshold in double precision).

Two ways to the same bits: element-wise IoU tiles (`_iou_above_tiles`: small on the CPU, to stay in cache;
large on devices, where each tile costs a few kernel launches), or one ``torch.compile``d kernel per group
(`_iou_above_words`), which writes only the packed words and pays where memory traffic costs more than a
compile, on a GPU. The compiled kernel runs without floating-point contraction and compares exactly
(`_comparison`), so that the same pairs are decided on every device.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lazytrain.modeling.host_values import round_up

__all__ = ["byte_bit_values", "nms_boxes", "pack_bits", "suppression_bits"]

# Elements of one IoU tile (`_iou_above_tiles`): small enough on the CPU to stay in cache (the fastest size on one
# thread, docs/benchmarks.md), large on GPUs, where each tile costs a few kernel launches.
_TILE_ELEMENTS = {"cpu": 1 << 17}
_DEVICE_TILE_ELEMENTS = 1 << 24


def suppression_bits(
    boxes: Tensor, valid: Tensor, groups: list[slice], iou_threshold: float, *, compiled: bool = False
) -> Tensor:
    """[N, G, M, M / 64] int64: bit i of row j (as `pack_bits` packs flag i) is set when candidate i of the
    group suppresses candidate j (`_iou_above_tiles`, or `_iou_above_words` when `compiled`); M: the largest
    group's size rounded up to 64. Rows and bits past a group's size are 0."""
    size = round_up(max(group.stop - group.start for group in groups), 64)
    bits = valid.new_zeros((valid.shape[0], len(groups), size, size // 64), dtype=torch.int64)
    bit_values = byte_bit_values(bits.device)
    # The compiled words put flag k at bit k: `pack_bits`'s order on little-endian machines (all of torch's).
    compiled = compiled and sys.byteorder == "little"
    for index, group in enumerate(groups):
        group_boxes = nms_boxes(boxes[:, group])
        if compiled:
            coordinates = _padded_coordinates(group_boxes, valid[:, group])
            threshold, by_product = _comparison(iou_threshold, group_boxes.dtype)
            words = _compiled_iou_above_words()(coordinates, threshold, by_product)
            bits[:, index, : words.shape[1], : words.shape[2]] = words
            continue
        for columns, above in _iou_above_tiles(group_boxes, valid[:, group], iou_threshold):
            bits[:, index, columns, : above.shape[2] // 64] = pack_bits(above, bit_values)
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


def pack_bits(flags: Tensor, bit_values: Tensor) -> Tensor:
    """[..., 64 * W] flags (bool or 0/1 uint8) as [..., W] int64 words, with `byte_bit_values`: flag k is bit k % 8
    of byte k // 8 (the words' bytes in memory order, so the packings of the matrix rows and of the kept boxes
    agree on any machine)."""
    # bool times uint8 is uint8 (no view of the bools as bytes: inductor in torch 2.11 cannot lower that).
    as_bytes = flags.unflatten(-1, (-1, 8)) * bit_values
    return as_bytes.sum(dim=-1, dtype=torch.uint8).view(torch.int64)


def byte_bit_values(device: torch.device) -> Tensor:
    """1, 2, 4, ..., 128 as uint8, made on `device` (no copy from the host)."""
    return 2 ** torch.arange(8, dtype=torch.uint8, device=device)


def nms_boxes(boxes: Tensor) -> Tensor:
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
