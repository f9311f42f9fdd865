"""Export a trained `RCNN` to TorchScript or ONNX, load the exported files, and check them against the model.

What belongs here: the single-image wrapper whose graph is exported (`ExportableRCNN`), the functions that
write (`export_torchscript`, `export_onnx`) and load (`load_torchscript`, `load_onnx`) exported files, and the
parity check between the eager model and an export (`check_parity`). The command line that builds the model
from a config and checkpoint lives with the programs, above this module.

An exported graph takes ONE image (batch 1): uint8 [3, H, W] RGB, already at the model's input size (the
config's test-time resize applied by the caller), any H and W. It returns ``boxes`` float32 [N, 4] XYXY in
that image's pixels, ``scores`` float32 [N], ``classes`` int64 [N] in 0..K-1 and, for Mask R-CNN, ``masks``
uint8 [N, H, W] 0/1. Mapping back to an original image size is the caller's job.

ONNX goes through torch's TorchScript-based exporter (``dynamo=False``), the path torchvision tests Mask
R-CNN with. torch's newer ``torch.export``-based exporter (``dynamo=True``) cannot export these models yet:
it stops at a data-dependent branch in torchvision's ``batched_nms`` (tried with torch 2.14.1 and
torchvision 0.29.1). torch marks TorchScript and the TorchScript-based exporter deprecated and says so in a
FutureWarning/DeprecationWarning at each export; they still work in the versions in `TESTED_VERSIONS`.
ONNX needs the ``export`` extra (``pip install "lazytrain[export]"``: onnx, onnxruntime).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor, nn
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.rcnn import RCNN

__all__ = [
    "ONNX_OPSET",
    "OUTPUT_NAMES",
    "TESTED_VERSIONS",
    "ExportableRCNN",
    "ParityReport",
    "check_parity",
    "export_onnx",
    "export_torchscript",
    "load_onnx",
    "load_torchscript",
]

logger = logging.getLogger(__name__)

ONNX_OPSET = 17
INPUT_NAME = "image"
# A box-only model (no mask head) returns the first three.
OUTPUT_NAMES = ("boxes", "scores", "classes", "masks")

# The oldest and newest versions the parity tests (tests/modeling/test_export.py) passed with, on CPU and
# Python 3.11: torch 2.11.0 + torchvision 0.26.0 with both onnx/onnxruntime pairs (numpy 1.26 with the old
# pair, which needs numpy < 2), torch 2.14.1 + torchvision 0.29.1 with the new pair.
TESTED_VERSIONS = {
    "torch": ("2.11.0", "2.14.1"),
    "torchvision": ("0.26.0", "0.29.1"),
    "onnx": ("1.16.2", "1.23.2"),
    "onnxruntime": ("1.18.1", "1.32.0"),
    "opset": ONNX_OPSET,
}

Detector = Callable[[Tensor], tuple[Tensor, ...]]
"""A callable taking one uint8 [3, H, W] image and returning (boxes, scores, classes[, masks])."""


def _check_image(image: object, owner: str) -> None:
    if not isinstance(image, Tensor) or image.dim() != 3 or image.shape[0] != 3 or image.dtype != torch.uint8:
        got = f"{image.dtype} {tuple(image.shape)}" if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(
            f"{owner} must be ONE uint8 [3, H, W] RGB image tensor (exports take batch 1); got {got}. "
            "Pass one image as the test mapper gives it (record['image']): uint8, channels first, no batch."
        )


class ExportableRCNN(nn.Module):
    """One image in, plain tensors out: the graph that `export_torchscript` and `export_onnx` write.

    ``forward(image)`` takes ONE uint8 [3, H, W] RGB image already at the model's input size (apply the
    config's test-time resize first; the model itself never resizes) and returns ``(boxes, scores, classes,
    masks)``: float32 [N, 4] XYXY boxes in that image's pixels, float32 [N] scores, int64 [N] classes in
    0..K-1 and uint8 [N, H, W] 0/1 masks thresholded at ``model.mask_threshold``. A model without a mask head
    returns the first three. The outputs are those of ``model([{"image": image}])`` (`RCNN.detect` followed by
    `RCNN.to_instances`, the path `RCNN.forward` takes), but with the mask paste size taken from the image's
    shape, so that a traced graph keeps H and W dynamic.

    The wrapper never changes the model's mode: it asks for a model already in eval mode and raises
    otherwise. It holds the model as a sub-module, so ``wrapper.train()`` would switch the model too, after
    which ``forward`` raises.

    Args:
        model: an `RCNN` in eval mode (``model.eval()``). Export from a CPU model for a file that runs
            anywhere: tracing records the device of the tensors it creates.
    """

    def __init__(self, model: RCNN) -> None:
        super().__init__()
        if not isinstance(model, RCNN):
            raise TypeError(
                f"ExportableRCNN(model=) must be a lazytrain.modeling.RCNN; got {type(model).__name__}. "
                "Wrap a torchvision detector with RCNN.from_torchvision(model)."
            )
        if model.training:
            raise ValueError(
                "ExportableRCNN(model=) needs the model in eval mode (exports run inference); got a model in "
                "training mode. Call model.eval() first."
            )
        self.model = model
        # A new module starts in training mode; torch.onnx.export restores the wrapper's mode after export
        # through train(mode), which reaches the model, so a training-mode wrapper would leave it training.
        self.train(False)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The names of `forward`'s outputs, also the ONNX output names."""
        return OUTPUT_NAMES if self.model.roi_heads.has_mask() else OUTPUT_NAMES[:3]

    def forward(self, image: Tensor) -> tuple[Tensor, ...]:
        # Python checks would be frozen into a trace as constants; the export functions check the example.
        if not torch.jit.is_tracing():
            _check_image(image, "ExportableRCNN.forward(image=)")
        (detection,) = self.model.detect([image.float()])
        # image.shape, not int(...): under tracing the paste size then follows the input's size.
        instances = self.model.to_instances(detection, (image.shape[-2], image.shape[-1]))
        return tuple(instances[name] for name in self.output_names)


def _import_optional(name: str, needed_by: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ImportError(
            f"lazytrain.modeling.export.{needed_by}() needs the '{name}' package, which is not installed. "
            'Install the export extra: pip install "lazytrain[export]"'
        ) from error


@contextlib.contextmanager
def _reviewed_export_warnings_ignored() -> Iterator[None]:
    """Silence the exporters' warnings that were reviewed as noise for these models; lazytrain's stay on."""
    with warnings.catch_warnings():
        # torchvision warns wherever a trace freezes a Python value. For RCNN each frozen value is a constant
        # of the model (normalisation mean/std, the FPN levels' scales, box-coder constants), a shape assert,
        # or the number of images, which exports fix to 1; tests/modeling/test_export.py checks the exports
        # on other image sizes and detection counts. (module "torch": torch._assert in roi_align's checks.)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torchvision\.")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch$")
        # torchvision's clip_boxes_to_image builds torch.tensor(size) from a traced size when tracing.
        warnings.filterwarnings("ignore", "To copy construct from a tensor", UserWarning, r"torchvision\.")
        # The ONNX exporter's notes: index tensors here come from where/topk/argsort and are never negative;
        # strided slices (clip_boxes_to_image's [..., 0::2]) are computed at run time instead of folded.
        warnings.filterwarnings("ignore", "Exporting aten::index operator", UserWarning, r"torch\.onnx\.")
        warnings.filterwarnings("ignore", "Constant folding - Only steps=1", UserWarning, r"torch\.onnx\.")
        yield


def _wrap_for_export(model: RCNN, example_image: Tensor, owner: str) -> tuple[ExportableRCNN, Tensor]:
    _check_image(example_image, f"{owner}(example_image=)")
    wrapper = ExportableRCNN(model)
    return wrapper, example_image.to(model.device)


def export_torchscript(model: RCNN, example_image: Tensor, file: str) -> str:
    """Trace `ExportableRCNN(model)` on one image and save it as TorchScript.

    The trace keeps the image size, the number of detections and the mask paste size dynamic (checked by
    tests/modeling/test_export.py on sizes other than the example's); it takes one image per call. Load it
    with `load_torchscript` (or ``torch.jit.load``) and check it with `check_parity`.

    Args:
        model: an `RCNN` in eval mode; export a CPU model for a file that loads anywhere.
        example_image: uint8 [3, H, W] RGB at the model's input size; any size works for later calls.
        file: where to write (conventionally ``model.ts``).

    Returns:
        `file`.
    """
    wrapper, example_image = _wrap_for_export(model, example_image, "export_torchscript")
    start = time.perf_counter()
    with torch.no_grad(), _reviewed_export_warnings_ignored():
        # check_trace=False: the check traces again on the same example, so it cannot see what can go wrong
        # here (other sizes and detection counts); `check_parity` on other images does.
        traced = torch.jit.trace(wrapper, (example_image,), check_trace=False)
    traced.save(file)
    logger.info("Exported TorchScript to %s in %.1f s", file, time.perf_counter() - start)
    return file


def export_onnx(model: RCNN, example_image: Tensor, file: str, *, opset: int = ONNX_OPSET) -> str:
    """Export `ExportableRCNN(model)` to ONNX with torch's TorchScript-based exporter (``dynamo=False``).

    Input ``image`` (uint8 [3, height, width]) has dynamic height and width; outputs ``boxes``, ``scores``,
    ``classes`` and ``masks`` (Mask R-CNN only) have a dynamic number of detections. One image per call.
    Needs the ``export`` extra (``pip install "lazytrain[export]"``).

    Args:
        model: an `RCNN` in eval mode; export a CPU model.
        example_image: uint8 [3, H, W] RGB at the model's input size; any size works for later calls.
        file: where to write (conventionally ``model.onnx``).
        opset: ONNX opset; tested with `ONNX_OPSET` (see `TESTED_VERSIONS`).

    Returns:
        `file`.
    """
    onnx = _import_optional("onnx", "export_onnx")
    wrapper, example_image = _wrap_for_export(model, example_image, "export_onnx")
    names = wrapper.output_names
    per_detection = {name: {0: "detections"} for name in names}
    dynamic_axes = {INPUT_NAME: {1: "height", 2: "width"}, **per_detection}
    if "masks" in names:
        dynamic_axes["masks"] = {0: "detections", 1: "height", 2: "width"}
    start = time.perf_counter()
    with torch.no_grad(), _reviewed_export_warnings_ignored():
        torch.onnx.export(
            wrapper, (example_image,), file, dynamo=False, opset_version=opset, input_names=[INPUT_NAME],
            output_names=list(names), dynamic_axes=dynamic_axes,
        )  # fmt: skip
    onnx.checker.check_model(file)
    logger.info("Exported ONNX (opset %d) to %s in %.1f s", opset, file, time.perf_counter() - start)
    return file


def load_torchscript(file: str) -> Detector:
    """Load a file written by `export_torchscript` onto the CPU, as a callable with `ExportableRCNN`'s inputs
    and outputs (run without autograd)."""
    module = torch.jit.load(file, map_location="cpu")

    def detect(image: Tensor) -> tuple[Tensor, ...]:
        with torch.no_grad():
            return tuple(module(image))

    return detect


def load_onnx(file: str) -> Detector:
    """Open a file written by `export_onnx` in an onnxruntime CPU session, as a callable with
    `ExportableRCNN`'s inputs and outputs (torch tensors). Needs the ``export`` extra."""
    onnxruntime = _import_optional("onnxruntime", "load_onnx")
    session = onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])

    def detect(image: Tensor) -> tuple[Tensor, ...]:
        outputs = session.run(None, {INPUT_NAME: image.detach().cpu().contiguous().numpy()})
        return tuple(torch.from_numpy(output) for output in outputs)

    return detect


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
    ``score_thresh`` or ``detections_per_img`` cutoff, or an overlap at NMS's ``nms_thresh`` (the traced
    graph runs torchvision's NMS on class-offset boxes, eager CPU inference runs it class by class, and the
    two round overlaps differently), and one such flip changes 2-4 detections (measured). At most
    `max_unmatched` of all detections (both outputs, all images), and always at least 6, may stay unmatched.

    The defaults leave margins of 7x or more over what exports of the demo and the R-50 models measured
    (docs/benchmarks.md, "Export parity tolerances") and still flag a difference far below a visible one.

    Args:
        reference: usually the eager `ExportableRCNN(model)`.
        exported: a loaded export (`load_torchscript`, `load_onnx`).
        images: uint8 [3, H, W] images at the model's input size; include sizes other than the example's.
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
    for index, image in enumerate(images):
        with torch.no_grad():
            expected, got = reference(image), exported(image)
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
# Unmatched detections always allowed: one threshold decision tipped by float noise and what it displaces
# (measured: 2 or 4), with room for a longer chain.
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
        "larger than those measured in check_parity's docstring)."
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
