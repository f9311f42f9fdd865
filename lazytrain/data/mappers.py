"""`DatasetMapper`: one record -> the model's input (image tensor + instances), with augmentations.

Output (see docs/architecture.md): ``image`` uint8 [3, H, W] RGB after augmentation; in training
``instances`` = {``boxes`` float32 [N, 4] XYXY, ``classes`` int64 [N], ``masks`` uint8 [N, H, W]};
``height``/``width`` of the ORIGINAL image, ``image_id``, ``file_name``. Instances the transforms leave
empty are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from lazytrain.data.datasets.coco import PathManager
from lazytrain.data.transforms import Augmentation, Transform

__all__ = ["DatasetMapper", "read_image"]


def read_image(file_name: str, image_format: str = "RGB") -> np.ndarray:
    """Read an image through iopath with EXIF orientation applied, as uint8 HWC in `image_format`.

    Raises:
        FileNotFoundError / OSError: naming the file when it is missing or unreadable.
    """
    try:
        with PathManager.open(file_name, "rb") as f:
            image = ImageOps.exif_transpose(Image.open(f))
            image = np.asarray(image.convert("RGB"))
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {file_name}") from None
    except OSError as e:
        raise OSError(f"cannot read image {file_name}: {e}") from e
    return image[:, :, ::-1].copy() if image_format == "BGR" else image


def _polygons_to_mask(polygons: list[np.ndarray], height: int, width: int) -> np.ndarray:
    from pycocotools import mask as mask_util

    rles = mask_util.frPyObjects([p.reshape(-1).tolist() for p in polygons], height, width)
    return mask_util.decode(mask_util.merge(rles)).astype(np.uint8)


def _rle_to_mask(rle: dict, height: int, width: int) -> np.ndarray:
    from pycocotools import mask as mask_util

    if isinstance(rle["counts"], list):
        rle = mask_util.frPyObjects(rle, height, width)
    return mask_util.decode(rle).astype(np.uint8)


class DatasetMapper:
    """Read the image, apply augmentations to image and annotations, and build the model input.

    Args:
        is_train: keep annotations (eval mode drops them and keeps image, sizes and ids).
        augmentations: applied in order, e.g. ``[ResizeShortestEdge(...), RandomFlip()]``.
        image_format: "RGB" or "BGR" channel order of the output.
        use_instance_mask: produce ``instances.masks``.
    """

    def __init__(
        self,
        is_train: bool,
        augmentations: Sequence[Augmentation] = (),
        image_format: str = "RGB",
        use_instance_mask: bool = True,
    ) -> None:
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"DatasetMapper(image_format=) must be 'RGB' or 'BGR'; got {image_format!r}")
        self.is_train = is_train
        self.augmentations = list(augmentations)
        self.image_format = image_format
        self.use_instance_mask = use_instance_mask

    def __call__(self, record: dict) -> dict:
        image = read_image(record["file_name"], self.image_format)
        original_height, original_width = image.shape[:2]
        transforms: list[Transform] = []
        for augmentation in self.augmentations:
            transform = augmentation.get_transform(*image.shape[:2])
            if transform is not None:
                image = transform.apply_image(image)
                transforms.append(transform)
        output = {
            "image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
            "height": record.get("height", original_height),
            "width": record.get("width", original_width),
            "image_id": record.get("image_id"),
            "file_name": record["file_name"],
        }
        if self.is_train:
            output["instances"] = self._instances(
                record, transforms, (original_height, original_width), image.shape[:2]
            )
        return output

    def _instances(
        self, record: dict, transforms: list[Transform], original_size: tuple[int, int], size: tuple[int, int]
    ) -> dict:
        height, width = size
        annotations = [a for a in record.get("annotations", []) if not a.get("iscrowd", 0)]
        boxes = np.array(
            [[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in annotations)], dtype=np.float64
        ).reshape(-1, 4)
        for transform in transforms:
            boxes = transform.apply_box(boxes)
        boxes = np.clip(boxes, 0, [width, height, width, height])
        masks = []
        if self.use_instance_mask:
            masks = [self._mask(a.get("segmentation"), transforms, original_size, size) for a in annotations]
        keep = [
            i
            for i in range(len(annotations))
            if boxes[i, 2] > boxes[i, 0] and boxes[i, 3] > boxes[i, 1] and (not masks or masks[i].any())
        ]
        instances = {
            "boxes": torch.as_tensor(boxes[keep], dtype=torch.float32).reshape(-1, 4),
            "classes": torch.as_tensor([annotations[i]["category_id"] for i in keep], dtype=torch.int64),
        }
        if self.use_instance_mask:
            stacked = np.stack([masks[i] for i in keep]) if keep else np.zeros((0, height, width), np.uint8)
            instances["masks"] = torch.from_numpy(stacked)
        return instances

    @staticmethod
    def _mask(
        segmentation, transforms: list[Transform], original_size: tuple[int, int], size: tuple[int, int]
    ) -> np.ndarray:
        if segmentation is None:
            raise ValueError("DatasetMapper(use_instance_mask=True) needs 'segmentation' in every annotation")
        if isinstance(segmentation, dict):
            mask = _rle_to_mask(segmentation, *original_size)
            for transform in transforms:
                mask = transform.apply_mask(mask)
            return mask
        polygons = [np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in segmentation]
        for transform in transforms:
            polygons = [transform.apply_coords(p) for p in polygons]
        return _polygons_to_mask(polygons, *size)
