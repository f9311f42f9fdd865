"""``python -m lazytrain predict RUN_DIR IMAGE... [key=value ...]``: a trained run on new images.

    python -m lazytrain predict outputs/demo photos/ "shots/*.jpg" extra.png predict.draw=true
    python -m lazytrain predict conf/rfs_maskrcnn_demo.py photos/ predict.checkpoint=model.pth

IMAGE: files, folders (their images, not sub-folders) and globs (``**`` recurses). Keys, in Hydra's override
grammar: the ``predict.*`` keys below, and any key of the run's config (``model.roi_heads.nms_thresh=0.6``).
Predicting sets ``model.roi_heads.score_thresh=0.5`` and ``model.roi_heads.detections_per_img=100`` (evaluation
keeps everything above a low threshold for AP) before the command line's keys, which override them.

Writes into ``predict.output_dir`` (default ``RUN_DIR/predictions``):
- ``results.json``: COCO results (``image_id``, ``category_id`` in the run's json ids, ``bbox`` XYWH, ``score``,
  ``segmentation`` as compressed RLE), what evaluation writes;
- ``images.json``: ``{"images": [{"id", "file_name", "height", "width"}], "categories": [{"id", "name"}]}``,
  which names the ``image_id`` and ``category_id`` of the results (a COCO json without annotations);
- with ``predict.draw=true``, ``drawn/<image name>.png``: boxes, masks and "name score" labels.

An image that cannot be read is skipped with a warning naming it and listed at the end
(``predict.on_bad_image=stop`` stops instead); a path that does not exist, a folder without images and a run
without weights stop before the model is built. Nothing already written is overwritten: an output folder that
holds a ``results.json`` is refused.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "IMAGE_EXTENSIONS",
    "PREDICT_DEFAULTS",
    "CommandLineError",
    "find_images",
    "main",
    "refuse_existing",
    "run_command",
    "split_arguments",
    "write_json",
]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
PREDICT_DEFAULTS: dict[str, Any] = {
    "checkpoint": None,  # default: the run's newest checkpoint
    "output_dir": None,  # default: RUN_DIR/predictions (CONFIG: ./predictions)
    "draw": False,
    "device": None,  # default: cuda when available, else cpu
    "batch_size": None,  # default: dataloader.test.batch_size
    "on_bad_image": "skip",  # or "stop"
}
# predict's own defaults for keys of the run's model, applied before the command line's overrides (which win).
MODEL_DEFAULTS = {"score_thresh": 0.5, "detections_per_img": 100}  # model.roi_heads.*
_MOVED_KEYS = {"predict.score_thresh": "score_thresh", "predict.max_dets": "detections_per_img"}
_OVERRIDE = re.compile(r"^[~+]{0,2}[A-Za-z_][\w.\[\]]*=|^~[A-Za-z_][\w.]*$")


class CommandLineError(Exception):
    """A problem with a ``predict`` or ``export`` command line, said in one line."""


def split_arguments(argv: list[str], *, images_required: bool = True) -> tuple[str, list[str], list[str]]:
    """(RUN_DIR or CONFIG, image arguments, key=value overrides)."""
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    positional = [a for a in argv if not _OVERRIDE.match(a)]
    if len(positional) < (2 if images_required else 1):
        wanted = " (or config) and at least one image, folder or glob" if images_required else ""
        raise CommandLineError(f"give a run directory{wanted} (--help shows how)")
    return positional[0], positional[1:], overrides


def find_images(arguments: list[str]) -> list[str]:
    """Image files named by `arguments` (files, folders, globs), in order, without repeats.

    Raises:
        CommandLineError: a path that does not exist, a folder or glob with no images, or no images at all.
    """
    found: list[str] = []
    for argument in arguments:
        if os.path.isdir(argument):
            files = sorted(os.path.join(argument, n) for n in os.listdir(argument) if _is_image_file(n))
            if not files:
                raise CommandLineError(
                    f"no images in folder {argument} (looked for {', '.join(IMAGE_EXTENSIONS)})"
                )
        elif glob.has_magic(argument):
            files = sorted(f for f in glob.glob(argument, recursive=True) if os.path.isfile(f))
            if not files:
                raise CommandLineError(f"no files match {argument}")
        elif os.path.isfile(argument):
            files = [argument]
        else:
            raise CommandLineError(f"image {argument} does not exist")
        found.extend(files)
    return list(dict.fromkeys(found))


def _is_image_file(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def load_predict_config(source: str, overrides: list[str]) -> tuple[DictConfig, str]:
    """The run's config (RUN_DIR/config.yaml, or a config file) with ``predict.*`` and `overrides` applied, and
    the weights file to use."""
    from lazytrain.config import LazyConfig
    from lazytrain.program.predictor import get_checkpoint_path

    is_run_dir = os.path.isdir(source)
    config_file = os.path.join(source, "config.yaml") if is_run_dir else source
    if not os.path.isfile(config_file):
        raise CommandLineError(
            f"{config_file} not found: give a training run's directory (it holds config.yaml) or a config file"
        )
    _refuse_moved_keys(overrides)
    cfg = LazyConfig.load(config_file)
    cfg.predict = OmegaConf.create(PREDICT_DEFAULTS)
    cfg.predict.output_dir = os.path.join(source if is_run_dir else ".", "predictions")
    roi_heads = OmegaConf.select(cfg, "model.roi_heads")
    for key, value in MODEL_DEFAULTS.items():
        if isinstance(roi_heads, DictConfig) and key in roi_heads:
            roi_heads[key] = value
    LazyConfig.apply_overrides(cfg, overrides)
    if cfg.predict.on_bad_image not in ("skip", "stop"):
        raise CommandLineError(f"predict.on_bad_image must be skip or stop; got {cfg.predict.on_bad_image!r}")
    if not is_run_dir and not cfg.predict.checkpoint:
        raise CommandLineError(f"{source} is a config: name its weights with predict.checkpoint=PATH")
    try:
        checkpoint = get_checkpoint_path(source if is_run_dir else ".", cfg.predict.checkpoint)
    except FileNotFoundError as e:
        raise CommandLineError(str(e)) from None
    return cfg, checkpoint


def _refuse_moved_keys(overrides: list[str]) -> None:
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in _MOVED_KEYS:
            raise CommandLineError(
                f"{key} is model.roi_heads.{_MOVED_KEYS[key]} (one key for predict, evaluation and export); "
                f"write {override.replace(key, 'model.roi_heads.' + _MOVED_KEYS[key], 1)}"
            )


def refuse_existing(paths: list[str], key: str) -> None:
    """Raise naming the first of `paths` that exists: a command never overwrites what is there."""
    for path in paths:
        if os.path.exists(path):
            raise CommandLineError(
                f"{path} exists; nothing is overwritten. Choose another {key}=DIR or remove it."
            )


def run_command(name: str, argv: list[str], body: Callable[[list[str]], None], help_text: str) -> None:
    """Run a subcommand's `body` on `argv`: ``--help`` prints `help_text`; an error the user can fix ends the
    command with its one-line message and exit status 1."""
    if any(a in ("-h", "--help") for a in argv):
        print(help_text)
        return
    try:
        body(argv)
    except (CommandLineError, FileNotFoundError, ValueError, OSError, ImportError) as e:
        print(f"lazytrain {name}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def main(argv: list[str]) -> None:
    """Run ``predict`` (argv without the word ``predict``)."""
    run_command("predict", argv, _predict, __doc__)


def _predict(argv: list[str]) -> None:
    from lazytrain.errors import ConfigError

    source, image_arguments, overrides = split_arguments(argv)
    files = find_images(image_arguments)
    try:
        cfg, checkpoint = load_predict_config(source, overrides)
    except ConfigError as e:
        raise CommandLineError(str(e)) from None
    output_dir = str(cfg.predict.output_dir)
    refuse_existing([os.path.join(output_dir, "results.json")], "predict.output_dir")
    from lazytrain.program.predictor import Predictor, read_categories

    predictor = Predictor.from_config(
        cfg,
        checkpoint,
        device=cfg.predict.device,
        batch_size=cfg.predict.batch_size,
        categories=read_categories(source) if os.path.isdir(source) else None,
    )
    print(f"Predicting {len(files)} images with {checkpoint} on {predictor.device}", file=sys.stderr)
    start = time.perf_counter()
    written = _write_predictions(predictor, files, output_dir, cfg.predict)
    seconds = time.perf_counter() - start
    print(
        f"Predicted {written.images} images ({written.detections} detections) in {seconds:.1f} s "
        f"({written.images / seconds:.2f} images/s); wrote {written.describe(output_dir)}"
    )
    if written.skipped:
        print(f"Skipped {len(written.skipped)} unreadable images: " + "; ".join(written.skipped))


class _Written:
    """What `_write_predictions` wrote."""

    def __init__(self) -> None:
        self.images = 0
        self.detections = 0
        self.drawn = 0
        self.skipped: list[str] = []

    def describe(self, output_dir: str) -> str:
        files = ["results.json", "images.json"] + ([f"{self.drawn} pictures in drawn/"] if self.drawn else [])
        return f"{', '.join(files)} to {output_dir}"


def _read_images(files: list[str], on_bad_image: str, written: _Written):
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


def _batches(items, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_predictions(predictor: Any, files: list[str], output_dir: str, settings: DictConfig) -> _Written:
    from tqdm import tqdm

    written = _Written()
    images, results = [], []
    os.makedirs(output_dir, exist_ok=True)
    with tqdm(total=len(files), unit="img", desc="predict", file=sys.stderr) as progress:
        for batch in _batches(_read_images(files, settings.on_bad_image, written), predictor.batch_size):
            predictions = predictor.predict_tensors([image for _, image in batch])
            for (file, image), prediction in zip(batch, predictions):
                image_id = len(images)
                images.append({"id": image_id, "file_name": file, "height": prediction.height,
                               "width": prediction.width})  # fmt: skip
                results.extend(prediction.to_coco(image_id))
                written.detections += len(prediction)
                if settings.draw:
                    _draw(image, prediction, os.path.join(output_dir, "drawn"), file, written)
            progress.update(len(batch))
        progress.update(len(files) - progress.n)  # skipped files
    written.images = len(images)
    categories = [{"id": i, "name": n} for i, n in zip(predictor.categories.ids, predictor.categories.names)]
    write_json(os.path.join(output_dir, "images.json"), {"images": images, "categories": categories})
    write_json(os.path.join(output_dir, "results.json"), results)
    return written


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


def write_json(path: str, data: Any) -> None:
    """Write `data` as json to `path` atomically (a reader never sees half a file)."""
    from lazytrain.utils.file_io import atomic_write

    atomic_write(path, lambda f: f.write(json.dumps(data).encode()))
