"""`DatasetMapper`: one record -> the model input (image tensor + instances), with augmentations.

Output (docs/architecture.md): ``image`` uint8 [3, H, W] after augmentation; in training ``instances`` =
{``boxes`` float32 [N, 4] XYXY, ``classes`` int64 [N], ``masks`` uint8 [N, H, W]}; ``height``/``width`` of the
ORIGINAL image, ``image_id`` and ``file_name``.

Masks take one of two paths behind the same augmentation list:

- polygons (the default for polygon annotations): vertices are moved by each `Transform` and rasterized once,
  at the output size. RLE annotations are decoded and move as bitmaps.
- bitmaps: every mask is rasterized at the input size and moved as an image by torchvision. It is taken
  for every instance with ``rasterize_first=True``, and from the first plain torchvision v2 transform in the
  list onwards (those transforms do not know polygons).

The polygon path is the fast one, the more so the more instances an image has: it moves a few vertices per
instance and rasterizes each mask once, at the output size, where the bitmap path moves every mask's pixels
through each transform (docs/benchmarks.md, "DatasetMapper: polygon-first vs rasterize-first masks"). Polygons
are rasterized with pycocotools, the evaluators' rasterizer, inside each instance's bounding window.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from pycocotools import mask as mask_util
from torchvision import tv_tensors

from lazytrain.data.copy_paste import CopyPaste, mask_extents
from lazytrain.data.transforms import Augmentation
from lazytrain.utils.file_io import PathManager

__all__ = ["DatasetMapper", "read_image"]

_EXIF_ORIENTATION = 0x0112


def read_image(file_name: str, image_format: str = "RGB") -> np.ndarray:
    """Read an image through iopath with PIL, EXIF orientation applied, as uint8 [H, W, 3] in `image_format`.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        OSError: the file cannot be decoded (the message names it).
    """
    try:
        with PathManager.open(file_name, "rb") as f:
            image = Image.open(f)
            image.load()
        # exif_transpose and convert copy the image even when they have nothing to do (~10% of the read)
        if image.getexif().get(_EXIF_ORIENTATION, 1) != 1:
            image = ImageOps.exif_transpose(image)
        if image.mode != "RGB":
            image = image.convert("RGB")
        image = np.array(image)  # writable, for torch
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {file_name}") from None
    except Image.UnidentifiedImageError:
        raise OSError(f"cannot read image {file_name}: not an image file PIL can decode") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise OSError(f"cannot read image {file_name}: {e}") from e
    return np.ascontiguousarray(image[:, :, ::-1]) if image_format == "BGR" else image


class _Instances:
    """Per-image annotation state while augmenting: boxes, and masks as polygons and/or bitmaps.

    The polygon vertices of all instances live in one [V, 2] array, so a transform moves them in one call
    whatever the instance count: polygon k is ``vertices[ends[k - 1]:ends[k]]`` and belongs to instance
    ``owners[k]`` (an instance's polygons are consecutive).
    """

    def __init__(
        self, annotations: list[dict], height: int, width: int, with_masks: bool, rasterize: bool
    ) -> None:
        self.size = (height, width)
        boxes = np.array([a["bbox"] for a in annotations], dtype=np.float64).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # XYWH -> XYXY, in float64 like the json's numbers
        self.boxes = torch.from_numpy(boxes.astype(np.float32))
        self.classes = torch.tensor([a["category_id"] for a in annotations], dtype=torch.int64)
        self.with_masks = with_masks
        drawable: list[tuple[int, list[list[float]]]] = []  # (instance, polygons) moved as vertices
        self.bitmap_index: list[int] = []  # instances whose masks are the rows of `bitmaps` [M, H, W]
        bitmaps = []
        if with_masks:
            for i, annotation in enumerate(annotations):
                segmentation = annotation.get("segmentation")
                if segmentation is None:
                    raise ValueError(
                        f"DatasetMapper(use_instance_mask=True): annotation {i} has no 'segmentation'; "
                        "pass use_instance_mask=False to train boxes only"
                    )
                polygons = (
                    [p for p in segmentation if len(p) >= 6] if isinstance(segmentation, list) else None
                )
                if polygons and not rasterize:
                    drawable.append((i, polygons))
                elif polygons == []:  # nothing drawable: an empty mask, so the instance is dropped
                    self.bitmap_index.append(i)
                    bitmaps.append(np.zeros((height, width), dtype=np.uint8))
                else:
                    self.bitmap_index.append(i)
                    bitmaps.append(_decode(segmentation, height, width))
        self.vertices, self.ends, self.owners = _vertex_arrays(drawable)
        self.bitmaps = (
            torch.from_numpy(np.stack(bitmaps))
            if bitmaps
            else torch.zeros((0, height, width), dtype=torch.uint8)
        )

    def apply(self, transform: Any) -> None:
        """Apply a lazytrain `Transform` to boxes, bitmaps and polygon vertices."""
        self.boxes = transform.apply_boxes(self.boxes)
        if self.with_masks:
            if len(self.bitmaps):
                self.bitmaps = transform.apply_masks(self.bitmaps)
            if len(self.vertices):
                self.vertices = transform.apply_coords(self.vertices)
        self.size = transform.output_size()

    def drop_polygons(self) -> None:
        """Forget the polygons (after their masks were rasterized into `bitmaps`)."""
        self.vertices, self.ends, self.owners = self.vertices[:0], [], []

    def masks(self) -> tuple[torch.Tensor, np.ndarray]:
        """All instance masks [N, H, W] at the current size (polygons rasterized), and which are not empty."""
        out = np.zeros((len(self.boxes), *self.size), dtype=np.uint8)  # calloc: untouched pages cost nothing
        filled = np.zeros(len(self.boxes), dtype=bool)
        if self.bitmap_index:
            out[self.bitmap_index] = self.bitmaps.numpy()
            filled[self.bitmap_index] = self.bitmaps.flatten(1).amax(dim=1).numpy() > 0
        if self.ends:
            _rasterize(self.vertices, self.ends, self.owners, out, filled)
        return torch.from_numpy(out), filled

    def output(self, recompute_boxes: bool = False) -> dict[str, torch.Tensor]:
        """boxes/classes/masks of the instances still visible, boxes clipped to the image (or, with
        `recompute_boxes`, the extent of the masks)."""
        height, width = self.size
        boxes = self.boxes.numpy().copy()
        keep = np.ones(len(boxes), dtype=bool)
        output = {"boxes": torch.from_numpy(boxes), "classes": self.classes}
        if self.with_masks:
            output["masks"], keep = self.masks()
            if recompute_boxes:
                output["boxes"] = mask_extents(output["masks"])
                boxes = output["boxes"].numpy()
        np.clip(boxes[:, 0::2], 0, width, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, height, out=boxes[:, 1::2])
        keep &= (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        if keep.all():  # the usual case: no copy of the (possibly large) masks
            return output
        keep_index = torch.from_numpy(np.flatnonzero(keep))
        return {key: value[keep_index] for key, value in output.items()}


def _contiguous(image: torch.Tensor) -> torch.Tensor:
    """`image` in contiguous memory. Resizing leaves [C, H, W] images with channels-last strides; numpy moves
    them back faster than torch's uint8 copy."""
    return image if image.is_contiguous() else torch.from_numpy(np.ascontiguousarray(image.numpy()))


def _vertex_arrays(
    instances: list[tuple[int, list[list[float]]]],
) -> tuple[np.ndarray, list[int], list[int]]:
    """(instance, flat polygons) pairs -> all vertices [V, 2], the end of each polygon in them, its instance."""
    coords: list[float] = []
    ends: list[int] = []
    owners: list[int] = []
    for instance, polygons in instances:
        for polygon in polygons:
            coords.extend(polygon[: len(polygon) // 2 * 2])
            ends.append(len(coords) // 2)
            owners.append(instance)
    return np.array(coords, dtype=np.float64).reshape(-1, 2), ends, owners


def _decode(segmentation: Any, height: int, width: int) -> np.ndarray:
    """Polygons or RLE (compressed or not) -> uint8 [H, W]."""
    if isinstance(segmentation, list):
        out = np.zeros((1, height, width), dtype=np.uint8)
        _rasterize(*_vertex_arrays([(0, segmentation)]), out, np.zeros(1, dtype=bool))
        return out[0]
    if isinstance(segmentation.get("counts"), list):
        segmentation = mask_util.frPyObjects(segmentation, *segmentation["size"])
    mask = mask_util.decode(segmentation)
    if mask.shape != (height, width):
        raise ValueError(f"RLE mask of size {mask.shape} does not match its image ({height}, {width})")
    return mask


def _rasterize(
    vertices: np.ndarray, ends: list[int], owners: list[int], out: np.ndarray, filled: np.ndarray
) -> None:
    """Draw polygon k (``vertices[ends[k - 1]:ends[k]]``) into ``out[owners[k]]`` (uint8 [N, H, W]), each
    instance's polygons merged, and set ``filled[i]`` for the instances with at least one pixel.

    Uses pycocotools (the evaluators' rasterizer) on the instance's bounding window only, shifted by whole
    pixels (which does not change the result), so the cost follows the instances' areas, not N x H x W.
    """
    height, width = out.shape[1:]
    start = 0
    for first, last in _runs(owners):  # polygons first..last-1 belong to one instance
        points = vertices[start : ends[last - 1]]
        x0, y0 = (math.floor(v) - 1 for v in points.min(axis=0).tolist())
        x1, y1 = (math.ceil(v) + 1 for v in points.max(axis=0).tolist())
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
        if x1 > x0 and y1 > y0:
            shifted = (vertices[start : ends[last - 1]] - (x0, y0)).reshape(-1)
            cuts = [2 * (e - start) for e in ends[first:last]]
            rles = mask_util.frPyObjects(
                [shifted[a:b].tolist() for a, b in zip([0, *cuts[:-1]], cuts)], y1 - y0, x1 - x0
            )
            window = mask_util.decode(mask_util.merge(rles) if len(rles) > 1 else rles[0])
            out[owners[first], y0:y1, x0:x1] = window
            filled[owners[first]] = window.any()
        start = ends[last - 1]


def _runs(owners: list[int]) -> Iterator[tuple[int, int]]:
    """(first, last + 1) of each run of equal values in `owners`."""
    first = 0
    for k in range(1, len(owners) + 1):
        if k == len(owners) or owners[k] != owners[first]:
            yield first, k
            first = k


def _read_record_image(record: dict) -> torch.Tensor:
    """The record's image as uint8 [3, H, W] RGB, checked against the record's ``height``/``width``."""
    file_name = record["file_name"]
    array = read_image(file_name, "RGB")
    height, width = array.shape[:2]
    if (record.get("height", height), record.get("width", width)) != (height, width):
        raise ValueError(
            f"image {file_name} is {width}x{height} (after EXIF orientation) but its record says "
            f"{record['width']}x{record['height']}; fix the annotation file"
        )
    return torch.from_numpy(array).permute(2, 0, 1)


class DatasetMapper:
    """Read the image, augment image and annotations consistently, and build the model input.

    Args:
        is_train: produce ``instances``; in eval mode annotations are dropped (image, sizes and id stay).
        augmentations: applied in order; lazytrain `Augmentation` objects (``ResizeShortestEdge``,
            ``RandomFlip``, your own) and/or torchvision v2 transforms (called on the image, boxes and masks).
        image_format: channel order of the output image, "RGB" or "BGR".
        use_instance_mask: produce ``instances.masks``.
        rasterize_first: rasterize every mask at the input size and transform bitmaps (slower with many
            instances; the default moves polygon vertices and rasterizes once at the output size).
        recompute_boxes: replace each box by the extent of its mask after augmentation; use it with crops or
            rotations (torchvision transforms), which leave the transformed box looser than the object.
        copy_paste: paste objects of another training image, mapped with the same augmentations, onto each
            image (`lazytrain.data.copy_paste`); it draws them from the dataset the train loader attaches
            (`attach_dataset`).

    Raises (when called):
        FileNotFoundError / OSError: the image is missing or unreadable (the message names the file).
        ValueError: the decoded image size differs from the record's ``height``/``width``.
    """

    def __init__(
        self,
        is_train: bool,
        augmentations: Sequence[Any] = (),
        image_format: str = "RGB",
        use_instance_mask: bool = True,
        *,
        rasterize_first: bool = False,
        recompute_boxes: bool = False,
        copy_paste: CopyPaste | None = None,
    ) -> None:
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"DatasetMapper(image_format=) must be 'RGB' or 'BGR'; got {image_format!r}")
        for augmentation in augmentations:
            if not isinstance(augmentation, Augmentation) and not callable(augmentation):
                raise TypeError(
                    "DatasetMapper(augmentations=) takes lazytrain Augmentations or torchvision v2 transforms; "
                    f"got {augmentation!r}"
                )
        self.is_train = is_train
        self.augmentations = list(augmentations)
        self.image_format = image_format
        self.use_instance_mask = use_instance_mask
        self.rasterize_first = rasterize_first
        if recompute_boxes and not use_instance_mask:
            raise ValueError(
                "DatasetMapper(recompute_boxes=True) needs use_instance_mask=True (boxes come from masks)"
            )
        self.recompute_boxes = recompute_boxes
        if copy_paste is not None and not (is_train and use_instance_mask):
            raise ValueError(
                "DatasetMapper(copy_paste=) pastes objects with their masks in training: it needs is_train=True "
                f"and use_instance_mask=True; got is_train={is_train}, use_instance_mask={use_instance_mask}"
            )
        self.copy_paste = copy_paste

    def attach_dataset(self, dataset: Sequence[dict]) -> None:
        """Give copy-paste the records to draw its source images from (`build_detection_train_loader` passes
        its own dataset); nothing to do without ``copy_paste``."""
        if self.copy_paste is not None:
            self.copy_paste.attach_dataset(dataset)

    def __call__(self, record: dict) -> dict:
        """Map one record (see docs/architecture.md) to the model input dict."""
        image = _read_record_image(record)
        height, width = image.shape[-2:]
        instances = None
        if not self.is_train:
            image = self._finish(self._augment(image, None))
        elif self.copy_paste is None:
            image, instances = self._map_annotated(record, image)
        else:
            image, instances = self.copy_paste(
                *self._map_annotated(record, image),
                lambda source: self._map_annotated(source, _read_record_image(source)),
            )
        output = {
            "image": image,
            "height": record.get("height", height),
            "width": record.get("width", width),
            "image_id": record.get("image_id"),
            "file_name": record["file_name"],
        }
        if instances is not None:
            output["instances"] = instances
        return output

    def _map_annotated(
        self, record: dict, image: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The augmented image and instances of a training record whose image is `image` (uint8 [3, H, W])."""
        annotations = [a for a in record.get("annotations", []) if not a.get("iscrowd", 0)]
        height, width = image.shape[-2:]
        instances = _Instances(annotations, height, width, self.use_instance_mask, self.rasterize_first)
        image = self._finish(self._augment(image, instances))
        return image, instances.output(self.recompute_boxes)

    def map_image(self, image: torch.Tensor) -> torch.Tensor:
        """The model input image of an image that has no record: what `__call__` gives as ``image``.

        For prediction on new images (`lazytrain.program.predictor.Predictor`): the test mapper's
        augmentations (its test-time resize) and channel order, without reading a file or annotations.

        Args:
            image: uint8 [3, H, W] RGB.
        """
        return self._finish(self._augment(image, None))

    def _finish(self, image: torch.Tensor) -> torch.Tensor:
        return _contiguous(image.flip(0) if self.image_format == "BGR" else image)

    def _augment(self, image: torch.Tensor, instances: _Instances | None) -> torch.Tensor:
        for augmentation in self.augmentations:
            if isinstance(augmentation, Augmentation):
                transform = augmentation.get_transform(*image.shape[-2:])
                if transform is not None:
                    image = transform.apply_image(image)
                    if instances is not None:
                        instances.apply(transform)
            elif instances is None:
                image = augmentation(tv_tensors.Image(image)).as_subclass(torch.Tensor)
            else:
                image = self._apply_torchvision(augmentation, image, instances)
        return image

    @staticmethod
    def _apply_torchvision(augmentation: Any, image: torch.Tensor, instances: _Instances) -> torch.Tensor:
        """Call a torchvision v2 transform on image, boxes, labels and masks together (one random draw)."""
        height, width = image.shape[-2:]
        boxes = tv_tensors.BoundingBoxes(instances.boxes, format="XYXY", canvas_size=(height, width))
        # "labels" lets transforms that drop instances (SanitizeBoundingBoxes) drop their classes too
        inputs = {"image": tv_tensors.Image(image), "boxes": boxes, "labels": instances.classes}
        if instances.with_masks:
            inputs["masks"] = tv_tensors.Mask(instances.masks()[0])
            instances.drop_polygons()
        outputs = augmentation(inputs)
        image = outputs["image"].as_subclass(torch.Tensor)
        instances.boxes = outputs["boxes"].as_subclass(torch.Tensor).float()
        instances.classes = outputs["labels"]
        if instances.with_masks:
            instances.bitmaps = outputs["masks"].as_subclass(torch.Tensor)
            instances.bitmap_index = list(range(len(instances.bitmaps)))
        instances.size = tuple(image.shape[-2:])
        return image
