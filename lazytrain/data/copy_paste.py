"""Simple Copy-Paste (Ghiasi et al., CVPR 2021) for the train mapper, and a rare-aware variant of it.

``DatasetMapper(copy_paste=CopyPaste(...))`` maps a training image as usual, then, with probability `prob`,
draws a source image from the very dataset the train loader reads (the loader hands its dataset to the mapper,
`DatasetMapper.attach_dataset`; no second copy of the records) and a random subset of its objects, maps the
source with those objects only (so a crowded source costs what its pasted objects cost) through the same
augmentations (its own random resize, flip and crop: large-scale jitter on both images with the LSJ recipe),
and pastes the chosen objects that its jitter keeps (`paste_objects`):

- their pixels replace the image's, and their masks join the image's instances;
- the image's own masks lose the pasted pixels, and an instance left with no visible pixel is dropped: as the
  paper does, fully occluded objects are removed and partly occluded ones keep their visible part, however
  small, so a small object with one pixel covered is kept as an uncovered one of its size is;
- the boxes of the pasted objects and of the instances that lost pixels become the extents of their masks.

`min_area` applies to the pasted objects only: one with fewer pixels on the image (after the cut at the image's
edges) is not pasted. Its default, 1, pastes every object that shows (the paper's rule); the image's own
instances are never dropped for their size, so mapping with and without copy-paste labels them alike.

``mode`` says how the pasted objects are chosen:

- ``"uniform"`` (the paper's): the source image uniformly among the records, then k objects of it uniformly.
- ``"rare"``: every object weighs r_c, the repeat factor of its category (repeat factor sampling's
  max(1, sqrt(t / f_c)), with this option's own threshold `repeat_thresh`): the source image is drawn with
  probability proportional to the summed weights of its objects (one object drawn in proportion to its weight,
  its image taken), and its k objects in proportion to theirs, without replacement. Rare categories get more
  pasted instances, not only more images, whatever the sampler.
- ``"none"``: nothing is pasted and no random number is drawn, so the mapper's output equals that of a mapper
  without copy-paste; one key then compares the three settings in a sweep.

k is uniform in [1, min(objects in the source, `max_objects`)]; crowd regions are never pasted. Both images keep the sizes their augmentations
gave them; the source is laid on the image from the top-left corner, where the mapper's resizing, cropping
and padding anchor every image, and what falls outside the image is cut (as the paper's padded 1024 x 1024
canvases do, without growing the image). Objects are pasted as they are, without blending the edges (the paper
found blending made no difference).

All randomness comes from Python's global `random`, which the train loader seeds per sample, so the pasted
objects are a function of the sample: resumed runs and any number of workers see the same images. Polygon and
RLE annotations reach this step as bitmaps at the output size (the mapper rasterizes them).
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.data.repeat_factors import CategoryIndex, category_repeat_factors

__all__ = ["CopyPaste", "find_copy_paste_problems", "mask_extents", "paste_objects"]

MODES = ("none", "uniform", "rare")

Instances = dict[str, torch.Tensor]


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def find_copy_paste_problems(settings: Mapping[str, Any]) -> dict[str, str]:
    """What is wrong with the `CopyPaste` settings given (absent ones are not checked): the argument's name ->
    what it must be and what it got. `CopyPaste` raises the first; checks before a run can report each."""
    checks = {
        "mode": (lambda v: v in MODES, f"must be one of {', '.join(map(repr, MODES))}"),
        "prob": (lambda v: _is_number(v) and 0 <= v <= 1, "must be a number in [0, 1]"),
        "max_objects": (
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "must be an integer >= 1",
        ),
        "min_area": (lambda v: _is_number(v) and v >= 0, "must be a number of pixels >= 0"),
        "repeat_thresh": (
            lambda v: _is_number(v) and v >= 0,
            "must be a number >= 0 (0 weighs every category alike; LVIS's RFS uses 0.001)",
        ),
    }
    return {
        name: f"{expected}; got {settings[name]!r}"
        for name, (is_valid, expected) in checks.items()
        if name in settings and not is_valid(settings[name])
    }


class CopyPaste:
    """Paste objects of another training image onto each mapped training image (see the module docstring).

    Args:
        mode: "uniform", "rare" (objects weighted by their category's repeat factor) or "none" (off).
        prob: probability of pasting onto an image.
        max_objects: the most objects pasted onto one image (it bounds the cost per image too).
        min_area: the fewest pixels a pasted object must have on the image to be pasted (1: any that shows,
            the paper's rule). The image's own instances are dropped only when fully covered, whatever this is.
        repeat_thresh: t of the repeat factors r_c that weigh the objects in "rare" mode (LVIS's RFS uses
            0.001; any t >= 0, independent of the sampler's, so uniform sampling can paste rare-aware too).

    Raises:
        ValueError: an argument out of its range (the message names it).
    """

    def __init__(
        self,
        mode: str = "uniform",
        *,
        prob: float = 1.0,
        max_objects: int = 20,
        min_area: int = 1,
        repeat_thresh: float = 0.001,
    ) -> None:
        settings = dict(
            mode=mode, prob=prob, max_objects=max_objects, min_area=min_area, repeat_thresh=repeat_thresh
        )
        for name, problem in find_copy_paste_problems(settings).items():
            raise ValueError(f"CopyPaste({name}=) {problem}")
        self.mode, self.prob, self.max_objects = mode, prob, max_objects
        self.min_area, self.repeat_thresh = min_area, repeat_thresh
        self._dataset: Sequence[dict] | None = None
        # "rare" mode: one entry per (image, category) pair of the records, in CSR order (`CategoryIndex`)
        self._entry_image = np.zeros(0, dtype=np.int64)  # the image of each entry
        self._entry_cumulative = np.zeros(0, dtype=np.float64)  # running sum of instances * r_c
        self._category_weights = np.zeros(0, dtype=np.float32)  # r_c by category id

    def __repr__(self) -> str:
        return (
            f"CopyPaste(mode={self.mode!r}, prob={self.prob}, max_objects={self.max_objects}, "
            f"min_area={self.min_area}, repeat_thresh={self.repeat_thresh})"
        )

    def attach_dataset(self, dataset: Sequence[dict]) -> None:
        """Draw source images from `dataset` (records, e.g. the loader's `DatasetFromList`).

        In "rare" mode this reads every record once, for its categories, and keeps a few arrays of one entry
        per (image, category) pair.

        Raises:
            ValueError: "rare" mode and no record has an annotation that is not a crowd region.
        """
        self._dataset = dataset
        if self.mode != "rare":
            return
        index = _category_index(dataset)
        if not len(index.categories):
            raise ValueError(
                "CopyPaste(mode='rare'): the dataset has no annotations outside crowd regions, nothing to paste"
            )
        self._category_weights = category_repeat_factors(index, self.repeat_thresh)
        weights = index.instances * self._category_weights[index.categories].astype(np.float64)
        self._entry_cumulative = np.cumsum(weights)
        self._entry_image = np.repeat(np.arange(index.num_images, dtype=np.int64), np.diff(index.offsets))

    def source_probabilities(self) -> np.ndarray:
        """float64 [N]: the probability that each record of the attached dataset is the source image."""
        size = len(self._attached())
        if self.mode == "none":
            return np.zeros(size)
        if self.mode == "uniform":
            return np.full(size, 1 / size)
        weights = np.diff(self._entry_cumulative, prepend=0.0)
        return np.bincount(self._entry_image, weights=weights, minlength=size) / self._entry_cumulative[-1]

    def object_weights(self, classes: torch.Tensor) -> np.ndarray:
        """float64 [K]: the weight of each object of a source image (of categories `classes`) in the choice of
        the pasted ones: 1 in "uniform" mode, r_c of its category in "rare" mode."""
        if self.mode != "rare":
            return np.ones(len(classes))
        return self._category_weights[classes.numpy()].astype(np.float64)

    def __call__(
        self,
        image: torch.Tensor,
        instances: Instances,
        map_record: Callable[[dict], tuple[torch.Tensor, Instances]],
    ) -> tuple[torch.Tensor, Instances]:
        """Paste objects of a source image onto `image` (uint8 [C, H, W]) and its `instances` (boxes, classes,
        masks), with probability `prob`. `map_record` maps the source record as the image was mapped."""
        if self.mode == "none" or random.random() >= self.prob:
            return image, instances
        record = self._attached()[self._draw_source()]
        annotations = [a for a in record.get("annotations", ()) if not a.get("iscrowd", 0)]
        if not annotations:
            return image, instances
        chosen = self._draw_objects(torch.tensor([a["category_id"] for a in annotations]))
        source_image, source = map_record({**record, "annotations": [annotations[i] for i in chosen]})
        return paste_objects(image, instances, source_image, source, self.min_area)

    def _attached(self) -> Sequence[dict]:
        if self._dataset is None:
            raise ValueError(
                "CopyPaste: no dataset to draw source images from; build_detection_train_loader attaches its "
                "dataset to the mapper, or call DatasetMapper.attach_dataset(records) before mapping"
            )
        return self._dataset

    def _draw_source(self) -> int:
        """Index of the source record (uniform, or by the summed weights of its objects)."""
        if self.mode == "uniform":
            return random.randrange(len(self._attached()))
        total = self._entry_cumulative[-1]
        entry = int(np.searchsorted(self._entry_cumulative, random.random() * total, side="right"))
        return int(self._entry_image[min(entry, len(self._entry_image) - 1)])

    def _draw_objects(self, classes: torch.Tensor) -> list[int]:
        """Indices (ascending) of k objects drawn without replacement in proportion to their weights."""
        count = random.randint(1, min(len(classes), self.max_objects))
        if self.mode == "uniform":
            return sorted(random.sample(range(len(classes)), count))
        # Efraimidis-Spirakis: the k largest u ** (1 / w) are distributed as k successive weighted draws
        keys = [random.random() ** (1.0 / weight) for weight in self.object_weights(classes).tolist()]
        return sorted(sorted(range(len(keys)), key=keys.__getitem__, reverse=True)[:count])


def _category_index(dataset: Sequence[dict]) -> CategoryIndex:
    """The categories of every record's annotations outside crowd regions (those are never pasted); for data
    sets served from their annotation cache, its arrays (no record read; they count crowd regions too, which
    LVIS has none of)."""
    if isinstance(dataset, CachedRecords):
        return CategoryIndex.from_dataset_dicts(dataset)
    shared: dict[int, dict] = {}  # one small dict per category, so the table costs a pointer per annotation

    def categories(record: dict) -> dict:
        ids = (a["category_id"] for a in record.get("annotations", ()) if not a.get("iscrowd", 0))
        return {"annotations": [shared.get(c) or shared.setdefault(c, {"category_id": c}) for c in ids]}

    return CategoryIndex.from_dataset_dicts([categories(dataset[i]) for i in range(len(dataset))])


def paste_objects(
    image: torch.Tensor,
    instances: Instances,
    source_image: torch.Tensor,
    source_instances: Instances,
    min_area: float = 1,
) -> tuple[torch.Tensor, Instances]:
    """Paste the objects of `source_instances` (their pixels of `source_image`) onto `image` and `instances`.

    The source is laid on the image from the top-left corner; objects left with fewer than `min_area` pixels
    (at least 1) on the image are not pasted. The image's instances lose the pasted pixels; those with no pixel
    left (fully occluded) are dropped, and those that lost pixels get the extents of their masks as boxes, as
    Ghiasi et al. do. The inputs are not modified.

    Args:
        image: uint8 [C, H, W].
        instances: ``boxes`` float32 [N, 4] XYXY, ``classes`` int64 [N], ``masks`` uint8 [N, H, W].
        source_image: uint8 [C, Hs, Ws].
        source_instances: the objects to paste, as `instances` at the source's size.
        min_area: the fewest pixels on the image that a pasted object needs to be pasted.

    Returns:
        The image and its instances: those of the image that stay, then the pasted ones (boxes from masks).
    """
    # numpy views of the tensors: its uint8 reductions and masked copies cost a fraction of torch's on the CPU
    height, width = image.shape[-2:]
    h, w = min(height, source_image.shape[-2]), min(width, source_image.shape[-1])
    pasted = source_instances["masks"].numpy()[:, :h, :w]
    # one mask at a time: numpy counts a whole array far faster than along axes
    on_image = np.array([np.count_nonzero(mask) >= max(min_area, 1) for mask in pasted], dtype=bool)
    pasted = pasted[on_image]
    if not len(pasted):
        return image, instances
    union = pasted.max(axis=0) > 0  # [h, w]
    pixels = image.numpy().copy()
    np.copyto(pixels[:, :h, :w], source_image.numpy()[:, :h, :w], where=union)
    rows, cols = np.flatnonzero(union.any(axis=1)), np.flatnonzero(union.any(axis=0))
    window = slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1)
    own = instances["masks"].numpy()
    keep, occluded = _visible(own, window, union[window])
    masks = torch.from_numpy(_compose_masks(own, keep, window, union[window], pasted, (height, width)))
    kept = torch.from_numpy(keep)
    boxes = instances["boxes"][kept]
    changed = torch.from_numpy(occluded[keep])
    boxes[changed] = mask_extents(masks[: len(boxes)][changed])
    classes = source_instances["classes"][torch.from_numpy(on_image)]
    output = {
        "boxes": torch.cat([boxes, mask_extents(torch.from_numpy(pasted))]),
        "classes": torch.cat([instances["classes"][kept], classes]),
        "masks": masks,
    }
    return torch.from_numpy(pixels), output


def _compose_masks(
    own: np.ndarray,
    keep: np.ndarray,
    window: tuple[slice, slice],
    covered: np.ndarray,
    pasted: np.ndarray,
    size: tuple[int, int],
) -> np.ndarray:
    """The output masks, written once: the kept `own` masks without the `covered` pixels of `window`, then
    the `pasted` ones [K, h, w] from the top-left corner of an image of `size`."""
    count = int(keep.sum())
    masks = np.zeros((count + len(pasted), *size), dtype=np.uint8)
    np.compress(keep, own, axis=0, out=masks[:count])
    np.copyto(masks[:count, window[0], window[1]], 0, where=covered)
    masks[count:, : pasted.shape[1], : pasted.shape[2]] = pasted
    return masks


def _visible(
    masks: np.ndarray, window: tuple[slice, slice], covered: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which of `masks` [N, H, W] keep a pixel outside `covered` (bool, the pixels of `window`, the extent of
    the pasted objects, that they cover), and which lose pixels to it."""
    # one mask at a time: numpy counts a whole array far faster than along axes
    parts = masks[:, window[0], window[1]]
    lost = np.array([np.count_nonzero(np.logical_and(part, covered)) for part in parts], dtype=np.int64)
    occluded = lost > 0
    keep = np.ones(len(masks), dtype=bool)
    for i in np.flatnonzero(occluded):
        keep[i] = np.count_nonzero(masks[i]) > lost[i]
    return keep, occluded


def mask_extents(masks: torch.Tensor) -> torch.Tensor:
    """XYXY float32 extent [N, 4] of each bitmap [N, H, W], the far edges one past the last pixel (all zeros
    for an empty bitmap): the boxes of pasted and occluded objects, and of the mapper's ``recompute_boxes``."""
    if 0 in masks.shape[1:]:
        return torch.zeros((len(masks), 4), dtype=torch.float32)
    bitmaps = masks.numpy()
    rows, cols = bitmaps.max(axis=2) > 0, bitmaps.max(axis=1) > 0  # [N, H], [N, W]
    height, width = bitmaps.shape[1:]
    boxes = np.stack(
        [
            cols.argmax(axis=1),
            rows.argmax(axis=1),
            width - cols[:, ::-1].argmax(axis=1),
            height - rows[:, ::-1].argmax(axis=1),
        ],
        axis=1,
    ).astype(np.float32)
    boxes[~cols.any(axis=1)] = 0
    return torch.from_numpy(boxes)
