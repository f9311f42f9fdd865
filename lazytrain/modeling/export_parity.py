"""Check an exported detector against the eager model: `check_parity` and the `ParityReport` it returns.

Used by ``python -m lazytrain export`` right after each file is written, and by tests. Both sides are
`Detector` callables (`lazytrain.modeling.export`): one image and the size to give detections in, plain
tensors out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torchvision.ops import boxes as box_ops

__all__ = ["Detector", "ParityReport", "check_parity"]

Detector = Callable[[Tensor, Tensor], tuple[Tensor, ...]]
"""A callable taking one uint8 [3, H, W] image and its ``original_size`` (int64 [2]: height, width) and
returning (boxes, scores, classes[, masks]) in the pixels of ``original_size``."""


@dataclass(frozen=True)
class ParityReport:
    """What `check_parity` measured over all images: the largest box and score differences and the lowest
    mask agreement (None for box-only models) of the matched detections, and how many detections (of both
    outputs) found no match. ``str(report)`` is a one-line summary."""

    num_images: int
    num_detections: int
    max_box_diff: float
    max_score_diff: float
    min_mask_agreement: float | None
    num_unmatched: int = 0

    def __str__(self) -> str:
        masks = "" if self.min_mask_agreement is None else f", masks agree on {self.min_mask_agreement:.4%}"
        unmatched = f", {self.num_unmatched} unmatched (ties)" if self.num_unmatched else ""
        return (
            f"parity on {self.num_images} images ({self.num_detections} detections): boxes within "
            f"{self.max_box_diff:.2g} px, scores within {self.max_score_diff:.2g}{masks}{unmatched}"
        )


def check_parity(
    reference: Detector,
    exported: Detector,
    images: Sequence[Tensor],
    original_sizes: Sequence[tuple[int, int]] | None = None,
    *,
    box_atol: float = 0.05,
    score_atol: float = 5e-4,
    mask_agreement: float = 0.99,
    max_unmatched: float = 0.01,
) -> ParityReport:
    """Run both detectors on each image and check that the export reproduces the reference.

    Detections are matched, not compared by rank, since near-equal scores can swap places. Each reference
    detection, best first, pairs with the export's detection of the same class whose box overlaps it most
    (IoU above 0.5, which NMS leaves between no two detections of one class); a pair matches when boxes and
    scores agree within `box_atol` and `score_atol`, and matched masks must agree on `mask_agreement` of
    their pixels (counted within the union of the two masks, so that the background cannot hide a
    difference; a probability at the threshold can round either way).

    A few detections may stay unmatched: float noise can tip a decision at a threshold, a score at the
    ``score_thresh`` or ``detections_per_img`` cutoff, or an overlap at NMS's ``nms_thresh`` (exports run
    torchvision's NMS on class-offset boxes, eager CPU inference runs it class by class, and the two round
    overlaps differently), and one such flip changes a few detections. At most `max_unmatched` of all
    detections (both outputs, all images), and always at least 6, may stay unmatched.

    The defaults leave wide margins over what exports of the demo and the R-50 models measured
    (docs/benchmarks.md, "Export parity tolerances") and still flag a difference far below a visible one.

    Args:
        reference: usually the eager `ExportableRCNN(model)`.
        exported: a loaded export (`load_program`, `load_onnx`, `load_aoti`, `load_torchscript`).
        images: uint8 [3, H, W] images at the model's input size; include sizes other than the example's.
        original_sizes: (height, width) to give each image's detections in; default: the image's own size.
        box_atol: largest box coordinate difference of a match, in pixels.
        score_atol: largest score difference of a match.
        mask_agreement: smallest share of agreeing pixels of the matched masks, per image.
        max_unmatched: largest share of detections left unmatched, over all images.

    Returns:
        The measured maxima.

    Raises:
        ValueError: naming the image index and the quantity out of tolerance.
    """
    _check_tolerances(box_atol, score_atol, mask_agreement, max_unmatched)
    measures = []
    for index, (image, size) in enumerate(zip(images, _size_tensors(images, original_sizes))):
        with torch.no_grad():
            expected, got = reference(image, size), exported(image, size)
        measures.append(_compare_image(index, expected, got, box_atol, score_atol, mask_agreement))
    _check_unmatched(measures, max_unmatched, f"box_atol={box_atol:g} and score_atol={score_atol:g}")
    agreements = [m.mask_agreement for m in measures if m.mask_agreement is not None]
    return ParityReport(
        num_images=len(measures), num_detections=sum(m.num_detections for m in measures),
        max_box_diff=max((m.box_diff for m in measures), default=0.0),
        max_score_diff=max((m.score_diff for m in measures), default=0.0),
        min_mask_agreement=min(agreements, default=None),
        num_unmatched=sum(m.num_unmatched for m in measures),
    )  # fmt: skip


def _size_tensors(images: Sequence[Tensor], sizes: Sequence[tuple[int, int]] | None) -> list[Tensor]:
    """Each image's ``original_size`` as an int64 [2] tensor: `sizes`, or the images' own sizes."""
    if sizes is None:
        sizes = [(image.shape[-2], image.shape[-1]) for image in images]
    if len(sizes) != len(images):
        raise ValueError(
            f"check_parity: {len(images)} images but {len(sizes)} original_sizes; give one (height, width) "
            "per image, or none for the images' own sizes"
        )
    return [torch.tensor(size, dtype=torch.int64) for size in sizes]


def _check_tolerances(
    box_atol: float, score_atol: float, mask_agreement: float, max_unmatched: float
) -> None:
    for name, value in (("box_atol", box_atol), ("score_atol", score_atol)):
        if not value >= 0:
            raise ValueError(f"check_parity({name}=) must be >= 0; got {value!r}")
    for name, value in (("mask_agreement", mask_agreement), ("max_unmatched", max_unmatched)):
        if not 0 <= value <= 1:
            raise ValueError(f"check_parity({name}=) must be a share in [0, 1]; got {value!r}")


_MISMATCH_FIX = (
    "The export does not compute what the model computes: check that it was exported from this model (same "
    "weights, score_thresh and mask head) with the versions in lazytrain.modeling.export.TESTED_VERSIONS."
)
# Boxes of one class that overlap more than this are the same detection: NMS (torchvision's default IoU 0.5)
# leaves no two such boxes in one output, and float noise moves a box by far less.
_PAIRING_IOU = 0.5
# Unmatched detections always allowed: one threshold decision tipped by float noise and the few detections it
# displaces (docs/benchmarks.md, "Export parity tolerances"), with room for a longer chain.
_MIN_ALLOWED_UNMATCHED = 6


@dataclass(frozen=True)
class _ImageMeasure:
    num_detections: int  # the reference's
    num_compared: int  # both outputs'
    box_diff: float
    score_diff: float
    mask_agreement: float | None
    num_unmatched: int
    first_problem: str | None


def _compare_image(
    index: int,
    expected: Sequence[Tensor],
    got: Sequence[Tensor],
    box_atol: float,
    score_atol: float,
    mask_agreement: float,
) -> _ImageMeasure:
    _check_same_outputs(index, expected, got)
    expected, got = [t.detach().cpu() for t in expected], [t.detach().cpu() for t in got]
    rows, columns = _pair_detections(expected[0], expected[2], got[0], got[2])
    box_diffs = (expected[0][rows].float() - got[0][columns].float()).abs().amax(-1)
    score_diffs = (expected[1][rows].float() - got[1][columns].float()).abs()
    within = (box_diffs <= box_atol) & (score_diffs <= score_atol)
    problem = _describe_first_problem(expected, got, rows, columns, box_diffs, score_diffs, within)
    rows, columns = rows[within], columns[within]
    masks = None
    if len(expected) > 3:
        masks = _check_masks(index, expected[3][rows], got[3][columns], mask_agreement)
    return _ImageMeasure(
        num_detections=len(expected[0]), num_compared=len(expected[0]) + len(got[0]),
        box_diff=_largest(box_diffs[within]), score_diff=_largest(score_diffs[within]), mask_agreement=masks,
        num_unmatched=len(expected[0]) + len(got[0]) - 2 * len(rows),
        first_problem=None if problem is None else f"image {index}: {problem}",
    )  # fmt: skip


def _largest(values: Tensor) -> float:
    return float(values.max()) if values.numel() else 0.0


def _check_same_outputs(index: int, expected: Sequence[Tensor], got: Sequence[Tensor]) -> None:
    if len(expected) != len(got):
        raise ValueError(
            f"check_parity: image {index}: the reference returns {len(expected)} outputs, the export "
            f"{len(got)} (masks are the 4th, for Mask R-CNN only). {_MISMATCH_FIX}"
        )
    if len(expected) > 3 and expected[3].shape[1:] != got[3].shape[1:]:
        raise ValueError(
            f"check_parity: image {index}: masks are {tuple(expected[3].shape[1:])} pixels in the reference, "
            f"{tuple(got[3].shape[1:])} in the export (both should be the input image's size). "
            f"{_MISMATCH_FIX}"
        )


def _pair_detections(
    boxes: Tensor, classes: Tensor, other_boxes: Tensor, other_classes: Tensor
) -> tuple[Tensor, Tensor]:
    """Indices into both sides of the paired detections: each detection of the first side in turn (best
    first) takes the other side's not yet paired detection of its class whose box overlaps it most, if their
    IoU exceeds `_PAIRING_IOU`."""
    overlap = box_ops.box_iou(boxes.float(), other_boxes.float())
    overlap[classes[:, None] != other_classes[None]] = 0.0
    pairs = []
    for row, overlaps in enumerate(overlap):
        column = int(overlaps.argmax()) if len(overlaps) else 0
        if len(overlaps) and overlaps[column] > _PAIRING_IOU:
            pairs.append((row, column))
            overlap[:, column] = 0.0
    rows, columns = zip(*pairs) if pairs else ((), ())
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(columns, dtype=torch.int64)


def _describe_first_problem(
    expected: Sequence[Tensor],
    got: Sequence[Tensor],
    rows: Tensor,
    columns: Tensor,
    box_diffs: Tensor,
    score_diffs: Tensor,
    within: Tensor,
) -> str | None:
    """The first reference detection (by rank) that has no match, and why; else the first export one."""
    paired = torch.full((len(expected[0]),), -1, dtype=torch.int64)
    paired[rows] = torch.arange(len(rows))
    for detection, pair in enumerate(paired.tolist()):
        score, label = float(expected[1][detection]), int(expected[2][detection])
        what = f"detection {detection} (class {label}, score {score:.4g})"
        if pair < 0:
            return f"{what} has no detection of its class overlapping it in the export"
        if not within[pair]:
            return (
                f"{what}: boxes differ by {float(box_diffs[pair]):.3g} px and scores by "
                f"{float(score_diffs[pair]):.3g} from the export's detection {int(columns[pair])}"
            )
    unpaired = sorted(set(range(len(got[0]))) - set(columns.tolist()))
    if unpaired:
        label = int(got[2][unpaired[0]])
        return (
            f"the export's detection {unpaired[0]} (class {label}) has no detection of "
            "its class overlapping it"
        )
    return None


def _check_unmatched(measures: Sequence[_ImageMeasure], max_unmatched: float, tolerances: str) -> None:
    unmatched = sum(m.num_unmatched for m in measures)
    total = sum(m.num_compared for m in measures)
    if unmatched <= max(_MIN_ALLOWED_UNMATCHED, max_unmatched * total):
        return
    first = next(m.first_problem for m in measures if m.first_problem is not None)
    raise ValueError(
        f"check_parity: {unmatched} detections of {total} (both outputs) have no match within {tolerances}, "
        f"more than max_unmatched={max_unmatched:g} (and {_MIN_ALLOWED_UNMATCHED}) allow. First, {first}. "
        f"{_MISMATCH_FIX} Raise the tolerances only if the differences are float rounding (e.g. a model much "
        "larger than those docs/benchmarks.md measured for check_parity's defaults)."
    )


def _check_masks(index: int, expected: Tensor, got: Tensor, limit: float) -> float:
    """The share of pixels on which the matched masks agree, within their union, checked against `limit`."""
    expected, got = expected.bool(), got.bool()
    union = int((expected | got).sum())
    agreement = 1.0 - int((expected ^ got).sum()) / union if union else 1.0
    if agreement < limit:
        raise ValueError(
            f"check_parity: image {index}: masks agree on {agreement:.4%} of their pixels, less than "
            f"mask_agreement={limit:g}. {_MISMATCH_FIX} Lower mask_agreement= only if this is float rounding."
        )
    return agreement
