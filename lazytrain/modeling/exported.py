"""Run what `lazytrain.modeling.export` wrote: each file loaded back as a `Detector` (``image, original_size`` in,
plain tensors out), and `ExportedModel`, a loaded file with the eager `RCNN`'s eval interface, which
`lazytrain.Predictor` runs in place of the model (`load_exported` picks the loader by the file's contents).
"""

from __future__ import annotations

import importlib
import os
import zipfile
from typing import Any

import torch
from torch import Tensor, nn

from lazytrain.modeling.export import OUTPUT_NAMES
from lazytrain.modeling.export_parity import Detector

__all__ = ["ExportedModel", "load_aoti", "load_exported", "load_onnx", "load_program", "load_torchscript"]


def _image_size(image: Tensor) -> Tensor:
    return torch.tensor([image.shape[-2], image.shape[-1]], dtype=torch.int64)


def _as_detector(run: Any) -> Detector:
    def detect(image: Tensor, original_size: Tensor | None = None) -> tuple[Tensor, ...]:
        size = _image_size(image) if original_size is None else original_size
        with torch.no_grad():
            return tuple(run(image, size))

    return detect


def load_program(file: str) -> Detector:
    """A file written by `save_program` as a `Detector` (``image, original_size`` in, tensors out)."""
    return _as_detector(torch.export.load(file).module())


def load_onnx(file: str) -> Detector:
    """Open a file written by `export_onnx` in an onnxruntime CPU session, as a `Detector` (torch tensors in
    and out). Needs the ``export`` extra."""
    try:
        onnxruntime = importlib.import_module("onnxruntime")
    except ImportError as error:
        raise ImportError(
            "lazytrain.modeling.exported.load_onnx() needs the 'onnxruntime' package, which is not installed. "
            'Install the export extra: pip install "lazytrain[export]"'
        ) from error
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


class ExportedModel(nn.Module):
    """A loaded export (`Detector`) with the eager `RCNN`'s eval interface: a list of mapper dicts (``image``
    at the model's input size, ``height``/``width`` of the original image) in, ``[{"instances": {...}}]`` in
    the original size out. `lazytrain.Predictor` runs it in place of the model (`load_exported` builds one).

    Args:
        detector: from `load_program`, `load_aoti` or `load_onnx`.
        source: the file it was loaded from, for messages.
    """

    def __init__(self, detector: Detector, source: str = "") -> None:
        super().__init__()
        self.detector = detector
        self.source = source

    def forward(self, batched_inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = []
        for record in batched_inputs:
            image = record["image"].cpu()
            height = int(record.get("height", image.shape[-2]))
            width = int(record.get("width", image.shape[-1]))
            outputs = self.detector(image, torch.tensor([height, width]))
            # A box-only model's export returns the first three.
            results.append({"instances": dict(zip(OUTPUT_NAMES, outputs))})
        return results

    def extra_repr(self) -> str:
        return f"source={self.source!r}"


def load_exported(file: str) -> ExportedModel:
    """An ExportedProgram (``model.pt2``), an AOTInductor package (``model_aoti.pt2``) or an ONNX file
    (``model.onnx``) as an `ExportedModel`, chosen by the file's contents."""
    if not os.path.isfile(file):
        raise FileNotFoundError(
            f"load_exported: {file} not found; give a file written by the export command."
        )
    if file.endswith(".onnx"):
        return ExportedModel(load_onnx(file), file)
    if not zipfile.is_zipfile(file):
        raise ValueError(
            f"load_exported: {file} is neither an ONNX file (.onnx) nor a .pt2 archive; give model.pt2, "
            "model_aoti.pt2 or model.onnx as written by `python -m lazytrain export`."
        )
    with zipfile.ZipFile(file) as archive:
        is_aoti = any("/aotinductor/" in name for name in archive.namelist())
    return ExportedModel(load_aoti(file) if is_aoti else load_program(file), file)
