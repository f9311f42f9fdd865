"""Instances drawn on images, and image grids: what the data and the predictions look like.

Works on uint8 HWC RGB numpy arrays with PIL and numpy only. ``scripts/visualize_data.py`` and
``scripts/visualize_predictions.py`` are thin wrappers. Training curves and the long-tail plots are in
`lazytrain.utils.plots`; reading run directories is `lazytrain.utils.run_dirs`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "draw_instances",
    "draw_record",
    "draw_mapped_sample",
    "draw_coco_results",
    "make_grid",
    "save_image",
    "save_gallery",
]

# Tableau-like palette: distinct, readable on photos and on the synthetic backgrounds.
_PALETTE = np.array(
    [
        (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
        (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
        (174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
    ],
    dtype=np.uint8,
)  # fmt: skip


def _get_color(index: int) -> tuple[int, int, int]:
    return tuple(int(c) for c in _PALETTE[index % len(_PALETTE)])


def draw_instances(
    image: np.ndarray,
    boxes: np.ndarray | None = None,
    *,
    masks: np.ndarray | None = None,
    labels: Sequence[str] | None = None,
    color_ids: Sequence[int] | None = None,
    mask_alpha: float = 0.45,
) -> np.ndarray:
    """Draw boxes, masks and labels of N instances on a copy of `image`.

    Args:
        image: uint8 [H, W, 3] RGB.
        boxes: [N, 4] XYXY in pixels, or None to draw masks only.
        masks: [N, H, W] binary, blended with `mask_alpha`.
        labels: N strings written at the top-left corner of each box (or mask).
        color_ids: N ints picking the palette colour (e.g. class ids, so a class keeps its colour);
            default: instance index.

    Returns:
        A new uint8 [H, W, 3] array.
    """
    canvas = np.asarray(image, dtype=np.uint8)[..., :3].copy()
    num = len(boxes) if boxes is not None else len(masks) if masks is not None else 0
    colors = [_get_color(i if color_ids is None else int(color_ids[i])) for i in range(num)]
    if masks is not None:
        for mask, color in zip(np.asarray(masks).astype(bool), colors):
            canvas[mask] = (canvas[mask] * (1 - mask_alpha) + np.array(color) * mask_alpha).astype(np.uint8)
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    for i, color in enumerate(colors):
        if boxes is not None:
            x0, y0, x1, y1 = (float(v) for v in boxes[i])
            draw.rectangle([x0, y0, x1, y1], outline=color, width=max(1, round(min(canvas.shape[:2]) / 200)))
        elif masks is not None and masks[i].any():
            ys, xs = np.nonzero(masks[i])
            x0, y0 = float(xs.min()), float(ys.min())
        else:
            continue
        if labels is not None:
            _draw_label(draw, labels[i], (x0, y0), color)
    return np.asarray(picture)


def _draw_label(draw: ImageDraw.ImageDraw, text: str, corner: tuple[float, float], color: tuple) -> None:
    left, top, right, bottom = draw.textbbox((0, 0), text)
    width, height = right - left + 2, bottom - top + 2
    x = max(0.0, min(corner[0], draw.im.size[0] - width))  # keep the label inside the image
    y = corner[1] - height if corner[1] >= height else corner[1]
    draw.rectangle([x, y, x + width, y + height], fill=color)
    draw.text((x + 1 - left, y + 1 - top), text, fill=(255, 255, 255))


def _decode_segmentation(segmentation: list | dict, height: int, width: int) -> np.ndarray:
    from pycocotools import mask as mask_util

    if isinstance(segmentation, list):  # polygons
        rles = mask_util.frPyObjects([list(map(float, p)) for p in segmentation], height, width)
        rle = mask_util.merge(rles)
    elif isinstance(segmentation["counts"], list):  # uncompressed RLE
        rle = mask_util.frPyObjects(segmentation, height, width)
    else:
        rle = dict(
            segmentation,
            counts=segmentation["counts"].encode()
            if isinstance(segmentation["counts"], str)
            else segmentation["counts"],
        )
    return mask_util.decode(rle).astype(np.uint8)


def _xywh_to_xyxy(boxes: Sequence[Sequence[float]]) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    return np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)


def _class_name(class_names: Sequence[str] | dict | None, index: int) -> str:
    if class_names is None:
        return str(index)
    try:
        return str(class_names[index])
    except (IndexError, KeyError):
        return str(index)


def draw_record(image: np.ndarray, record: dict, class_names: Sequence[str] | None = None) -> np.ndarray:
    """Draw a dataset record's annotations (XYWH boxes, polygon/RLE masks, contiguous category ids).

    Args:
        image: the record's image, uint8 [H, W, 3] RGB (e.g. from `lazytrain.data.mappers.read_image`).
        record: a dataset dict as in docs/architecture.md.
        class_names: ``MetadataCatalog.get(name).thing_classes``; ids are written when None.
    """
    annotations = record.get("annotations", [])
    height, width = image.shape[:2]
    boxes = _xywh_to_xyxy([a["bbox"] for a in annotations])
    masks = None
    if annotations and all("segmentation" in a for a in annotations):
        masks = np.stack([_decode_segmentation(a["segmentation"], height, width) for a in annotations])
    classes = [int(a["category_id"]) for a in annotations]
    labels = [_class_name(class_names, c) for c in classes]
    return draw_instances(image, boxes, masks=masks, labels=labels, color_ids=classes)


def draw_mapped_sample(
    sample: dict, class_names: Sequence[str] | None = None, *, bgr: bool = False
) -> np.ndarray:
    """Draw a mapper output (``image`` [3, H, W] tensor after augmentation, ``instances`` boxes/classes/masks).

    Args:
        class_names: ``MetadataCatalog.get(name).thing_classes``; ids are written when None.
        bgr: the mapper produced BGR images (``image_format="BGR"``).
    """
    image = sample["image"].permute(1, 2, 0).cpu().numpy()
    if bgr:
        image = image[..., ::-1]
    instances = sample.get("instances") or {}
    if "boxes" not in instances:
        return np.ascontiguousarray(image)
    classes = instances["classes"].tolist()
    masks = instances["masks"].cpu().numpy() if "masks" in instances else None
    labels = [_class_name(class_names, c) for c in classes]
    return draw_instances(
        image, instances["boxes"].cpu().numpy(), masks=masks, labels=labels, color_ids=classes
    )


def draw_coco_results(
    image: np.ndarray,
    results: Sequence[dict],
    class_names: dict[int, str] | None = None,
    score_thresh: float = 0.5,
) -> np.ndarray:
    """Draw COCO-format detections of one image (json category ids, XYWH boxes, optional RLE masks).

    Args:
        results: entries of ``coco_instances_results.json`` / ``lvis_instances_results.json`` for this image.
        class_names: json category id -> name; ids are written when None.
        score_thresh: drop detections scoring below it.
    """
    kept = sorted((r for r in results if r["score"] >= score_thresh), key=lambda r: -r["score"])
    height, width = image.shape[:2]
    boxes = _xywh_to_xyxy([r["bbox"] for r in kept])
    masks = None
    if kept and all("segmentation" in r for r in kept):
        masks = np.stack([_decode_segmentation(r["segmentation"], height, width) for r in kept])
    labels = [f"{_class_name(class_names, r['category_id'])} {r['score']:.2f}" for r in kept]
    color_ids = [int(r["category_id"]) for r in kept]
    return draw_instances(image, boxes, masks=masks, labels=labels, color_ids=color_ids)


def make_grid(
    images: Sequence[np.ndarray], columns: int | None = None, cell_size: int = 256, pad: int = 4
) -> np.ndarray:
    """Tile images into one, each scaled to fit a `cell_size` square (aspect kept) on a white background.

    Args:
        columns: default ceil(sqrt(len(images))).
    """
    if not images:
        raise ValueError("make_grid(images=) needs at least one image; got an empty list.")
    columns = columns or math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / columns)
    step = cell_size + pad
    grid = Image.new("RGB", (columns * step + pad, rows * step + pad), (255, 255, 255))
    for index, image in enumerate(images):
        tile = Image.fromarray(np.asarray(image, dtype=np.uint8))
        tile.thumbnail((cell_size, cell_size))
        row, column = divmod(index, columns)
        x = pad + column * step + (cell_size - tile.width) // 2
        y = pad + row * step + (cell_size - tile.height) // 2
        grid.paste(tile, (x, y))
    return np.asarray(grid)


def save_image(image: np.ndarray, path: str) -> None:
    """Write a uint8 HWC RGB array (PNG when `path` ends in .png), creating the directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(path)


def save_gallery(pictures: Sequence[np.ndarray], names: Sequence[str], out_dir: str) -> list[str]:
    """Write each picture as ``<out_dir>/<name>.png`` and all of them as ``grid.png``; returns the paths, the
    grid last."""
    paths = [os.path.join(out_dir, f"{name}.png") for name in names]
    for picture, path in zip(pictures, paths):
        save_image(picture, path)
    paths.append(os.path.join(out_dir, "grid.png"))
    save_image(make_grid(list(pictures)), paths[-1])
    return paths
