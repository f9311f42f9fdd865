"""``python -m lazytrain export RUN_DIR [IMAGE...] [key=value ...]``: a trained run as TorchScript and ONNX.

    python -m lazytrain export outputs/demo                         # model.ts and model.onnx, checked
    python -m lazytrain export outputs/demo photos/ export.format=onnx model.roi_heads.score_thresh=0.5

The exported graph takes ONE image: uint8 [3, H, W] RGB already at the model's input size (resize it as the
run's ``dataloader.test.mapper`` does; ``model.json`` says how) and returns ``boxes`` [N, 4] XYXY in that
image's pixels, ``scores`` [N], ``classes`` [N] (contiguous; ``model.json`` names them) and, for Mask R-CNN,
``masks`` uint8 [N, H, W]. Scale boxes and masks back to the original image yourself (`lazytrain.Predictor`
does it for the eager model). The score threshold and detections per image of the run's config are part of
the graph: set them with ``model.roi_heads.score_thresh=`` / ``model.roi_heads.detections_per_img=``.

Each export is checked right after it is written: it must give the eager model's detections on the IMAGEs
(default: the first ``export.check_images`` images of the run's test data set) within the tolerances of
`lazytrain.modeling.export.check_parity`; the command prints the measured differences and the versions the
parity tests ran with. Keys: ``export.format`` (``all``, ``onnx``, ``torchscript``), ``export.output_dir``
(default ``RUN_DIR/export``; existing files are never overwritten), ``export.checkpoint``, ``export.opset``,
``export.check_images``, and any key of the run's config. Instead of RUN_DIR, a config file with
``export.checkpoint=PATH`` works as for predict (`lazytrain.program.run_command.load_run` reads both).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lazytrain.program.run_command import (
    CommandLineError,
    find_images,
    load_run,
    refuse_existing,
    run_command,
    split_arguments,
    write_json,
)

__all__ = ["EXPORT_DEFAULTS", "main"]

EXPORT_DEFAULTS: dict[str, Any] = {
    "format": "all",  # onnx, torchscript or all
    "output_dir": None,  # default: RUN_DIR/export (CONFIG: ./export)
    "checkpoint": None,  # default: the run's newest checkpoint
    "opset": None,  # default: lazytrain.modeling.export.ONNX_OPSET
    "check_images": 4,  # test-set images the exports are checked on when no IMAGE is given
}
_FILES = {"torchscript": "model.ts", "onnx": "model.onnx"}


def load_export_config(run_dir: str, overrides: list[str]) -> tuple[DictConfig, str]:
    """The run's config with ``export.*`` and `overrides` applied, and the weights file to export."""
    cfg, checkpoint = load_run(
        run_dir, overrides, checkpoint_key="export.checkpoint", set_defaults=_set_export_defaults
    )
    if cfg.export.format not in ("all", *_FILES):
        raise CommandLineError(f"export.format must be all, onnx or torchscript; got {cfg.export.format!r}")
    return cfg, checkpoint


def _set_export_defaults(cfg: DictConfig, directory: str) -> None:
    cfg.export = OmegaConf.create({**EXPORT_DEFAULTS, "output_dir": os.path.join(directory, "export")})


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


def _formats(cfg: DictConfig) -> list[str]:
    return list(_FILES) if cfg.export.format == "all" else [str(cfg.export.format)]


def main(argv: list[str]) -> None:
    """Run ``export`` (argv without the word ``export``)."""
    run_command("export", argv, _export, __doc__)


def _export(argv: list[str]) -> None:
    run_dir, image_arguments, overrides = split_arguments(argv, images_required=False)
    cfg, checkpoint = load_export_config(run_dir, overrides)
    formats = _formats(cfg)
    output_dir = str(cfg.export.output_dir)
    written = [_FILES[f] for f in formats] + ["model.json"]
    refuse_existing([os.path.join(output_dir, name) for name in written], "export.output_dir")
    files = get_check_files(cfg, image_arguments)
    from lazytrain.program.predictor import Predictor, read_categories, to_image_tensor

    predictor = Predictor.from_config(
        cfg, checkpoint, device="cpu", batch_size=1, categories=read_categories(run_dir)
    )
    images = [predictor.mapper.map_image(to_image_tensor(file)) for file in files]
    os.makedirs(output_dir, exist_ok=True)
    checks = {name: _export_and_check(predictor, images, name, output_dir, cfg) for name in formats}
    _write_model_json(os.path.join(output_dir, "model.json"), cfg, predictor, checkpoint, checks)
    print(f"Wrote model.json to {output_dir} (inputs, outputs, classes, parity)")
    print(_tested_versions_note())


def _tested_versions_note() -> str:
    import torch

    from lazytrain.modeling import export

    tested = ", ".join(
        f"{name} {' and '.join(versions) if isinstance(versions, (list, tuple)) else versions}"
        for name, versions in export.TESTED_VERSIONS.items()
    )
    return (
        f"Export parity is tested with {tested} (this machine: torch {torch.__version__}). torch marks "
        "TorchScript and its TorchScript-based ONNX exporter deprecated; they work in these versions."
    )


def _export_and_check(predictor: Any, images: list, name: str, output_dir: str, cfg: DictConfig) -> str:
    """Write one format, load it back and check it against the eager model; the parity line."""
    from lazytrain.modeling import export

    path = os.path.join(output_dir, _FILES[name])
    start = time.perf_counter()
    with warnings.catch_warnings():
        # torch's notices that TorchScript and its ONNX exporter are deprecated, once per call: `main` says it
        # once, with the versions the parity tests ran on.
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        loaded = _write_and_load(predictor, images[0], name, path, cfg)
    seconds = time.perf_counter() - start
    report = export.check_parity(export.ExportableRCNN(predictor.model), loaded, images)
    print(f"{path}: written in {seconds:.1f} s; {report}")
    return str(report)


def _write_and_load(predictor: Any, example: Any, name: str, path: str, cfg: DictConfig) -> Any:
    from lazytrain.modeling import export

    if name == "torchscript":
        export.export_torchscript(predictor.model, example, path)
        return export.load_torchscript(path)
    opset = int(cfg.export.opset or export.ONNX_OPSET)
    export.export_onnx(predictor.model, example, path, opset=opset)
    return export.load_onnx(path)


def _write_model_json(path: str, cfg: DictConfig, predictor: Any, checkpoint: str, checks: dict) -> None:
    from lazytrain.modeling import export

    roi_heads = predictor.model.roi_heads
    description = {
        "checkpoint": os.path.abspath(checkpoint),
        "files": {name: _FILES[name] for name in checks},
        "input": "image: uint8 [3, H, W] RGB, one image, already resized by the test mapper below",
        "test_mapper": OmegaConf.to_container(cfg.dataloader.test.mapper, resolve=True),
        "outputs": ["boxes [N, 4] XYXY float32", "scores [N]", "classes [N] int64 (contiguous)"]
        + (["masks [N, H, W] uint8"] if roi_heads.has_mask() else []),
        "score_thresh": roi_heads.score_thresh,
        "detections_per_img": roi_heads.detections_per_img,
        "classes": predictor.categories.names,
        "category_ids": predictor.categories.ids,
        "parity": checks,
        "tested_versions": export.TESTED_VERSIONS,
    }
    write_json(path, description)
