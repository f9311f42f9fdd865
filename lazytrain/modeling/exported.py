"""Run what `lazytrain.modeling.export` wrote: each file loaded back as a `Detector` (``image, original_size`` in,
plain tensors out), and `ExportedModel`, a loaded file with the eager `RCNN`'s eval interface, which
`lazytrain.Predictor` runs in place of the model (`load_exported` picks the loader by the file's contents).

An exported file applies its own score threshold and detections per image (those it was exported with, which
the export command writes into ``model.json`` beside it: `read_built_in_limits`). `ExportedModel.limit`
applies a higher threshold and a smaller top-k after the file runs, so that predicting with a file honours
the same keys as predicting with the weights; a request the file cannot honour (a lower threshold, more
detections) is refused.
"""

from __future__ import annotations

import json
import logging
import math
import os
import zipfile
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lazytrain.modeling.export import OUTPUT_NAMES, get_image_size
from lazytrain.modeling.export_parity import Detector
from lazytrain.utils.optional_imports import import_optional

__all__ = [
    "DESCRIPTION_FILE",
    "FILE_KINDS",
    "DetectionLimits",
    "ExportedModel",
    "get_file_kind",
    "load_aoti",
    "load_exported",
    "load_onnx",
    "load_program",
    "load_torchscript",
    "read_built_in_limits",
    "check_limits",
]

logger = logging.getLogger(__name__)

DESCRIPTION_FILE = "model.json"
"""Written by ``python -m lazytrain export`` beside the files it exports: what they take, return and apply."""

FILE_KINDS = {
    "program": "a torch.export ExportedProgram",
    "aoti": "an AOTInductor package",
    "onnx": "an ONNX model",
    "torchscript": "a legacy TorchScript file, which answers in the input image's pixels only",
    "checkpoint": "a PyTorch checkpoint (weights saved by torch.save), not an exported model",
    "unknown": "neither an ONNX file (.onnx) nor a .pt2 archive",
}
"""What `get_file_kind` finds, in words for messages."""


def _as_detector(run: Any) -> Detector:
    def detect(image: Tensor, original_size: Tensor | None = None) -> tuple[Tensor, ...]:
        size = get_image_size(image) if original_size is None else original_size
        with torch.no_grad():
            return tuple(run(image, size))

    return detect


def load_program(file: str) -> Detector:
    """A file written by `save_program` as a `Detector` (``image, original_size`` in, tensors out)."""
    return _as_detector(torch.export.load(file).module())


def load_onnx(file: str) -> Detector:
    """Open a file written by `export_onnx` in an onnxruntime CPU session, as a `Detector` (torch tensors in
    and out). Needs the ``export`` extra."""
    onnxruntime = import_optional(
        "onnxruntime", component="lazytrain.modeling.exported.load_onnx()", extra="export"
    )
    session = onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])

    def run(image: Tensor, original_size: Tensor) -> tuple[Tensor, ...]:
        feed = {
            "image": image.detach().cpu().contiguous().numpy(),
            "original_size": original_size.cpu().numpy(),
        }
        return tuple(torch.from_numpy(output) for output in session.run(None, feed))

    return _as_detector(run)


def load_aoti(file: str) -> Detector:
    """A package written by `export_aoti` as a `Detector`."""
    return _as_detector(torch._inductor.aoti_load_package(file))


def load_torchscript(file: str) -> Detector:
    """Load a file written by `export_torchscript` onto the CPU as a `Detector`. The trace answers in the
    input image's pixels; an ``original_size`` other than the image's own is refused."""
    module = torch.jit.load(file, map_location="cpu")

    def run(image: Tensor, original_size: Tensor) -> tuple[Tensor, ...]:
        if original_size.tolist() != list(image.shape[-2:]):
            raise ValueError(
                f"load_torchscript: a TorchScript export gives detections in the input image's pixels "
                f"{list(image.shape[-2:])}; got original_size={original_size.tolist()}. Scale them yourself, "
                "or export with torch.export (export_program), which takes original_size."
            )
        return module(image)

    return _as_detector(run)


@dataclass(frozen=True)
class DetectionLimits:
    """Which detections are kept: those scoring above `score_thresh`, at most `detections_per_img` per image
    (the best). The keys of the same names of `RoIHeads` (``model.roi_heads.*``)."""

    score_thresh: float
    detections_per_img: int


def read_built_in_limits(file: str) -> DetectionLimits | None:
    """The limits `file` applies itself, as ``model.json`` beside it records them (``applied_in_the_file``);
    None when there is no such record (a file moved without its ``model.json``)."""
    path = os.path.join(os.path.dirname(os.path.abspath(file)), DESCRIPTION_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        applied = json.load(f).get("applied_in_the_file")
    if not applied:
        return None
    return DetectionLimits(float(applied["score_thresh"]), int(applied["detections_per_img"]))


class ExportedModel(nn.Module):
    """A loaded export (`Detector`) with the eager `RCNN`'s eval interface: a list of mapper dicts (``image``
    at the model's input size, ``height``/``width`` of the original image) in, ``[{"instances": {...}}]`` in
    the original size out. `lazytrain.Predictor` runs it in place of the model (`load_exported` builds one).

    The file's detections are returned as they come unless `limit` asks for fewer.

    Args:
        detector: from `load_program`, `load_aoti` or `load_onnx`.
        source: the file it was loaded from, for messages.
        built_in: the limits the file applies itself (`read_built_in_limits`); None when unknown, in which case
            `limit` cannot check that a request is within them.
    """

    def __init__(
        self, detector: Detector, source: str = "", *, built_in: DetectionLimits | None = None
    ) -> None:
        super().__init__()
        self.detector = detector
        self.source = source
        self.built_in = built_in
        self.limits: DetectionLimits | None = None

    def limit(self, score_thresh: float, detections_per_img: int) -> None:
        """Keep only the detections scoring above `score_thresh`, at most the best `detections_per_img` per
        image: what the eager model gives with these ``model.roi_heads`` keys, when the file was exported at
        a threshold no higher and with at least as many detections (`built_in`).

        Raises:
            ValueError: a value out of range, or one the file cannot honour (naming the key and the fix).
        """
        self.limits = check_limits(self.source, self.built_in, score_thresh, detections_per_img)

    def forward(self, batched_inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = []
        for record in batched_inputs:
            image = record["image"].cpu()
            height = int(record.get("height", image.shape[-2]))
            width = int(record.get("width", image.shape[-1]))
            outputs = self.detector(image, torch.tensor([height, width]))
            # A box-only model's export returns the first three.
            instances = dict(zip(OUTPUT_NAMES, outputs))
            if self.limits is not None:
                instances = _select(instances, self.limits)
            results.append({"instances": instances})
        return results

    def extra_repr(self) -> str:
        return f"source={self.source!r}, built_in={self.built_in}, limits={self.limits}"


def check_limits(
    source: str, built_in: DetectionLimits | None, score_thresh: float, detections_per_img: int
) -> DetectionLimits:
    """The limits `ExportedModel.limit` would keep for the file `source` that applies `built_in` itself (None:
    unknown); needs no loaded model, so a request is refused before the file is read.

    Raises:
        ValueError: a value out of range, or one the file cannot honour (naming the key and the fix).
    """
    if not (_is_real(score_thresh) and 0 <= score_thresh <= 1):
        raise ValueError(
            f"ExportedModel.limit(score_thresh=) must be in [0, 1] (model.roi_heads.score_thresh); got "
            f"{score_thresh!r}"
        )
    if not (_is_real(detections_per_img) and detections_per_img == int(detections_per_img) >= 1):
        raise ValueError(
            f"ExportedModel.limit(detections_per_img=) must be an int >= 1 "
            f"(model.roi_heads.detections_per_img); got {detections_per_img!r}"
        )
    _check_within(source, built_in, score_thresh, int(detections_per_img))
    return DetectionLimits(float(score_thresh), int(detections_per_img))


def _check_within(source: str, built_in: DetectionLimits | None, score_thresh: float, count: int) -> None:
    """Refuse a request below the file's threshold or above its top-k: the file has dropped those detections."""
    if built_in is None:
        return
    where = f"{os.path.basename(source) or 'the exported file'} ({DESCRIPTION_FILE} beside it)"
    if score_thresh < built_in.score_thresh:
        raise ValueError(
            f"model.roi_heads.score_thresh={score_thresh:g} is below the threshold {built_in.score_thresh:g} "
            f"that {where} applies itself: its lower-scoring detections are gone. Give "
            f"model.roi_heads.score_thresh >= {built_in.score_thresh:g}, or export again with "
            f"model.roi_heads.score_thresh={score_thresh:g}."
        )
    if count > built_in.detections_per_img:
        raise ValueError(
            f"model.roi_heads.detections_per_img={count} is more than the {built_in.detections_per_img} "
            f"detections per image that {where} keeps. Give model.roi_heads.detections_per_img <= "
            f"{built_in.detections_per_img}, or export again with model.roi_heads.detections_per_img={count}."
        )


def _select(instances: dict[str, Tensor], limits: DetectionLimits) -> dict[str, Tensor]:
    """The detections above the threshold, the best first, at most the top-k (as `RoIHeads` selects them)."""
    scores = instances["scores"]
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[scores[order] > limits.score_thresh][: limits.detections_per_img]
    return {name: value[order] for name, value in instances.items()}


def get_file_kind(file: str) -> str:
    """What `file` holds, from its contents (and the ``.onnx`` suffix, as ONNX has no signature to read): a key
    of `FILE_KINDS`."""
    if zipfile.is_zipfile(file):
        with zipfile.ZipFile(file) as archive:
            names = archive.namelist()
        if any("/aotinductor/" in name for name in names):
            return "aoti"
        if any(name.endswith("/archive_format") for name in names):
            return "program"
        if any(name.endswith("/constants.pkl") for name in names):
            return "torchscript"
        return "checkpoint" if any(name.endswith("/data.pkl") for name in names) else "unknown"
    if file.endswith(".onnx"):
        return "onnx"
    with open(file, "rb") as f:
        start = f.read(2)
    # torch.save's legacy (non-zip) format opens with a pickle's protocol mark.
    return "checkpoint" if start == b"\x80\x02" else "unknown"


_LOADERS = {"program": load_program, "aoti": load_aoti, "onnx": load_onnx}


def load_exported(file: str) -> ExportedModel:
    """An ExportedProgram (``model.pt2``), an AOTInductor package (``model_aoti.pt2``) or an ONNX file
    (``model.onnx``) as an `ExportedModel`, chosen by the file's contents, with the limits its ``model.json``
    records (`read_built_in_limits`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file of another kind (a checkpoint, TorchScript), or one that does not load; one line.
    """
    if not os.path.isfile(file):
        raise FileNotFoundError(
            f"load_exported: {file} not found; give a file written by the export command."
        )
    kind = get_file_kind(file)
    if kind not in _LOADERS:
        raise ValueError(
            f"load_exported: {file} is {FILE_KINDS[kind]}; give model.pt2, model_aoti.pt2 or model.onnx as "
            "written by `python -m lazytrain export`."
        )
    try:
        detector = _LOADERS[kind](file)
    except ModuleNotFoundError:
        raise
    except Exception as error:  # a damaged file: the loaders' own errors run to many lines
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"load_exported: {file} looks like {FILE_KINDS[kind]} but does not load ({type(error).__name__}: "
            f"{reason}); export it again with `python -m lazytrain export`."
        ) from error
    return ExportedModel(detector, file, built_in=read_built_in_limits(file))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
