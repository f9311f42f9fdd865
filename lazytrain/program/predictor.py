"""`Predictor`: a trained run's model on new images, in their original pixel coordinates.

    from lazytrain.program.predictor import Predictor

    predictor = Predictor.from_run("runs/a")                           # config.yaml + the newest checkpoint
    prediction = predictor("photo.jpg")                                # or a list: paths, PIL, numpy, tensors
    prediction.boxes, prediction.scores, prediction.class_names, prediction.masks

The model is built once from the run's ``config.yaml`` and put in eval mode; each image goes through the run's
test mapper (``dataloader.test.mapper``: its test-time resize and channel order), so a prediction equals what
evaluation computed for the same image file and weights. Images are predicted in batches of
``dataloader.test.batch_size`` by default.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import Tensor

from lazytrain.config import instantiate
from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.mappers import DatasetMapper, read_image
from lazytrain.evaluation.predictions import ImagePredictions, get_coco_entries, pack_instances
from lazytrain.modeling.weights import load_init_weights
from lazytrain.program.run_command import load_run, without_initial_weights, write_json

__all__ = [
    "CATEGORIES_FILE",
    "Categories",
    "ImageInput",
    "Prediction",
    "Predictor",
    "get_categories",
    "read_categories",
    "save_categories",
    "to_image_tensor",
]

logger = logging.getLogger(__name__)

ImageInput = str | os.PathLike | Image.Image | np.ndarray | Tensor
"""A file path (read with EXIF orientation, as the loaders do), a PIL image, a uint8 [H, W, 3] RGB array or a
uint8 [3, H, W] RGB tensor."""


class Categories(NamedTuple):
    """The classes a model predicts: ``names[c]`` and json category id ``ids[c]`` of contiguous class c."""

    names: list[str]
    ids: list[int]


@dataclass
class Prediction:
    """One image's detections, on the CPU, in the image's original pixel coordinates.

    Attributes:
        boxes: float32 [N, 4] XYXY.
        scores: float32 [N].
        classes: int64 [N], contiguous class ids 0..K-1 (``categories.names[c]`` is the name).
        masks: uint8 [N, height, width] bitmaps (0/1), None for a box-only model. `to_coco` encodes them
            as compressed RLE.
        height: the image's height in pixels.
        width: the image's width in pixels.
        categories: the model's classes.
    """

    boxes: Tensor
    scores: Tensor
    classes: Tensor
    masks: Tensor | None
    height: int
    width: int
    categories: Categories

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def class_names(self) -> list[str]:
        """The class name of each detection."""
        return [self.categories.names[c] for c in self.classes.tolist()]

    @property
    def category_ids(self) -> list[int]:
        """The json category id of each detection."""
        return [self.categories.ids[c] for c in self.classes.tolist()]

    def to_coco(self, image_id: int) -> list[dict[str, Any]]:
        """COCO result dicts (``image_id``, ``category_id``, ``bbox`` XYWH, ``score``, ``segmentation`` as
        compressed RLE): what the evaluators write to ``*_instances_results.json``."""
        return get_coco_entries(self.to_image_predictions(image_id))

    def to_image_predictions(self, image_id: int) -> ImagePredictions:
        """The detections as the evaluators keep them; `lazytrain.evaluation.predictions.write_coco_results`
        streams these into a COCO results json."""
        instances = {"boxes": self.boxes, "scores": self.scores, "classes": self.classes}
        if self.masks is not None:
            instances["masks"] = self.masks
        return pack_instances(instances, image_id, self.categories.ids)


def to_image_tensor(image: ImageInput) -> Tensor:
    """Any `ImageInput` as a uint8 [3, H, W] RGB tensor.

    Raises:
        FileNotFoundError / OSError: a path that is missing or not a readable image (named).
        TypeError / ValueError: an array or tensor of another type or shape.
    """
    if isinstance(image, (str, os.PathLike)):
        return torch.from_numpy(read_image(os.fspath(image))).permute(2, 0, 1)
    if isinstance(image, Image.Image):
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(
                f"Predictor: numpy images must be uint8 [H, W, 3] RGB; got {image.dtype} {list(image.shape)}. "
                "Convert with np.asarray(PIL.Image.open(path).convert('RGB'))."
            )
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    if isinstance(image, Tensor):
        if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(
                f"Predictor: tensor images must be uint8 [3, H, W] RGB (0-255); got {image.dtype} "
                f"{list(image.shape)}. From a float image in [0, 1]: (image * 255).round().to(torch.uint8)."
            )
        return image.cpu()
    raise TypeError(
        "Predictor: an image must be a file path, a PIL image, a uint8 [H, W, 3] numpy array or a uint8 "
        f"[3, H, W] tensor; got {type(image).__name__}"
    )


CATEGORIES_FILE = "categories.json"
"""Written into a run's directory when training starts (`save_categories`): ``[{"id", "name"}, ...]`` in
contiguous class order, so a run predicts with its class names where its data set is not at hand."""


def get_categories(cfg: DictConfig, loader: str = "test") -> Categories | None:
    """Class names and json category ids of a data set of the config (``dataloader.<loader>.dataset.names``,
    the first when several), from its `MetadataCatalog` entry (loading the data set fills it); None when the
    config names no data set there."""
    node = cfg.get("dataloader", {}).get(loader, {}).get("dataset", {})
    names_node = node.get("names") if hasattr(node, "get") else None
    if names_node is None:
        return None
    names = instantiate(names_node)  # a name, a list, or a registration (a user's json) returning its name
    name = names if isinstance(names, str) else list(names)[0]
    metadata = MetadataCatalog.get(name)
    if metadata.get("thing_classes") is None:
        DatasetCatalog.get(name)  # loading the records fills the metadata
    mapping = metadata.get("thing_dataset_id_to_contiguous_id") or {}
    inverse = {int(contiguous): int(json_id) for json_id, contiguous in mapping.items()}
    classes = list(metadata.thing_classes)
    return Categories(classes, [inverse.get(c, c + 1) for c in range(len(classes))])


def save_categories(directory: str, categories: Categories) -> None:
    """Write `categories` to ``directory/categories.json`` (`CATEGORIES_FILE`)."""
    entries = [{"id": i, "name": n} for i, n in zip(categories.ids, categories.names)]
    write_json(os.path.join(directory, CATEGORIES_FILE), entries)


def read_categories(directory: str) -> Categories | None:
    """The categories a run saved (`save_categories`), None for a run without the file."""
    path = os.path.join(directory, CATEGORIES_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        entries = json.load(f)
    return Categories([e["name"] for e in entries], [int(e["id"]) for e in entries])


def _unnamed_categories(num_classes: int) -> Categories:
    logger.warning(
        "Predictor: no %s in the run and no dataloader.test.dataset in its config; classes are unnamed.",
        CATEGORIES_FILE,
    )
    return Categories([f"class {c}" for c in range(num_classes)], list(range(1, num_classes + 1)))


class Predictor:
    """Predict with a built model: images in any `ImageInput` form, `Prediction` objects out.

    Args:
        model: a lazytrain `RCNN` (or any model taking mapper dicts and returning ``{"instances": ...}`` in
            the original image size); it is put in eval mode.
        mapper: the test mapper whose `DatasetMapper.map_image` prepares each image.
        categories: the model's class names and json category ids.
        batch_size: images per forward pass.
    """

    def __init__(
        self, model: torch.nn.Module, mapper: DatasetMapper, categories: Categories, *, batch_size: int = 1
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"Predictor(batch_size=) must be >= 1; got {batch_size}")
        self.model = model.eval()
        self.mapper = mapper
        self.categories = categories
        self.batch_size = int(batch_size)

    @property
    def device(self) -> torch.device:
        """Where the model runs (the CPU for an export's `ExportedModel`, whose weights are not parameters)."""
        parameter = next(self.model.parameters(), None)
        return torch.device("cpu") if parameter is None else parameter.device

    @classmethod
    def from_run(
        cls,
        run_dir: str | os.PathLike,
        *,
        checkpoint: str | None = None,
        device: str | None = None,
        overrides: Sequence[str] = (),
        batch_size: int | None = None,
    ) -> Predictor:
        """The model of a training run, with its weights, on `device` (the run is read by
        `lazytrain.program.run_command.load_run`).

        Args:
            run_dir: a run's output directory (``config.yaml`` and its checkpoints), or a config file whose
                weights `checkpoint` names.
            checkpoint: a weights file (a path, or a name in `run_dir` such as ``model_0000299.pth``); default:
                the newest (``last_checkpoint``), else ``model_final.pth``.
            device: ``cpu``, ``cuda``, ``cuda:1``, ...; default: ``cuda`` when available, else ``cpu``.
            overrides: key=value overrides of the run's config (Hydra grammar), e.g.
                ``["model.roi_heads.score_thresh=0.5", "model.roi_heads.detections_per_img=100"]``.
            batch_size: images per forward pass; default: the run's ``dataloader.test.batch_size`` (or 1).
        """
        run_dir = os.fspath(run_dir)
        cfg, weights = load_run(run_dir, overrides, checkpoint=checkpoint)
        return cls.from_config(
            cfg,
            weights,
            device=device,
            batch_size=batch_size,
            categories=read_categories(run_dir),
        )

    @classmethod
    def from_config(
        cls,
        cfg: DictConfig,
        checkpoint: str,
        *,
        device: str | None = None,
        batch_size: int | None = None,
        categories: Categories | None = None,
    ) -> Predictor:
        """Build ``cfg.model`` and ``cfg.dataloader.test.mapper`` and load `checkpoint` (see `from_run`);
        `categories` default to those of the config's test data set. The model is built without the initial
        weights its config names (`without_initial_weights`): the checkpoint holds every weight."""
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"Predictor: checkpoint {checkpoint} not found.")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = instantiate(without_initial_weights(cfg).model)
        allow_unsafe = bool(OmegaConf.select(cfg, "train.allow_unsafe_checkpoint", default=False))
        _load_weights(model, checkpoint, allow_unsafe=allow_unsafe)
        model.to(device)
        num_classes = int(getattr(model, "num_classes", 0) or 0)
        return cls(model, *_test_parts(cfg, categories, num_classes), batch_size=_batch_size(cfg, batch_size))

    @classmethod
    def from_exported(
        cls,
        cfg: DictConfig,
        file: str,
        *,
        batch_size: int | None = None,
        categories: Categories | None = None,
    ) -> Predictor:
        """A file written by ``python -m lazytrain export`` (``model.pt2``, ``model_aoti.pt2`` or ``model.onnx``)
        in place of the model, with ``cfg.dataloader.test.mapper`` (the run's config, as for `from_config`):
        the code path a deployment runs, on the CPU.

        The detections are those above ``cfg.model.roi_heads.score_thresh``, at most
        ``cfg.model.roi_heads.detections_per_img`` per image, as with the weights (`ExportedModel.limit`); a
        threshold below the one the file applies itself, or more detections than it keeps (its
        ``model.json``), is refused with a ValueError naming the key."""
        from lazytrain.modeling.exported import (
            DESCRIPTION_FILE,
            check_limits,
            load_exported,
            read_built_in_limits,
        )

        score_thresh = OmegaConf.select(cfg, "model.roi_heads.score_thresh")
        detections_per_img = OmegaConf.select(cfg, "model.roi_heads.detections_per_img")
        limited = score_thresh is not None and detections_per_img is not None
        if limited:  # refused before the file is read: loading a program takes seconds
            check_limits(file, read_built_in_limits(file), score_thresh, detections_per_img)
        model = load_exported(file)
        if limited:
            if model.built_in is None:
                logger.warning(
                    "Predictor: no %s beside %s says which threshold and detections per image it applies itself; "
                    "a lower model.roi_heads.score_thresh or more detections cannot be checked.",
                    DESCRIPTION_FILE,
                    file,
                )
            model.limit(score_thresh, detections_per_img)
        num_classes = int(cfg.model.get("num_classes", 0) or 0)
        parts = _test_parts(cfg, categories, num_classes)
        return cls(model, *parts, batch_size=_batch_size(cfg, batch_size))

    def __call__(self, images: ImageInput | Sequence[ImageInput]) -> Prediction | list[Prediction]:
        """Predict one image (returns a `Prediction`) or a list of them (returns a list)."""
        if isinstance(images, (list, tuple)):
            return list(self.predict(images))
        return next(iter(self.predict([images])))

    def predict(self, images: Iterable[ImageInput]) -> Iterator[Prediction]:
        """Yield the `Prediction` of each image in order, predicting `batch_size` images at a time."""
        batch: list[Tensor] = []
        for image in images:
            batch.append(to_image_tensor(image))
            if len(batch) == self.batch_size:
                yield from self.predict_tensors(batch)
                batch = []
        if batch:
            yield from self.predict_tensors(batch)

    @torch.inference_mode()
    def predict_tensors(self, images: Sequence[Tensor]) -> list[Prediction]:
        """Predict uint8 [3, H, W] RGB tensors in one forward pass."""
        inputs = [
            {"image": self.mapper.map_image(image), "height": image.shape[1], "width": image.shape[2]}
            for image in images
        ]
        outputs = self.model(inputs)
        return [self._to_prediction(output["instances"], record) for output, record in zip(outputs, inputs)]

    def _to_prediction(self, instances: dict[str, Tensor], record: dict[str, Any]) -> Prediction:
        masks = instances.get("masks")
        return Prediction(
            boxes=instances["boxes"].float().cpu(),
            scores=instances["scores"].float().cpu(),
            classes=instances["classes"].long().cpu(),
            masks=None if masks is None else masks.cpu(),
            height=int(record["height"]),
            width=int(record["width"]),
            categories=self.categories,
        )


def _test_parts(
    cfg: DictConfig, categories: Categories | None, num_classes: int
) -> tuple[DatasetMapper, Categories]:
    """The config's test mapper, and `categories` or else those of its test data set (else unnamed)."""
    if categories is None:
        categories = get_categories(cfg) or _unnamed_categories(num_classes)
    return instantiate(cfg.dataloader.test.mapper), categories


def _batch_size(cfg: DictConfig, batch_size: int | None) -> int:
    """`batch_size`, else the config's ``dataloader.test.batch_size`` (else 1)."""
    return batch_size if batch_size is not None else int(cfg.dataloader.test.get("batch_size", 1) or 1)


def _load_weights(model: torch.nn.Module, checkpoint: str, *, allow_unsafe: bool = False) -> None:
    """Load `checkpoint` into `model`; every key must fit (a prediction from half-loaded weights is wrong).

    The file is read as ``train.init_checkpoint`` reads it (`load_init_weights`): a lazytrain checkpoint (its
    EMA weights when it has them), a torchvision state dict, or a detectron2 ``.pkl``/``.pth``, converted."""
    report = load_init_weights(model, checkpoint, allow_unsafe=allow_unsafe)
    problems = report.missing + [key for key, _, _ in report.shape_mismatched]
    if problems:
        raise ValueError(
            f"Predictor: the weights in {checkpoint} do not fit the config's model ({len(problems)} keys "
            f"missing or of another shape, e.g. {problems[:3]}). Use the config the checkpoint was trained with."
        )
