"""``python -m lazytrain predict RUN_DIR IMAGE... [key=value ...]``: a trained run on new images.

    python -m lazytrain predict outputs/demo photos/ "shots/*.jpg" extra.png predict.draw=true
    python -m lazytrain predict my_config.py photos/ predict.checkpoint=model.pth
    python -m lazytrain predict lazytrain://detectron2_coco_maskrcnn_r50 photos/ predict.checkpoint=model_final.pkl

IMAGE: files, folders (their images, not sub-folders) and globs (``**`` recurses). Keys, in Hydra's override
grammar: the ``predict.*`` keys below, and any key of the run's config (``model.roi_heads.nms_thresh=0.6``).
Instead of RUN_DIR: a config file or a shipped config (``lazytrain://NAME``) with ``predict.checkpoint=PATH``,
read as ``train.init_checkpoint`` reads it (a lazytrain, torchvision or detectron2 ``.pkl``/``.pth`` file).
Predicting sets ``model.roi_heads.score_thresh=0.5`` and ``model.roi_heads.detections_per_img=100`` (evaluation
keeps everything above a low threshold for AP) before the command line's keys, which override them.

Writes into ``predict.output_dir`` (default ``RUN_DIR/predictions``):
- ``results.json``: COCO results (``image_id``, ``category_id`` in the run's json ids, ``bbox`` XYWH, ``score``,
  ``segmentation`` as compressed RLE), streamed one image at a time by evaluation's writer
  (`lazytrain.evaluation.predictions.write_coco_results`);
- ``images.json``: ``{"images": [{"id", "file_name", "height", "width"}], "categories": [{"id", "name"}]}``,
  which names the ``image_id`` and ``category_id`` of the results (a COCO json without annotations);
- with ``predict.draw=true``, ``drawn/<image name>.png``: boxes, masks and "name score" labels.

``predict.exported=PATH`` predicts with a file of ``python -m lazytrain export`` (``model.pt2``,
``model_aoti.pt2`` or ``model.onnx``; a path, or one inside RUN_DIR such as ``export/model.pt2``) in place of
the model and its weights, on the CPU: the code path a deployment runs. ``model.roi_heads.score_thresh`` and
``model.roi_heads.detections_per_img`` apply to it as to the weights (the file keeps detections down to the
threshold it was exported with, its ``model.json`` says which; a lower threshold or more detections is
refused); the model's other keys are part of the file and refused here. The run's config gives the test mapper.

An image that cannot be read is skipped with a warning naming it and listed at the end
(``predict.on_bad_image=stop`` stops instead); a path that does not exist, a folder without images and a run
without weights stop before the model is built. Nothing already written is overwritten: an output folder that
holds a ``results.json`` is refused.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from collections.abc import Iterator
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

__all__ = ["MODEL_DEFAULTS", "PREDICT_DEFAULTS", "main"]

logger = logging.getLogger(__name__)

PREDICT_DEFAULTS: dict[str, Any] = {
    "checkpoint": None,  # default: the run's newest checkpoint
    "output_dir": None,  # default: RUN_DIR/predictions (CONFIG: ./predictions)
    "draw": False,
    "device": None,  # default: cuda when available, else cpu
    "batch_size": None,  # default: dataloader.test.batch_size
    "on_bad_image": "skip",  # or "stop"
    "exported": None,  # a file of `python -m lazytrain export` (model.pt2, model_aoti.pt2, model.onnx)
}
# predict's own defaults for keys of the run's model, applied before the command line's overrides (which win).
MODEL_DEFAULTS = {"score_thresh": 0.5, "detections_per_img": 100}  # model.roi_heads.*
# The keys that select an exported file's detections after it runs (`ExportedModel.limit`).
_SELECTION_KEYS = tuple(f"model.roi_heads.{key}" for key in MODEL_DEFAULTS)
_MOVED_KEYS = {"predict.score_thresh": "score_thresh", "predict.max_dets": "detections_per_img"}


def load_predict_config(source: str, overrides: list[str]) -> tuple[DictConfig, str]:
    """The run's config (RUN_DIR/config.yaml, or a config file) with ``predict.*`` and `overrides` applied, and
    the weights file to use: ``predict.exported``'s file when given (a path, or one inside the run directory)."""
    _refuse_moved_keys(overrides)
    exported = any(_key(o) == "predict.exported" for o in overrides)
    if exported:
        _refuse_keys_an_export_holds(overrides)
    cfg, checkpoint = load_run(
        source,
        overrides,
        checkpoint_key="predict.exported" if exported else "predict.checkpoint",
        set_defaults=_set_predict_defaults,
    )
    if cfg.predict.on_bad_image not in ("skip", "stop"):
        raise CommandLineError(f"predict.on_bad_image must be skip or stop; got {cfg.predict.on_bad_image!r}")
    _check_selection(cfg)
    if exported:
        _check_exported_file(checkpoint, source)
    return cfg, checkpoint


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _check_selection(cfg: DictConfig) -> None:
    """The score threshold and detections per image, before any model is built."""
    score_thresh = OmegaConf.select(cfg, "model.roi_heads.score_thresh")
    if score_thresh is not None and not (
        isinstance(score_thresh, (int, float))
        and not isinstance(score_thresh, bool)
        and 0 <= score_thresh <= 1
    ):
        raise CommandLineError(
            f"model.roi_heads.score_thresh must be a score in [0, 1] (detections scoring above it are kept); "
            f"got {score_thresh!r}"
        )
    count = OmegaConf.select(cfg, "model.roi_heads.detections_per_img")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise CommandLineError(f"model.roi_heads.detections_per_img must be an int >= 1; got {count!r}")


def _refuse_keys_an_export_holds(overrides: list[str]) -> None:
    """An exported file holds its model, weights and device: only its detections can still be selected."""
    for override in overrides:
        key = _key(override)
        if key.startswith("model.") and key not in _SELECTION_KEYS:
            raise CommandLineError(
                f"{key} is part of the file predict.exported names (only {' and '.join(_SELECTION_KEYS)} apply "
                f"to it): export again with {override} (python -m lazytrain export RUN_DIR {override}), or "
                "predict with the weights (without predict.exported)"
            )
        if key in ("predict.checkpoint", "predict.device"):
            raise CommandLineError(
                f"{key} does not apply with predict.exported (the exported file holds its weights and runs on "
                f"the CPU): give one of predict.exported and {key}"
            )


def _check_exported_file(path: str, source: str) -> None:
    """Refuse, in one line, a file of another kind than an export (a checkpoint, TorchScript)."""
    from lazytrain.modeling.exported import FILE_KINDS, get_file_kind

    kind = get_file_kind(path)
    if kind == "checkpoint":
        raise CommandLineError(
            f"predict.exported={path} is {FILE_KINDS[kind]}: predict with it as predict.checkpoint={path}, or "
            f"export it first (python -m lazytrain export {source} export.checkpoint={path}) and give "
            "predict.exported=export/model.pt2"
        )
    if kind in ("torchscript", "unknown"):
        raise CommandLineError(
            f"predict.exported={path} is {FILE_KINDS[kind]}: give model.pt2, model_aoti.pt2 or model.onnx as "
            f"written by python -m lazytrain export {source}"
        )


def _set_predict_defaults(cfg: DictConfig, directory: str) -> None:
    cfg.predict = OmegaConf.create({**PREDICT_DEFAULTS, "output_dir": os.path.join(directory, "predictions")})
    roi_heads = OmegaConf.select(cfg, "model.roi_heads")
    for key, value in MODEL_DEFAULTS.items():
        if isinstance(roi_heads, DictConfig) and key in roi_heads:
            roi_heads[key] = value


def _refuse_moved_keys(overrides: list[str]) -> None:
    for override in overrides:
        key = _key(override)
        if key in _MOVED_KEYS:
            raise CommandLineError(
                f"{key} is model.roi_heads.{_MOVED_KEYS[key]} (one key for predict, evaluation and export); "
                f"write {override.replace(key, 'model.roi_heads.' + _MOVED_KEYS[key], 1)}"
            )


def main(argv: list[str]) -> None:
    """Run ``predict`` (argv without the word ``predict``)."""
    run_command("predict", argv, _predict, __doc__)


def _predict(argv: list[str]) -> None:
    source, image_arguments, overrides = split_arguments(argv)
    files = find_images(image_arguments)
    cfg, checkpoint = load_predict_config(source, overrides)
    output_dir = str(cfg.predict.output_dir)
    refuse_existing([os.path.join(output_dir, "results.json")], "predict.output_dir")
    from lazytrain.program.predictor import Predictor, read_categories

    categories = read_categories(source)  # None for a config file: its test data set names them
    if cfg.predict.exported:
        predictor = Predictor.from_exported(
            cfg, checkpoint, batch_size=cfg.predict.batch_size, categories=categories
        )
    else:
        predictor = Predictor.from_config(
            cfg,
            checkpoint,
            device=cfg.predict.device,
            batch_size=cfg.predict.batch_size,
            categories=categories,
        )
    print(f"Predicting {len(files)} images with {checkpoint} on {predictor.device}", file=sys.stderr)
    start = time.perf_counter()
    written = _write_predictions(predictor, files, cfg.predict)
    seconds = time.perf_counter() - start
    images = len(written.images)
    print(
        f"Predicted {images} images ({written.detections} detections) in {seconds:.1f} s "
        f"({images / seconds:.2f} images/s); wrote {written.describe(output_dir)}"
    )
    if written.skipped:
        print(f"Skipped {len(written.skipped)} unreadable images: " + "; ".join(written.skipped))


class _Written:
    """What `_write_predictions` wrote: ``images.json``'s images, counts, and the files it skipped."""

    def __init__(self) -> None:
        self.images: list[dict[str, Any]] = []
        self.detections = 0
        self.drawn = 0
        self.skipped: list[str] = []

    def describe(self, output_dir: str) -> str:
        files = ["results.json", "images.json"] + ([f"{self.drawn} pictures in drawn/"] if self.drawn else [])
        return f"{', '.join(files)} to {output_dir}"


def _write_predictions(predictor: Any, files: list[str], settings: DictConfig) -> _Written:
    """Predict `files` and write ``results.json`` (streamed, one image at a time) and ``images.json``."""
    from lazytrain.evaluation.predictions import write_coco_results
    from lazytrain.utils.file_io import atomic_write

    output_dir = str(settings.output_dir)
    written = _Written()
    categories = [{"id": i, "name": n} for i, n in zip(predictor.categories.ids, predictor.categories.names)]

    def write_results(file: Any) -> None:
        written.detections = write_coco_results(file, _predict_images(predictor, files, settings, written))
        # Before results.json is renamed into place: an output folder with results.json is complete.
        write_json(
            os.path.join(output_dir, "images.json"), {"images": written.images, "categories": categories}
        )

    os.makedirs(output_dir, exist_ok=True)
    atomic_write(os.path.join(output_dir, "results.json"), write_results)
    return written


def _predict_images(
    predictor: Any, files: list[str], settings: DictConfig, written: _Written
) -> Iterator[Any]:
    """Yield the `ImagePredictions` of each readable file (its ``image_id``: its place in `written.images`),
    drawing it when ``settings.draw``."""
    from tqdm import tqdm

    with tqdm(total=len(files), unit="img", desc="predict", file=sys.stderr) as progress:
        # `Predictor.predict` reads a batch ahead of what it yields: tee keeps each (file, image) until then.
        readable, to_predict = itertools.tee(_read_images(files, settings.on_bad_image, written))
        predictions = predictor.predict(image for _, image in to_predict)
        for (file, image), prediction in zip(readable, predictions):
            image_id = len(written.images)
            written.images.append({"id": image_id, "file_name": file, "height": prediction.height,
                                   "width": prediction.width})  # fmt: skip
            if settings.draw:
                _draw(image, prediction, os.path.join(str(settings.output_dir), "drawn"), file, written)
            progress.update(1)
            yield prediction.to_image_predictions(image_id)
        progress.update(len(files) - progress.n)  # skipped files


def _read_images(files: list[str], on_bad_image: str, written: _Written) -> Iterator[tuple[str, Any]]:
    """Yield (file, uint8 [3, H, W] tensor) of each readable file; skip (or stop at) the others."""
    from lazytrain.program.predictor import to_image_tensor

    for file in files:
        try:
            yield file, to_image_tensor(file)
        except OSError as e:
            if on_bad_image == "stop":
                raise CommandLineError(f"{e} (predict.on_bad_image=skip goes on without it)") from None
            logger.warning("predict: skipped %s", e)
            written.skipped.append(file)


def _draw(image: Any, prediction: Any, drawn_dir: str, file: str, written: _Written) -> None:
    from lazytrain.utils.visualizer import draw_instances, save_image

    labels = [
        f"{name} {score:.2f}" for name, score in zip(prediction.class_names, prediction.scores.tolist())
    ]
    picture = draw_instances(
        image.permute(1, 2, 0).numpy(),
        prediction.boxes.numpy(),
        masks=None if prediction.masks is None else prediction.masks.numpy(),
        labels=labels,
        color_ids=prediction.classes.tolist(),
    )
    stem = os.path.splitext(os.path.basename(file))[0]
    path = os.path.join(drawn_dir, f"{stem}.png")
    if os.path.exists(path):  # two inputs with one name (from different folders): keep both
        path = os.path.join(drawn_dir, f"{stem}_{written.drawn}.png")
    os.makedirs(drawn_dir, exist_ok=True)
    save_image(picture, path)
    written.drawn += 1
