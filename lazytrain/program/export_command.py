"""``python -m lazytrain export RUN_DIR [IMAGE...] [key=value ...]``: a trained run as files to deploy.

    python -m lazytrain export outputs/demo                         # model.pt2 and model.onnx, checked
    python -m lazytrain export outputs/demo photos/ export.aoti=true model.roi_heads.score_thresh=0.5

Writes into ``export.output_dir`` (default ``RUN_DIR/export``):
- ``model.pt2``: the whole model as a ``torch.export`` ExportedProgram (``torch.export.load``), always;
- ``model.onnx`` (``export.onnx=true``, the default): the same program through torch's ONNX exporter;
- ``model_aoti.pt2`` (``export.aoti=true``): compiled ahead of time by AOTInductor for this machine's CPU
  (``torch._inductor.aoti_load_package``, or C++); needs a C++ compiler;
- ``model.ts`` (``export.torchscript=true``): legacy TorchScript, which torch deprecates; the image only in,
  detections in its pixels;
- ``model.json``: inputs, outputs, the image sizes the program takes, classes, the test mapper, the parity.

Every file takes ``image``, ONE uint8 [3, H, W] RGB image already at the model's input size (resize it as the
run's ``dataloader.test.mapper`` does; ``model.json`` says how), and ``original_size``, int64 [2] (height,
width) of the image the detections are wanted in, and returns ``boxes`` [N, 4] XYXY, ``scores`` [N],
``classes`` [N] (contiguous; ``model.json`` names them) and, for Mask R-CNN, ``masks`` uint8 [N, height,
width], in the pixels of ``original_size``: what evaluation computes, best first. The score threshold and
detections per image are part of the program: the run's (its evaluation's), at most predict's threshold
(``model.roi_heads.score_thresh`` 0.5) and at least predict's count (``model.roi_heads.detections_per_img``
100), unless given here; ``model.json`` records them (``applied_in_the_file``).
``python -m lazytrain predict RUN_DIR IMAGES predict.exported=PATH`` runs a written file and keeps, after it,
the detections above its own ``model.roi_heads.score_thresh`` (at least the file's), at most its own
``model.roi_heads.detections_per_img`` (at most the file's): the same detections as predicting with the weights.

Each file is checked right after it is written: it must give the eager model's detections on the IMAGEs
(default: the first ``export.check_images`` images of the run's test data set), mapped to their original
sizes, with boxes within 0.01 px, scores within 1e-4 and masks agreeing on 99.9% of their pixels
(`lazytrain.modeling.export_parity.check_parity`); the command prints the measured differences. Other keys: ``export.checkpoint``, ``export.opset``, and any key of the run's config.
Instead of RUN_DIR, a config file (or ``lazytrain://NAME``) with ``export.checkpoint=PATH`` works as for
predict. Existing files are never overwritten.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from lazytrain.program.predict_command import MODEL_DEFAULTS
from lazytrain.program.run_command import (
    CommandLineError,
    find_images,
    load_run,
    refuse_existing,
    run_command,
    split_arguments,
    write_json,
)

__all__ = ["EXPORT_DEFAULTS", "PARITY", "main"]

EXPORT_DEFAULTS: dict[str, Any] = {
    "onnx": True,  # model.onnx
    "aoti": False,  # model_aoti.pt2
    "torchscript": False,  # model.ts (legacy)
    "output_dir": None,  # default: RUN_DIR/export (CONFIG: ./export)
    "checkpoint": None,  # default: the run's newest checkpoint
    "opset": None,  # default: lazytrain.modeling.export.ONNX_OPSET
    "check_images": 4,  # test-set images the exports are checked on when no IMAGE is given
}
# Tighter than check_parity's defaults: what a deployment may expect of a file this command wrote.
PARITY = {"box_atol": 0.01, "score_atol": 1e-4, "mask_agreement": 0.999}
# model.pt2 first: the others are converted from it (TorchScript is traced from the model).
_FILES = {"program": "model.pt2", "aoti": "model_aoti.pt2", "onnx": "model.onnx", "torchscript": "model.ts"}


def load_export_config(run_dir: str, overrides: list[str]) -> tuple[DictConfig, str]:
    """The run's config with ``export.*`` and `overrides` applied, and the weights file to export."""
    cfg, checkpoint = load_run(
        run_dir, overrides, checkpoint_key="export.checkpoint", set_defaults=_set_export_defaults
    )
    for key in ("onnx", "aoti", "torchscript"):
        if not isinstance(cfg.export[key], bool):
            raise CommandLineError(f"export.{key} must be true or false; got {cfg.export[key]!r}")
    return cfg, checkpoint


def _set_export_defaults(cfg: DictConfig, directory: str) -> None:
    cfg.export = OmegaConf.create({**EXPORT_DEFAULTS, "output_dir": os.path.join(directory, "export")})
    # The file keeps what predict's defaults select (and the run's evaluation, usually more), so that predicting
    # with it honours predict's keys: `ExportedModel.limit` selects after the file runs.
    roi_heads = OmegaConf.select(cfg, "model.roi_heads")
    if isinstance(roi_heads, DictConfig) and set(MODEL_DEFAULTS) <= set(roi_heads):
        roi_heads.score_thresh = min(roi_heads.score_thresh, MODEL_DEFAULTS["score_thresh"])
        roi_heads.detections_per_img = max(roi_heads.detections_per_img, MODEL_DEFAULTS["detections_per_img"])


def get_check_files(cfg: DictConfig, image_arguments: list[str]) -> list[str]:
    """The images the exports are checked on: the IMAGE arguments, else the test data set's first images."""
    if image_arguments:
        return find_images(image_arguments)
    from lazytrain.config import instantiate
    from lazytrain.data.catalog import DatasetCatalog

    try:
        names = instantiate(cfg.dataloader.test.dataset.names)
        records = DatasetCatalog.get(names if isinstance(names, str) else list(names)[0])
    except Exception as e:  # any way of not having the data set ends the same: images are needed
        raise CommandLineError(
            f"the exports are checked on images: give some (files, folders or globs) after RUN_DIR; the run's "
            f"test data set could not be loaded ({type(e).__name__}: {e})"
        ) from None
    return [record["file_name"] for record in records[: int(cfg.export.check_images)]]


def _targets(cfg: DictConfig) -> list[str]:
    # AOTInductor before ONNX: after an ONNX conversion it fails on the same program (`export_aoti`).
    return ["program"] + [name for name in ("aoti", "onnx", "torchscript") if cfg.export[name]]


def main(argv: list[str]) -> None:
    """Run ``export`` (argv without the word ``export``)."""
    run_command("export", argv, _export, __doc__)


def _export(argv: list[str]) -> None:
    run_dir, image_arguments, overrides = split_arguments(argv, images_required=False)
    from lazytrain.modeling import export, exported

    try:
        export.check_export_torch("export")
    except RuntimeError as error:
        raise CommandLineError(str(error)) from None
    cfg, checkpoint = load_export_config(run_dir, overrides)
    targets = _targets(cfg)
    output_dir = str(cfg.export.output_dir)
    written = [_FILES[target] for target in targets] + [exported.DESCRIPTION_FILE]
    refuse_existing([os.path.join(output_dir, name) for name in written], "export.output_dir")
    files = get_check_files(cfg, image_arguments)
    from lazytrain.program.predictor import Predictor, read_categories, to_image_tensor

    predictor = Predictor.from_config(
        cfg, checkpoint, device="cpu", batch_size=1, categories=read_categories(run_dir)
    )
    originals = [to_image_tensor(file) for file in files]
    check = _Check(
        images=[predictor.mapper.map_image(image) for image in originals],
        sizes=[(int(image.shape[1]), int(image.shape[2])) for image in originals],
    )
    os.makedirs(output_dir, exist_ok=True)
    checks, program = {}, None
    for target in targets:
        start = time.perf_counter()
        program, loaded = _write_and_load(predictor.model, check.images[0], target, program, output_dir, cfg)
        checks[target] = _check(predictor, loaded, target, check, output_dir, time.perf_counter() - start)
    _write_model_json(os.path.join(output_dir, written[-1]), cfg, predictor, checkpoint, checks, program)
    print(
        f"Wrote {written[-1]} to {output_dir} (inputs, outputs, image sizes, what the files apply, classes, "
        "parity)"
    )


class _Check(NamedTuple):
    """The images the exports are checked on (mapped) and their original sizes."""

    images: list
    sizes: list[tuple[int, int]]


def _write_and_load(model: Any, example: Any, target: str, program: Any, output_dir: str, cfg: DictConfig):
    """Write one target's file; (the ExportedProgram, the file loaded back as a `Detector`)."""
    from lazytrain.modeling import export, exported

    path = os.path.join(output_dir, _FILES[target])
    if target == "program":
        program = export.export_program(model, example)
        return program, exported.load_program(export.save_program(program, path))
    if target == "onnx":
        opset = int(cfg.export.opset or export.ONNX_OPSET)
        return program, exported.load_onnx(export.export_onnx(program, path, opset=opset))
    if target == "aoti":
        return program, exported.load_aoti(export.export_aoti(program, path))
    with warnings.catch_warnings():
        # torch's notice that TorchScript is deprecated, at each jit call: said once, here.
        warnings.filterwarnings("ignore", r"`torch\.jit\.\w+` is deprecated", FutureWarning)
        warnings.filterwarnings("ignore", r"`torch\.jit\.\w+` is deprecated", DeprecationWarning)
        loaded = exported.load_torchscript(export.export_torchscript(model, example, path))
    print(f"{path}: legacy TorchScript, which torch deprecates in favour of torch.export (model.pt2)")
    return program, loaded


def _check(predictor: Any, loaded: Any, target: str, check: _Check, output_dir: str, seconds: float) -> str:
    """Check one loaded file against the eager model; the parity line."""
    from lazytrain.modeling import export
    from lazytrain.modeling.export_parity import check_parity

    # TorchScript (legacy) answers in the input image's pixels only.
    sizes = None if target == "torchscript" else check.sizes
    report = check_parity(export.ExportableRCNN(predictor.model), loaded, check.images, sizes, **PARITY)
    print(f"{os.path.join(output_dir, _FILES[target])}: written in {seconds:.1f} s; {report}")
    return str(report)


def _write_model_json(
    path: str, cfg: DictConfig, predictor: Any, checkpoint: str, checks: dict, program: Any
) -> None:
    from lazytrain.modeling import export

    roi_heads = predictor.model.roi_heads
    sizes = export.input_size_range(program)
    description = {
        "checkpoint": os.path.abspath(checkpoint),
        "files": {target: _FILES[target] for target in checks},
        "inputs": {
            "image": "uint8 [3, H, W] RGB, one image, already resized by the test mapper below",
            "original_size": "int64 [2]: (height, width) to give the detections in (model.ts: not an input)",
        },
        "image_size_range": sizes,
        "test_mapper": OmegaConf.to_container(cfg.dataloader.test.mapper, resolve=True),
        "outputs": ["boxes [N, 4] XYXY float32", "scores [N]", "classes [N] int64 (contiguous)"]
        + (["masks [N, height, width] uint8"] if roi_heads.has_mask() else []),
        "applied_in_the_file": {
            "score_thresh": roi_heads.score_thresh,
            "detections_per_img": roi_heads.detections_per_img,
            "nms_thresh": roi_heads.nms_thresh,
            "selection": "the detections scoring above score_thresh after per-class NMS at nms_thresh, at most "
            "detections_per_img per image, best first; predict.exported keeps those above a higher "
            "model.roi_heads.score_thresh and at most a smaller model.roi_heads.detections_per_img of them",
        },
        "classes": predictor.categories.names,
        "category_ids": predictor.categories.ids,
        "parity": checks,
        "tested_versions": export.TESTED_VERSIONS,
    }
    write_json(path, description)
