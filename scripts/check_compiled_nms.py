"""Does compiled NMS decide like torchvision's CPU ``nms`` on this device? Boxes built to overlap at IoUs within
a few float32 steps of the threshold, where a rounding difference flips a decision.

    python scripts/check_compiled_nms.py                 # on CUDA
    python scripts/check_compiled_nms.py --device cpu    # the CPU's compiled C++ kernels (slower to compile)

For each threshold it counts the pairs (box i suppresses box j) on which each computation disagrees with
torchvision's CPU kernel, and the groups whose kept boxes differ:
- ``eager``: `lazytrain.modeling.suppression`'s IoU tiles (element-wise operations, one rounding each);
- ``compiled``: its compiled kernel (no floating-point contraction, the quotient compared exactly);
- ``compiled, plain``: the same IoU written plainly (``inter / union > c``) and compiled with inductor's
  defaults (contraction on, approximate division), to show what the exact form guards against;
- ``torchvision (device)``: torchvision's own ``nms`` kernel on the device.
Prints markdown.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torchvision.ops import nms

from lazytrain.modeling import suppression

THRESHOLDS = (0.5, 0.7, 0.3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--groups", type=int, default=64, help="groups of boxes (NMS runs within each)")
    parser.add_argument("--boxes", type=int, default=512, help="boxes per group")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_boxes(groups: int, count: int, threshold: float, generator: torch.Generator) -> torch.Tensor:
    """[groups, count, 4] float32 boxes: each group around a few anchors, every other box shifted from one
    so that their IoU is the threshold up to the rounding of the coordinates to float32."""
    size = 16 + 112 * torch.rand(groups, count, 2, generator=generator, dtype=torch.float64)
    corner = 64 * torch.rand(groups, count, 2, generator=generator, dtype=torch.float64)
    # Every odd box: its even neighbour's size and y, x shifted by d. Two boxes of width w shifted by d along x
    # have IoU (w - d) / (w + d); d = w (1 - t) / (1 + t) gives t.
    partner = torch.arange(count) - torch.arange(count) % 2
    size = size[:, partner]
    shift = size[..., 0] * (1 - threshold) / (1 + threshold)
    corner = torch.stack(
        [corner[:, partner, 0] + shift * (torch.arange(count) % 2), corner[:, partner, 1]], -1
    )
    return torch.cat([corner, corner + size], dim=-1).float()


def plain_iou_above_words(coordinates: torch.Tensor, threshold: float) -> torch.Tensor:
    """The IoU as written before the exact comparison: the quotient rounded, then compared."""
    x1, y1, x2, y2 = coordinates.unbind()
    areas = (x2 - x1) * (y2 - y1)
    width = (
        torch.minimum(x2[:, None, :], x2[:, :, None]) - torch.maximum(x1[:, None, :], x1[:, :, None])
    ).clamp(min=0)
    height = torch.minimum(y2[:, None, :], y2[:, :, None]) - torch.maximum(y1[:, None, :], y1[:, :, None])
    intersection = width * height
    union = (areas[:, None, :] + areas[:, :, None]) - intersection
    index = torch.arange(coordinates.shape[-1], device=coordinates.device)
    above = ((intersection / union) > threshold) & (index[None, :] < index[:, None])
    shifts = torch.arange(64, device=coordinates.device)
    return (above.long().unflatten(-1, (-1, 64)) << shifts).sum(dim=-1)


def suppression_words(boxes: torch.Tensor, threshold: float, how: str) -> torch.Tensor:
    """[G, M, M / 64] packed bits: who suppresses whom within each group, computed `how`."""
    valid = torch.ones(boxes.shape[:2], dtype=torch.bool, device=boxes.device)
    if how == "eager":
        groups = [slice(0, boxes.shape[1])]
        return torch.cat(
            [suppression.suppression_bits(b[None], valid[:1], groups, threshold)[0] for b in boxes]
        )
    coordinates = suppression._padded_coordinates(boxes, valid)
    if how == "compiled":
        bound, by_product = suppression._comparison(threshold, boxes.dtype)
        return suppression._compiled_iou_above_words()(coordinates, bound, by_product)
    plain = torch.compile(plain_iou_above_words, dynamic=True)
    return plain(coordinates, suppression._float_below(threshold, boxes.dtype))


def reference_words(boxes: torch.Tensor, threshold: float) -> tuple[torch.Tensor, int]:
    """Who suppresses whom by torchvision's CPU kernel's arithmetic (IoU in float32, compared in float64),
    computed pair by pair in float32 tensors on the CPU (element-wise: one rounding per operation), and how
    many pairs are within 4 float32 steps of the threshold."""
    cpu = boxes.cpu()
    x1, y1, x2, y2 = cpu.unbind(-1)
    areas = (x2 - x1) * (y2 - y1)
    width = (
        torch.minimum(x2[:, None, :], x2[:, :, None]) - torch.maximum(x1[:, None, :], x1[:, :, None])
    ).clamp(min=0)
    height = (
        torch.minimum(y2[:, None, :], y2[:, :, None]) - torch.maximum(y1[:, None, :], y1[:, :, None])
    ).clamp(min=0)
    intersection = width * height
    iou = intersection / ((areas[:, None, :] + areas[:, :, None]) - intersection)
    index = torch.arange(boxes.shape[1])
    earlier = index[None, :] < index[:, None]
    above = (iou.double() > threshold) & earlier
    step = float(np.spacing(np.float32(threshold)))
    near = int((((iou.double() - threshold).abs() <= 4 * step) & earlier).sum())
    shifts = torch.arange(64)
    return (above.long().unflatten(-1, (-1, 64)) << shifts).sum(dim=-1), near


def kept_by_words(words: torch.Tensor) -> list[list[int]]:
    """Greedy NMS in index order from packed bits (boxes are in decreasing score order)."""
    bits = (words.cpu()[..., None] >> torch.arange(64)) & 1
    suppresses = bits.flatten(-2).bool().numpy()  # [G, j, i]: i suppresses j
    kept_groups = []
    for matrix in suppresses:
        kept = np.zeros(matrix.shape[0], dtype=bool)
        for j in range(matrix.shape[0]):
            kept[j] = not (matrix[j] & kept).any()
        kept_groups.append(np.flatnonzero(kept).tolist())
    return kept_groups


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {name}, {args.groups} groups of {args.boxes} boxes per threshold\n")
    print(
        "| IoU threshold | computation | pairs (within 4 float32 steps of it) | pairs that differ from torchvision's CPU kernel | groups whose kept boxes differ | s |"
    )
    print("|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for threshold in THRESHOLDS:
        boxes = make_boxes(args.groups, args.boxes, threshold, generator)
        reference, near = reference_words(boxes, threshold)
        pairs = args.groups * args.boxes * (args.boxes - 1) // 2
        reference_kept = kept_by_words(reference)
        scores = torch.linspace(1, 0, args.boxes)
        cpu_kept = [sorted(nms(b, scores, threshold).tolist()) for b in boxes]
        if cpu_kept != reference_kept:
            raise RuntimeError("the reference bits do not give torchvision's CPU nms: fix reference_words")
        on_device = boxes.to(device)
        for how in ("eager", "compiled", "compiled, plain"):
            start = time.perf_counter()
            words = suppression_words(on_device, threshold, how).cpu()
            seconds = time.perf_counter() - start
            differ = int(((words ^ reference)[..., None] >> torch.arange(64) & 1).sum())
            kept_differ = sum(a != b for a, b in zip(kept_by_words(words), reference_kept))
            print(f"| {threshold} | {how} | {pairs} ({near}) | {differ} | {kept_differ} | {seconds:.1f} |")
            rows.append(
                {"threshold": threshold, "how": how, "near": near, "differ": differ, "kept": kept_differ}
            )
        device_kept = [sorted(nms(b, scores.to(device), threshold).tolist()) for b in on_device]
        kept_differ = sum(a != b for a, b in zip(device_kept, reference_kept))
        print(f"| {threshold} | torchvision (device) | {pairs} ({near}) | n/a | {kept_differ} | - |")
        rows.append(
            {"threshold": threshold, "how": "torchvision", "near": near, "differ": None, "kept": kept_differ}
        )
    return rows


if __name__ == "__main__":
    main()
