"""Export a trained `RCNN` with ``torch.export`` and write it as an ExportedProgram, ONNX or an AOTInductor
package (`lazytrain.modeling.exported` loads each back, `lazytrain.modeling.export_parity` checks it).

What belongs here: the graph that is exported (`ExportableRCNN`) and the writers (`export_program`,
`save_program`, `export_onnx`, `export_aoti`; `export_torchscript`, legacy). The loaders and `ExportedModel`
(a loaded file with the eager model's inputs and outputs) are in `lazytrain.modeling.exported`; the command
line lives with the programs.

The contract of every export: inputs ``image``, ONE uint8 [3, H, W] RGB image already at the model's input
size (the config's test-time resize applied by the caller), and ``original_size``, int64 [2] (height, width)
of the image the detections are wanted in (the original image, or the input's own size); outputs ``boxes``
float32 [N, 4] XYXY, ``scores`` float32 [N], ``classes`` int64 [N] in 0..K-1 and, for Mask R-CNN, ``masks``
uint8 [N, height, width] 0/1, all in the pixels of ``original_size``: what ``model([{"image", "height",
"width"}])`` returns. (TorchScript, legacy, takes the image only and answers in its pixels.)

The number of detections N is left to the exported program as a size that depends on the data (an unbacked
size in ``torch.export``'s terms), not padded to ``detections_per_img``: every target (ExportedProgram,
ONNX through torch's exporter, AOTInductor) takes it as it is, zero detections included, so there is no
``num_detections`` output to get wrong. Height and width are dynamic from a smallest size on (the FPN's
coarsest map must be larger than one pixel, e.g. 65 px for the demo model) that `input_size_range` reads from
the program. These changes to the inference path made the model exportable without changing its eager
results: NMS by `lazytrain.modeling.nms.batched_nms` (torchvision's branches on the number of boxes), the
poolers' and the RPN's per-image paths under ``torch.compiler.is_exporting()``, the box coder and padding
without branches on sizes, and inside the program the mask head run on ``detections_per_img`` padded RoIs
(`RoIHeads._fixed_capacity_mask_branch`: AOTInductor computes it wrong on a count that depends on the data).
torchvision's fake (shape-only) ``nms`` claims at least 2 kept boxes, so a program exported with it stops with
"Runtime assertion failed" on an image with 0 or 1 detections; importing this module registers one that
allows 0 (`_nms_output_size`). The targets need torch >= 2.14 (`MIN_EXPORT_TORCH`); docs/benchmarks.md
("Export targets") has their export times and latencies and what was found on the way.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lazytrain.modeling.rcnn import RCNN
from lazytrain.utils.optional_imports import import_optional

__all__ = [
    "INPUT_NAMES",
    "MIN_EXPORT_TORCH",
    "ONNX_OPSET",
    "OUTPUT_NAMES",
    "TESTED_VERSIONS",
    "ExportableRCNN",
    "check_export_torch",
    "export_aoti",
    "export_onnx",
    "export_program",
    "export_torchscript",
    "get_image_size",
    "input_size_range",
    "save_program",
]

logger = logging.getLogger(__name__)

ONNX_OPSET = 18
INPUT_NAMES = ("image", "original_size")
# A box-only model (no mask head) returns the first three.
OUTPUT_NAMES = ("boxes", "scores", "classes", "masks")

# The versions the export tests (tests/modeling/test_export.py) passed with, on CPU and Python 3.11.
TESTED_VERSIONS = {
    "torch": ("2.14.1",),  # torch.export targets; TorchScript also 2.11.0 (with torchvision 0.26.0)
    "torchvision": ("0.29.1",),
    "onnx": ("1.23.2",),
    "onnxscript": ("0.7.2",),
    "onnxruntime": ("1.32.0",),
    "opset": ONNX_OPSET,
}


def _nms_output_size(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """The kept indices of torchvision's ``nms`` as a shape: any number from 0 (torchvision's own says >= 2)."""
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: "nms: boxes must be [N, 4]")
    torch._check(scores.dim() == 1 and scores.shape[0] == boxes.shape[0], lambda: "nms: scores must be [N]")
    return boxes.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


def _register_nms_shape_rule() -> torch.library.Library:
    """Replace torchvision's shape rule for ``nms`` with `_nms_output_size`; returns the library that holds it
    (registrations last as long as it does).

    Through the op's own holder, not ``torch.library.register_fake``: torch 2.11 with torchvision 0.26 lets
    only the module torchvision names (``torchvision._meta_registrations``) define it, and says so at the
    first export; torch 2.14 with torchvision 0.29 accepts either way."""
    library = torch.library.Library("torchvision", "FRAGMENT")
    holder = torch._library.simple_registry.singleton.find("torchvision::nms").fake_impl
    holder.register(_nms_output_size, __name__, library, allow_override=True)
    return library


_NMS_SHAPE_RULE = _register_nms_shape_rule()


def _check_image(image: object, owner: str) -> None:
    if not isinstance(image, Tensor) or image.dim() != 3 or image.shape[0] != 3 or image.dtype != torch.uint8:
        got = f"{image.dtype} {tuple(image.shape)}" if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(
            f"{owner} must be ONE uint8 [3, H, W] RGB image tensor (exports take batch 1); got {got}. "
            "Pass one image as the test mapper gives it (record['image']): uint8, channels first, no batch."
        )


def _check_original_size(size: object, owner: str) -> None:
    if not isinstance(size, Tensor) or size.shape != (2,) or size.dtype != torch.int64:
        got = f"{size.dtype} {tuple(size.shape)}" if isinstance(size, Tensor) else type(size).__name__
        raise ValueError(
            f"{owner} must be an int64 tensor [2] holding (height, width); got {got}. "
            "Pass torch.tensor([height, width]) of the original image (or of the input image itself)."
        )


def get_image_size(image: Tensor) -> Tensor:
    """The (height, width) of a [..., H, W] image as an int64 [2] tensor: the ``original_size`` input that
    gives detections in the image's own pixels."""
    return torch.tensor([image.shape[-2], image.shape[-1]], dtype=torch.int64)


class ExportableRCNN(nn.Module):
    """One image in, plain tensors out: the graph that the exporters write.

    ``forward(image, original_size)`` takes ONE uint8 [3, H, W] RGB image already at the model's input size
    (apply the config's test-time resize first; the model itself never resizes) and int64 [2] (height, width)
    to give the detections in, and returns ``(boxes, scores, classes, masks)``: float32 [N, 4] XYXY boxes,
    float32 [N] scores, int64 [N] classes in 0..K-1 and uint8 [N, height, width] 0/1 masks thresholded at
    ``model.mask_threshold``. A model without a mask head returns the first three. The outputs are those of
    ``model([{"image": image, "height": height, "width": width}])`` (`RCNN.detect`, boxes scaled to the
    original size and clipped, `RCNN.to_instances`), computed from tensors so that the exported program keeps
    both sizes dynamic. Without ``original_size`` the detections are in the input image's pixels.

    The wrapper never changes the model's mode: it asks for a model already in eval mode and raises
    otherwise. It holds the model as a sub-module, so ``wrapper.train()`` would switch the model too, after
    which ``forward`` raises.

    Args:
        model: an `RCNN` in eval mode (``model.eval()``). Export from a CPU model for a file that runs
            anywhere.
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
        # A new module starts in training mode; exporters restore the wrapper's mode after export through
        # train(mode), which reaches the model, so a training-mode wrapper would leave it training.
        self.train(False)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The names of `forward`'s outputs, also the ONNX output names."""
        return OUTPUT_NAMES if self.model.roi_heads.has_mask() else OUTPUT_NAMES[:3]

    def forward(self, image: Tensor, original_size: Tensor | None = None) -> tuple[Tensor, ...]:
        # Python checks would be frozen into a trace or an exported program; the exporters check the example.
        if not (torch.jit.is_tracing() or torch.compiler.is_exporting()):
            _check_image(image, "ExportableRCNN.forward(image=)")
            if original_size is not None:
                _check_original_size(original_size, "ExportableRCNN.forward(original_size=)")
        (detection,) = self.model.detect([image.float()])
        if original_size is None:
            # image.shape, not int(...): under tracing the paste size then follows the input's size.
            instances = self.model.to_instances(detection, (image.shape[-2], image.shape[-1]))
        else:
            instances = self._in_original_size(detection, image, original_size)
        return tuple(instances[name] for name in self.output_names)

    def _in_original_size(
        self, detection: dict[str, Tensor], image: Tensor, size: Tensor
    ) -> dict[str, Tensor]:
        """`RCNN.forward`'s mapping to the original size, from a size tensor: the same boxes and masks."""
        height, width = size.tolist()
        # At least 2, not 1: AOTInductor's matrix products would otherwise branch on a size of 1.
        torch._check(height >= 2, lambda: "original_size: the height must be at least 2 pixels")
        torch._check(width >= 2, lambda: "original_size: the width must be at least 2 pixels")
        corner = size.flip(0).to(torch.float32).repeat(2)  # (width, height, width, height)
        scale = corner / torch.tensor([image.shape[-1], image.shape[-2]], dtype=torch.float32).repeat(2)
        boxes = torch.minimum((detection["boxes"] * scale).clamp(min=0), corner)
        detection = {**detection, "boxes": boxes}
        if self.model.drop_empty_detections:  # as RCNN._to_original_size
            keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
            detection = {key: value[keep] for key, value in detection.items()}
        return self.model.to_instances(detection, (height, width))


# The oldest torch whose export of these models keeps the image size dynamic and converts to ONNX and
# AOTInductor. torch 2.11's shape rules (max-pool's output size, strided views) add guards on the parity of the
# FPN's coarsest map, so its program refuses other image sizes; 2.12 and 2.13 are untested.
MIN_EXPORT_TORCH = (2, 14)


def check_export_torch(owner: str = "export_program") -> None:
    """Raise a one-line RuntimeError naming the torch needed when this torch cannot export (`MIN_EXPORT_TORCH`)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_EXPORT_TORCH:
        raise RuntimeError(
            f"{owner}() needs torch >= {'.'.join(map(str, MIN_EXPORT_TORCH))} (tested with "
            f"{TESTED_VERSIONS['torch'][-1]}); this machine has torch {torch.__version__}, whose torch.export "
            "fixes the program to the example's image size. Upgrade torch, or export legacy TorchScript "
            "from Python (lazytrain.modeling.export.export_torchscript)."
        )


def _prepare(model: RCNN, example_image: Tensor, owner: str) -> tuple[ExportableRCNN, Tensor]:
    """The wrapper, run once eagerly on the example: the poolers compute their levels' scales on their first
    call, which must not happen inside an export (it would fix the program to the example's size)."""
    _check_image(example_image, f"{owner}(example_image=)")
    wrapper = ExportableRCNN(model)
    example_image = example_image.to(model.device)
    with torch.no_grad():
        wrapper(example_image)
    return wrapper, example_image


def export_program(model: RCNN, example_image: Tensor) -> torch.export.ExportedProgram:
    """`ExportableRCNN(model)` as a ``torch.export`` ExportedProgram, with the image's height and width dynamic.

    Write it with `save_program`, convert it with `export_onnx` or `export_aoti`, check it with
    `lazytrain.modeling.export_parity.check_parity`.

    Args:
        model: an `RCNN` in eval mode; export a CPU model for a program that runs anywhere.
        example_image: uint8 [3, H, W] RGB at the model's input size; other sizes work for later calls.
    """
    _check_image(example_image, "export_program(example_image=)")
    check_export_torch("export_program")
    wrapper, example_image = _prepare(model, example_image, "export_program")
    dynamic = torch.export.Dim.AUTO
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(
            wrapper, (example_image, get_image_size(example_image)),
            dynamic_shapes={"image": {1: dynamic, 2: dynamic}, "original_size": None}, strict=False,
        )  # fmt: skip
    logger.info("Exported the model with torch.export in %.1f s", time.perf_counter() - start)
    return program


def input_size_range(program: torch.export.ExportedProgram) -> dict[str, list[int | None]]:
    """The image heights and widths `program` accepts: ``{"height": [min, max], "width": [min, max]}``, None
    for no upper bound."""
    image = next(node for node in program.graph.nodes if node.op == "placeholder" and node.name == "image")
    ranges = {}
    for name, size in zip(("height", "width"), image.meta["val"].shape[1:]):
        bounds = program.range_constraints.get(size.node.expr) if isinstance(size, torch.SymInt) else None
        if bounds is None:  # a static size
            ranges[name] = [int(size), int(size)]
        else:
            upper = None if math.isinf(float(bounds.upper)) else int(bounds.upper)
            ranges[name] = [int(bounds.lower), upper]
    return ranges


def save_program(program: torch.export.ExportedProgram, file: str) -> str:
    """Write `program` with ``torch.export.save`` (conventionally ``model.pt2``); returns `file`."""
    with warnings.catch_warnings():
        # Said when a weight is stored as a slice of a larger buffer; exports are written from a CPU model,
        # the case the warning says is fine, and the tests load every saved program back and check it.
        warnings.filterwarnings("ignore", "No complete tensor found in the group", UserWarning)
        torch.export.save(program, file)
    return file


def export_onnx(program: torch.export.ExportedProgram, file: str, *, opset: int = ONNX_OPSET) -> str:
    """Convert `program` (from `export_program`) to ONNX with torch's exporter (``dynamo=True``).

    Inputs ``image`` (uint8 [3, height, width], dynamic sizes) and ``original_size`` (int64 [2]); outputs
    ``boxes``, ``scores``, ``classes`` and ``masks`` (Mask R-CNN only) with a dynamic number of detections.
    Needs the ``export`` extra (``pip install "lazytrain[export]"``: onnx, onnxscript; onnxruntime to load).

    Args:
        program: an ExportedProgram of `ExportableRCNN`.
        file: where to write (conventionally ``model.onnx``).
        opset: ONNX opset; tested with `ONNX_OPSET` (see `TESTED_VERSIONS`).

    Returns:
        `file`.
    """
    component = "lazytrain.modeling.export.export_onnx()"
    onnx = import_optional("onnx", component=component, extra="export")
    import_optional("onnxscript", component=component, extra="export")
    output_names = [spec.arg.name for spec in program.graph_signature.output_specs]
    names = list(OUTPUT_NAMES[: len(output_names)])
    start = time.perf_counter()
    with _quiet_onnx_exporter():
        onnx_program = torch.onnx.export(
            program, dynamo=True, opset_version=opset, input_names=list(INPUT_NAMES), output_names=names,
            verbose=False,
        )  # fmt: skip
        onnx_program.save(file)
    onnx.checker.check_model(file)
    logger.info("Exported ONNX (opset %d) to %s in %.1f s", opset, file, time.perf_counter() - start)
    return file


@contextlib.contextmanager
def _quiet_onnx_exporter() -> Iterator[None]:
    """torch's ONNX exporter logs its progress at INFO level through the ``torch.onnx`` logger; on torch 2.11
    its decomposition step also calls a pytree API that torch itself marks deprecated (a FutureWarning about
    ``LeafSpec`` from inside torch, nothing lazytrain calls; torch 2.14 does not)."""
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning
            )
            yield
    finally:
        onnx_logger.setLevel(level)


def export_aoti(
    program: torch.export.ExportedProgram, file: str, *, inductor_configs: dict[str, Any] | None = None
) -> str:
    """Compile `program` ahead of time with AOTInductor into a package (conventionally ``model_aoti.pt2``),
    for the device the program's weights are on; needs a C++ compiler. Load it with `load_aoti` (Python) or
    torch's C++ ``AOTIModelPackageLoader``.

    Compile before `export_onnx` converts the same program, or from a fresh `export_program`: after an ONNX
    conversion in the same process, AOTInductor stops with "Pending unbacked symbols" (torch 2.14.1, even
    on a deep copy of the program).

    Args:
        program: an ExportedProgram of `ExportableRCNN`.
        file: where to write.
        inductor_configs: ``torch._inductor.config`` settings for this compile, e.g.
            ``{"aot_inductor.debug_compile": True}`` (the C++ at ``-O0``: a faster compile, slower code).

    Returns:
        `file`.
    """
    start = time.perf_counter()
    try:
        torch._inductor.aoti_compile_and_package(
            program, package_path=file, inductor_configs=inductor_configs
        )
    except Exception as error:
        message = str(error).splitlines()[0][:300] if str(error) else ""
        raise RuntimeError(
            f"export_aoti: AOTInductor could not compile the model ({type(error).__name__}: {message}). It "
            "needs a C++ compiler (g++ or clang) and, for CUDA, the CUDA toolkit; compile before converting "
            "the same program to ONNX. The ExportedProgram (model.pt2) and ONNX files need neither."
        ) from error
    logger.info("Compiled an AOTInductor package to %s in %.1f s", file, time.perf_counter() - start)
    return file


@contextlib.contextmanager
def _reviewed_trace_warnings_ignored() -> Iterator[None]:
    """Silence the tracer's warnings that were reviewed as noise for these models; lazytrain's stay on."""
    with warnings.catch_warnings():
        # torchvision warns wherever a trace freezes a Python value. For RCNN each frozen value is a constant
        # of the model (normalisation mean/std, the FPN levels' scales, box-coder constants), a shape assert,
        # or the number of images, which exports fix to 1; tests/modeling/test_export.py checks the exports
        # on other image sizes and detection counts. (module "torch": torch._assert in roi_align's checks.)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torchvision\.")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch$")
        # torchvision's clip_boxes_to_image builds torch.tensor(size) from a traced size when tracing.
        warnings.filterwarnings("ignore", "To copy construct from a tensor", UserWarning, r"torchvision\.")
        yield


def export_torchscript(model: RCNN, example_image: Tensor, file: str) -> str:
    """Legacy: trace `ExportableRCNN(model)` on one image (``image`` only, detections in its pixels) and save
    it as TorchScript, which torch deprecates in favour of ``torch.export`` (`export_program`).

    The trace keeps the image size, the number of detections and the mask paste size dynamic (checked by
    tests/modeling/test_export.py on sizes other than the example's). Load it with `load_torchscript`.

    Args:
        model: an `RCNN` in eval mode; export a CPU model for a file that loads anywhere.
        example_image: uint8 [3, H, W] RGB at the model's input size; any size works for later calls.
        file: where to write (conventionally ``model.ts``).

    Returns:
        `file`.
    """
    wrapper, example_image = _prepare(model, example_image, "export_torchscript")
    start = time.perf_counter()
    with torch.no_grad(), _reviewed_trace_warnings_ignored():
        # check_trace=False: the check traces again on the same example, so it cannot see what can go wrong
        # here (other sizes and detection counts); `check_parity` on other images does.
        traced = torch.jit.trace(wrapper, (example_image,), check_trace=False)
    traced.save(file)
    logger.info("Exported TorchScript to %s in %.1f s", file, time.perf_counter() - start)
    return file
