"""Repeat factors of Repeat Factor Sampling (Gupta et al., LVIS, 2019), computed from per-image categories.

With f_c the fraction of training images that contain category c and threshold t, r_c = max(1, sqrt(t / f_c));
an image's factor r_i is the largest r_c of its categories (1 without annotations). The factors equal, bit for
bit, those of a straightforward per-image loop in float64 rounded to float32. The per-image categories live in
a compact CSR table of numpy arrays (`CategoryIndex`), never in one Python object per image: records give one
with `CategoryIndex.from_dataset_dicts`, and any other source of the arrays can build one directly.
`lazytrain.data.samplers.RepeatFactorTrainingSampler` samples with the factors.
"""

from __future__ import annotations

import itertools
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lazytrain.data.datasets.cached_records import CachedRecords

__all__ = ["CategoryIndex", "category_repeat_factors", "repeat_factors_from_category_frequency"]


@dataclass(frozen=True)
class CategoryIndex:
    """Compact image -> categories table in CSR form.

    Image i has the distinct categories ``categories[offsets[i]:offsets[i + 1]]`` (ascending), with
    ``instances`` the number of annotations of each (used by instance-aware RFS). Building one for millions of
    images takes a few numpy arrays; `from_dataset_dicts` builds it from records, and benchmarks or very large
    data sets can construct it directly from arrays without creating any per-image Python object.

    Args:
        offsets: int64 [N + 1], non-decreasing, ``offsets[0] == 0``.
        categories: int32 [M], contiguous category ids >= 0.
        instances: int32 [M], >= 1.
    """

    offsets: np.ndarray
    categories: np.ndarray
    instances: np.ndarray

    def __post_init__(self) -> None:
        offsets, categories, instances = self.offsets, self.categories, self.instances
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(categories):
            raise ValueError(
                f"CategoryIndex(offsets=) must be 1-D, start at 0 and end at len(categories)={len(categories)}; "
                f"got shape {offsets.shape}, first/last {offsets[:1].tolist()}/{offsets[-1:].tolist()}"
            )
        if len(instances) != len(categories):
            raise ValueError(
                f"CategoryIndex: instances ({len(instances)}) and categories ({len(categories)}) differ in length"
            )

    @property
    def num_images(self) -> int:
        """Number of images N."""
        return len(self.offsets) - 1

    @classmethod
    def from_dataset_dicts(cls, dataset_dicts: Sequence[dict]) -> CategoryIndex:
        """Read ``annotations[*].category_id`` of every record (one pass, no per-image numpy call).

        Args:
            dataset_dicts: records as in docs/architecture.md; a record without ``annotations`` has no
                categories. `CachedRecords` give the table from their arrays, without reading a record.
        """
        if isinstance(dataset_dicts, CachedRecords):
            return cls(*dataset_dicts.get_category_csr())
        num_images = len(dataset_dicts)
        annotations = operator.methodcaller("get", "annotations", ())
        per_image = np.fromiter(map(len, map(annotations, dataset_dicts)), np.int64, count=num_images)
        raw = np.fromiter(
            map(
                operator.itemgetter("category_id"),
                itertools.chain.from_iterable(map(annotations, dataset_dicts)),
            ),
            np.int64,
            count=int(per_image.sum()),
        )
        if len(raw) and raw.min() < 0:
            raise ValueError(
                f"CategoryIndex: category ids must be contiguous ids >= 0; found {int(raw.min())}"
            )
        # One key per annotation, (image, category); keys come grouped by image, so a stable sort (timsort on
        # short unsorted runs) orders them fast, and equal neighbours are one image's repeated category.
        stride = int(raw.max()) + 1 if len(raw) else 1
        keys = np.sort(
            np.repeat(np.arange(num_images, dtype=np.int64), per_image) * stride + raw, kind="stable"
        )
        first = np.ones(len(keys), dtype=bool)
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        unique_keys = keys[starts]
        instances = np.diff(np.append(starts, len(keys)))
        offsets = np.zeros(num_images + 1, dtype=np.int64)
        np.cumsum(np.bincount(unique_keys // stride, minlength=num_images), out=offsets[1:])
        return cls(offsets, (unique_keys % stride).astype(np.int32), instances.astype(np.int32))


def _category_frequencies(index: CategoryIndex, instance_aware: bool) -> np.ndarray:
    """f_c per category (float64), 0 for categories that appear nowhere."""
    num_categories = int(index.categories.max()) + 1
    # torch counts int32 ids as they are; numpy would first copy them to int64.
    image_counts = torch.bincount(torch.from_numpy(index.categories), minlength=num_categories).numpy()
    image_frequency = image_counts / index.num_images
    if not instance_aware:
        return image_frequency
    instance_counts = np.bincount(index.categories, weights=index.instances, minlength=num_categories)
    return np.sqrt(image_frequency * (instance_counts / index.instances.sum(dtype=np.int64)))


def category_repeat_factors(
    index: CategoryIndex, repeat_thresh: float, sqrt: bool = True, instance_aware: bool = False
) -> np.ndarray:
    """r_c = max(1, sqrt(t / f_c)) of each category id 0..C-1, C the largest id + 1 (float32 [C]).

    The factors `repeat_factors_from_category_frequency` takes its per-image maximum of; a category that
    appears in no image gets 1. The arguments are those of `repeat_factors_from_category_frequency` (t >= 0
    is the caller's to check).
    """
    num_categories = int(index.categories.max()) + 1 if len(index.categories) else 0
    if not num_categories or repeat_thresh == 0:
        return np.ones(num_categories, dtype=np.float32)
    frequency = _category_frequencies(index, instance_aware)
    with np.errstate(divide="ignore"):
        ratio = repeat_thresh / frequency  # inf for absent categories, set to 1 below
    factors = np.maximum(1.0, np.sqrt(ratio) if sqrt else ratio).astype(np.float32)
    factors[frequency == 0] = 1.0
    return factors


def repeat_factors_from_category_frequency(
    dataset_dicts: Sequence[dict] | CategoryIndex,
    repeat_thresh: float,
    sqrt: bool = True,
    instance_aware: bool = False,
) -> torch.Tensor:
    """Per-image factors r_i = max over the image's categories c of max(1, sqrt(t / f_c)).

    f_c is the fraction of images that contain c. With ``instance_aware`` (IRFS, Yaman et al. 2023),
    f_c = sqrt(f_img_c * f_inst_c) where f_inst_c is the share of all annotations that belong to c.
    Images without annotations get 1.

    Args:
        dataset_dicts: records (``annotations[*].category_id``) or a prebuilt `CategoryIndex`.
        repeat_thresh: t (>= 0); 0 gives all factors 1 (uniform sampling).
        sqrt: use sqrt(t / f_c); False uses t / f_c.
        instance_aware: use the instance-aware frequency.

    Returns:
        float32 tensor [N], equal bit for bit to the per-image loop computation in float64 then float32.
    """
    if not (isinstance(repeat_thresh, numbers.Real) and repeat_thresh >= 0):
        raise ValueError(
            f"RepeatFactorTrainingSampler(repeat_thresh=) must be a number >= 0 (0 = uniform sampling, "
            f"LVIS uses 0.001); got {repeat_thresh!r}. Set dataloader.train.sampler.repeat_thresh to a value "
            ">= 0."
        )
    index = (
        dataset_dicts
        if isinstance(dataset_dicts, CategoryIndex)
        else CategoryIndex.from_dataset_dicts(dataset_dicts)
    )
    if not len(index.categories) or repeat_thresh == 0:
        return torch.ones(index.num_images, dtype=torch.float32)
    # Rounding to float32 is monotone, so rounding before the per-image max gives the same result as the
    # reference's max in float64 then rounding, with half the memory traffic.
    category_factor = category_repeat_factors(index, repeat_thresh, sqrt, instance_aware)
    per_entry = torch.index_select(torch.from_numpy(category_factor), 0, torch.from_numpy(index.categories))
    # Max over each image's CSR segment (faster than numpy's reduceat); no categories -> `initial`.
    return torch.segment_reduce(per_entry, "max", offsets=torch.from_numpy(index.offsets), initial=1.0)
