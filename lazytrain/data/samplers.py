"""Samplers: infinite training streams (uniform, repeat-factor) and exact inference shards.

Training samplers yield dataset indices forever: epoch after epoch from one generator seeded once with
`seed`; rank r of W takes stream positions r, r+W, r+2W, ... Every training sampler can start at any
position of its per-rank stream (`load_state_dict({"position": k})`), regenerating whole epochs with
vectorised tensor code instead of iterating k items, so a resumed run sees the same data order.

Repeat Factor Sampling (LVIS paper, Gupta et al. 2019): with f_c the fraction of training images that
contain category c and threshold t, r_c = max(1, sqrt(t / f_c)); an image's factor r_i is the max r_c of
its categories (1 for images without annotations). Each epoch an image appears floor(r_i) or ceil(r_i)
times (ceil with probability frac(r_i)), then the epoch is shuffled. The RNG is consumed exactly as the
straightforward per-image loop does (one ``torch.rand(N)``, then ``torch.randperm(len)``), so for a seed the
stream equals that reference bit for bit, while this implementation is vectorised and uses compact
arrays (no Python object per image or per epoch index).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Sampler

from lazytrain.utils import comm

__all__ = ["CategoryIndex", "InferenceSampler", "RepeatFactorTrainingSampler", "TrainingSampler"]

logger = logging.getLogger(__name__)


def _resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    rank = comm.get_rank() if rank is None else rank
    world_size = comm.get_world_size() if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"sampler: rank must be in [0, world_size={world_size}); got {rank}")
    return rank, world_size


class _InfiniteSampler(Sampler):
    """Shared machinery: seed, rank sharding and resumable positions. Subclasses implement `_epoch`."""

    def __init__(self, *, shuffle: bool, seed: int | None, rank: int | None, world_size: int | None) -> None:
        self._shuffle = shuffle
        self._seed = int(comm.shared_random_seed() if seed is None else seed)
        self._rank, self._world_size = _resolve_rank(rank, world_size)
        self._start = 0  # per-rank position the next iteration starts at

    def _epoch(self, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def _global_stream(self, skip: int) -> Iterator[torch.Tensor]:
        """Epoch tensors of the global stream, the first one with its first `skip` items dropped."""
        generator = torch.Generator()
        generator.manual_seed(self._seed)
        while True:
            epoch = self._epoch(generator)
            if len(epoch) == 0:
                raise ValueError(f"{type(self).__name__}: an epoch is empty; the dataset has no images")
            if skip >= len(epoch):
                skip -= len(epoch)
                continue
            yield epoch[skip:]
            skip = 0

    def __iter__(self) -> Iterator[int]:
        # Global position of this rank's item number `start`; then every world_size-th item.
        offset = self._rank + self._start * self._world_size
        phase = 0
        for chunk in self._global_stream(offset):
            picked = chunk[phase :: self._world_size]
            phase = (phase - len(chunk)) % self._world_size
            yield from picked.tolist()

    def state_dict(self) -> dict:
        return {"position": self._start}

    def load_state_dict(self, state: dict) -> None:
        """Start the next iteration at this rank's stream position ``state["position"]``."""
        self._start = int(state["position"])


class TrainingSampler(_InfiniteSampler):
    """Uniform infinite stream: ``perm0 + perm1 + ...`` (or ``0..size-1`` repeated without shuffle).

    Args:
        size: number of images.
        shuffle: shuffle each epoch.
        seed: generator seed; None draws a random seed shared by all ranks.
        rank, world_size: default to the live process group.
    """

    def __init__(
        self,
        size: int,
        shuffle: bool = True,
        seed: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"TrainingSampler(size=) must be > 0; got {size}")
        super().__init__(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self._size = size

    def _epoch(self, generator: torch.Generator) -> torch.Tensor:
        if self._shuffle:
            return torch.randperm(self._size, generator=generator)
        return torch.arange(self._size)


@dataclass
class CategoryIndex:
    """Compact image -> categories table (CSR): image i has categories ``categories[offsets[i]:offsets[i+1]]``
    (unique per image), with ``instances`` the number of instances of each (for instance-aware RFS)."""

    offsets: np.ndarray  # int64 [N + 1]
    categories: np.ndarray  # int32 [M]
    instances: np.ndarray  # int32 [M]

    @property
    def num_images(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_dataset_dicts(cls, dataset_dicts: Sequence[dict]) -> CategoryIndex:
        counts = np.zeros(len(dataset_dicts) + 1, dtype=np.int64)
        categories: list[int] = []
        instances: list[int] = []
        for i, record in enumerate(dataset_dicts):
            ids, per = np.unique(
                [a["category_id"] for a in record.get("annotations", ())], return_counts=True
            )
            counts[i + 1] = len(ids)
            categories.extend(ids.tolist())
            instances.extend(per.tolist())
        return cls(np.cumsum(counts), np.asarray(categories, np.int32), np.asarray(instances, np.int32))


def _category_factors(
    index: CategoryIndex, repeat_thresh: float, sqrt: bool, instance_aware: bool
) -> np.ndarray:
    num_categories = int(index.categories.max()) + 1 if len(index.categories) else 0
    image_freq = np.bincount(index.categories, minlength=num_categories) / max(index.num_images, 1)
    freq = image_freq
    if instance_aware:
        instance_freq = np.bincount(index.categories, weights=index.instances, minlength=num_categories)
        freq = np.sqrt(image_freq * instance_freq / max(index.instances.sum(), 1))
    with np.errstate(divide="ignore"):
        ratio = np.where(freq > 0, repeat_thresh / np.where(freq > 0, freq, 1.0), 1.0)
    return np.maximum(1.0, np.sqrt(ratio) if sqrt else ratio)


class RepeatFactorTrainingSampler(_InfiniteSampler):
    """Infinite stream where image i appears r_i times per epoch in expectation (stochastic rounding).

    Args:
        repeat_factors: float tensor [N] of per-image factors >= 1 (see
            `repeat_factors_from_category_frequency`, or build with `from_dataset_dicts` in configs).
        shuffle: shuffle each epoch.
        seed: generator seed; None draws a random seed shared by all ranks.
        rank, world_size: default to the live process group.
    """

    def __init__(
        self,
        repeat_factors: torch.Tensor,
        shuffle: bool = True,
        seed: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        repeat_factors = torch.as_tensor(repeat_factors, dtype=torch.float32)
        if repeat_factors.ndim != 1 or len(repeat_factors) == 0:
            raise ValueError(
                f"RepeatFactorTrainingSampler(repeat_factors=) must be a non-empty 1-D tensor; got shape {tuple(repeat_factors.shape)}"
            )
        super().__init__(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self._int_part = torch.trunc(repeat_factors)
        self._frac_part = repeat_factors - self._int_part
        self.repeat_factors = repeat_factors

    @classmethod
    def from_dataset_dicts(
        cls,
        dataset_dicts: Sequence[dict] | CategoryIndex,
        repeat_thresh: float,
        sqrt: bool = True,
        instance_aware: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> RepeatFactorTrainingSampler:
        """The config-facing constructor: factors from the same records the loader uses.

        In a recipe: ``sampler=L(RepeatFactorTrainingSampler.from_dataset_dicts)(dataset_dicts="${..dataset}",
        repeat_thresh=0.001)``, so ``dataloader.train.sampler.repeat_thresh`` is overridable.
        """
        factors = cls.repeat_factors_from_category_frequency(
            dataset_dicts, repeat_thresh, sqrt, instance_aware
        )
        return cls(factors, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)

    @staticmethod
    def repeat_factors_from_category_frequency(
        dataset_dicts: Sequence[dict] | CategoryIndex,
        repeat_thresh: float,
        sqrt: bool = True,
        instance_aware: bool = False,
    ) -> torch.Tensor:
        """Per-image repeat factors r_i = max over the image's categories of max(1, sqrt(t / f_c)).

        Args:
            dataset_dicts: records (``annotations[*].category_id``) or a prebuilt `CategoryIndex`.
            repeat_thresh: t; 0 gives uniform sampling (all factors 1).
            sqrt: use sqrt(t / f_c) (the LVIS paper); False uses t / f_c.
            instance_aware: IRFS (Yaman et al. 2023): f_c = sqrt(image frequency * instance frequency).

        Returns:
            float32 tensor [N].
        """
        if not repeat_thresh >= 0:
            raise ValueError(
                f"RepeatFactorTrainingSampler(repeat_thresh=) must be >= 0 (0 = uniform sampling; LVIS uses "
                f"0.001); got {repeat_thresh}. Set dataloader.train.sampler.repeat_thresh to a value in [0, 1]."
            )
        index = (
            dataset_dicts
            if isinstance(dataset_dicts, CategoryIndex)
            else CategoryIndex.from_dataset_dicts(dataset_dicts)
        )
        factors = np.ones(index.num_images, dtype=np.float64)
        if len(index.categories):
            per_entry = _category_factors(index, repeat_thresh, sqrt, instance_aware)[index.categories]
            nonempty = np.flatnonzero(np.diff(index.offsets) > 0)
            factors[nonempty] = np.maximum.reduceat(per_entry, index.offsets[nonempty])
        return torch.from_numpy(factors).to(torch.float32)

    def _epoch(self, generator: torch.Generator) -> torch.Tensor:
        rands = torch.rand(len(self._frac_part), generator=generator)
        counts = (self._int_part + (rands < self._frac_part).float()).to(torch.int64)
        indices = torch.repeat_interleave(torch.arange(len(counts)), counts)
        if self._shuffle:
            return indices[torch.randperm(len(indices), generator=generator)]
        return indices


class InferenceSampler(Sampler):
    """Every index exactly once across ranks, in contiguous shards (``16/2 -> [0,8), [8,16)``).

    Args:
        size: number of images.
        rank, world_size: default to the live process group.
    """

    def __init__(self, size: int, *, rank: int | None = None, world_size: int | None = None) -> None:
        if size < 0:
            raise ValueError(f"InferenceSampler(size=) must be >= 0; got {size}")
        rank, world_size = _resolve_rank(rank, world_size)
        shard, extra = divmod(size, world_size)
        sizes = [shard + (r < extra) for r in range(world_size)]
        begin = sum(sizes[:rank])
        self._indices = range(begin, begin + sizes[rank])

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)


class IterationBasedSampler(Sampler):
    """Turn any finite sampler into an infinite stream (re-iterating it, calling ``set_epoch`` if present).

    A finite sampler that does not shard by itself (not a DistributedSampler) is sharded by position.
    Resuming skips `position` items (O(position); use the lazytrain samplers for O(epoch) resume).
    """

    def __init__(self, sampler: Sampler, *, rank: int | None = None, world_size: int | None = None) -> None:
        self._sampler = sampler
        self._rank, self._world_size = _resolve_rank(rank, world_size)
        if isinstance(sampler, torch.utils.data.DistributedSampler):
            self._rank, self._world_size = 0, 1
        self._start = 0

    def _stream(self) -> Iterator[int]:
        for epoch in itertools.count():
            if hasattr(self._sampler, "set_epoch"):
                self._sampler.set_epoch(epoch)
            empty = True
            for index in self._sampler:
                empty = False
                yield int(index)
            if empty:
                raise ValueError(f"IterationBasedSampler: {type(self._sampler).__name__} yielded nothing")

    def __iter__(self) -> Iterator[int]:
        start = self._rank + self._start * self._world_size
        return itertools.islice(self._stream(), start, None, self._world_size)

    def state_dict(self) -> dict:
        return {"position": self._start}

    def load_state_dict(self, state: dict) -> None:
        self._start = int(state["position"])
