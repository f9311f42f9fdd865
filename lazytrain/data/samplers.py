"""Samplers: infinite training streams (uniform, repeat-factor, any finite sampler made infinite) and exact
inference shards.

A training sampler yields dataset indices forever: epoch after epoch, all drawn from one generator seeded once
with `seed`. Rank r of W takes the global stream positions r, r+W, r+2W, ... so the ranks' shards never overlap
and together cover the stream. Every training sampler follows the resumable-data protocol of
docs/architecture.md: `state_dict()` describes the items its iterator has yielded so far (the per-rank
`position`, plus the epoch it is in and the generator state at that epoch's start), and
`load_state_dict(state)` makes the next iteration start right there after regenerating one epoch. A state that
holds only ``{"position": k}`` is accepted too; whole epochs are then regenerated with tensor code (no Python
loop over their items) until position k.
`reshard_state_dict` turns a state saved at another world size, at a step boundary, into this rank's state at
the same global position (a run resumed on another number of processes, `TrainLoader.reshard_state_dict`).

Repeat Factor Sampling takes per-image factors r_i (`lazytrain.data.repeat_factors`). Each epoch an image
appears floor(r_i) or ceil(r_i) times (ceil with probability frac(r_i)), in ascending index order, and then the
epoch is shuffled. The random numbers are drawn exactly as a straightforward per-image loop draws them (one
``torch.rand(N)``, then ``torch.randperm(len)``), so for a seed the stream equals that loop's stream bit for
bit; here the work is done on int32 arrays.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from lazytrain.data.repeat_factors import CategoryIndex, repeat_factors_from_category_frequency

__all__ = [
    "InferenceSampler",
    "IterationBasedSampler",
    "RepeatFactorTrainingSampler",
    "TrainingSampler",
    "resolve_rank",
    "resolve_seed",
    "resumed_seed",
]

logger = logging.getLogger(__name__)

# Items are handed out in blocks of this size: a whole epoch as a Python list would hold a Python int object
# per index, several times the epoch's int32 tensor; a block's list is small and short-lived.
_BLOCK = 4096


def resumed_seed(sampler: str, state: dict[str, Any], seed: int) -> int:
    """The seed a sampler named `sampler` resumes with: the state's (the checkpoint describes the run), else
    `seed`; refuses a state without a ``position``."""
    if "position" not in state:
        raise ValueError(f"{sampler}.load_state_dict: the state needs a 'position'; got keys {sorted(state)}")
    if state.get("seed") is not None and int(state["seed"]) != seed:
        logger.info("%s: seed %d from the resumed state replaces %d.", sampler, state["seed"], seed)
        return int(state["seed"])
    return seed


def resolve_rank(component: str, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """`rank` and `world_size`, each defaulting to the live process group's, checked for `component`."""
    from lazytrain.utils import comm

    rank = comm.get_rank() if rank is None else int(rank)
    world_size = comm.get_world_size() if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"{component}(rank=, world_size=): rank must be in [0, world_size) and world_size >= 1; got "
            f"rank={rank}, world_size={world_size}. Leave both unset to use the live process group."
        )
    return rank, world_size


def resolve_seed(seed: int | None) -> int:
    """`seed`, or when it is None a random seed shared by all ranks (a collective call: every rank makes it)."""
    if seed is not None:
        return int(seed)
    from lazytrain.utils import comm

    return int(comm.shared_random_seed())


def _index_dtype(size: int) -> torch.dtype:
    return torch.int32 if size < 2**31 else torch.int64


class _InfiniteSampler(Sampler[int]):
    """Shared machinery of the training samplers: seed, rank sharding, resumable position.

    Subclasses implement `_epoch(generator) -> Tensor`, which must draw from `generator` only.
    """

    def __init__(self, *, shuffle: bool, seed: int | None, rank: int | None, world_size: int | None) -> None:
        self._shuffle = bool(shuffle)
        self._seed = resolve_seed(seed)
        self._rank, self._world_size = resolve_rank(type(self).__name__, rank, world_size)
        self._resume: dict[str, Any] = {"position": 0}  # where the next iteration starts
        self._state: dict[str, Any] = {"position": 0}  # after the items yielded so far

    @property
    def seed(self) -> int:
        """The generator seed (shared by all ranks)."""
        return self._seed

    def _epoch(self, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def _start_generator(self, position: int) -> tuple[torch.Generator, int, int]:
        """A generator positioned at the start of an epoch at or before global `position`, that epoch's
        number and its first global position."""
        generator = torch.Generator()
        resume = self._resume
        if resume.get("generator") is not None and resume["epoch_start"] <= position:
            generator.set_state(resume["generator"])
            return generator, int(resume["epoch"]), int(resume["epoch_start"])
        generator.manual_seed(self._seed)
        return generator, 0, 0

    def __iter__(self) -> Iterator[int]:
        position = int(self._resume["position"])
        target = self._rank + position * self._world_size  # next global stream position of this rank
        generator, epoch, epoch_start = self._start_generator(target)
        while True:
            generator_state = generator.get_state()
            indices = self._epoch(generator)
            if len(indices) == 0:
                raise ValueError(
                    f"{type(self).__name__}: epoch {epoch} is empty; the data set has no images to sample."
                )
            epoch_end = epoch_start + len(indices)
            if target < epoch_end:  # this epoch holds items of this rank from `target` on
                state = {"seed": self._seed, "position": position, "epoch": epoch, "epoch_start": epoch_start}
                state["generator"] = generator_state
                self._state = state
                for block in indices[target - epoch_start :: self._world_size].split(_BLOCK):
                    for index in block.tolist():
                        position += 1
                        state["position"] = position
                        yield index
                # First position >= epoch_end that belongs to this rank.
                target += -(-(epoch_end - target) // self._world_size) * self._world_size
            epoch, epoch_start = epoch + 1, epoch_end
            del indices

    def state_dict(self) -> dict[str, Any]:
        """The state after the items yielded so far: ``seed``, per-rank ``position`` (items this rank has
        taken), and ``epoch``, ``epoch_start`` (its first global position) and ``generator`` (uint8 tensor, the
        generator state before that epoch) so that resuming regenerates one epoch only."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration where `state` (from `state_dict`, or just ``{"position": k}``) points.

        A ``seed`` in the state replaces the constructor's seed (the checkpoint describes the run).
        """
        self._seed = resumed_seed(type(self).__name__, state, self._seed)
        self._resume = dict(state)
        self._state = dict(state, seed=self._seed)

    def reshard_state_dict(self, state: dict[str, Any], world_size: int) -> dict[str, Any] | None:
        """`state`, saved by a rank of `world_size` ranks that had all taken as many items, as this rank's
        state at the same global position (``position * world_size``), or None when this world size does not
        divide it (the position between two of this rank's items).

        The stream is the same at every world size (rank r takes r, r + W, ...), and ``epoch_start`` and
        ``generator`` describe global positions, so only the per-rank ``position`` changes.
        """
        global_position = int(state["position"]) * int(world_size)
        if global_position % self._world_size:
            return None
        return dict(state, position=global_position // self._world_size)


class TrainingSampler(_InfiniteSampler):
    """Uniform infinite stream ``perm0 + perm1 + ...`` (``0..size-1`` repeated when not shuffling).

    Args:
        size: number of images (> 0).
        shuffle: draw a new permutation each epoch.
        seed: generator seed; None draws a random seed shared by all ranks (a collective call).
        rank: this process's rank; defaults to the live process group's.
        world_size: number of processes; defaults to the live process group's.
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
        if not isinstance(size, (int, np.integer)) or size <= 0:
            raise ValueError(
                f"TrainingSampler(size=) must be a positive int (the number of images); got {size!r}"
            )
        super().__init__(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self._size = int(size)

    @property
    def size(self) -> int:
        """Number of images sampled from."""
        return self._size

    def _epoch(self, generator: torch.Generator) -> torch.Tensor:
        dtype = _index_dtype(self._size)
        if self._shuffle:
            return torch.randperm(self._size, generator=generator, dtype=dtype)
        return torch.arange(self._size, dtype=dtype)


class RepeatFactorTrainingSampler(_InfiniteSampler):
    """Infinite stream in which image i appears r_i times per epoch in expectation (stochastic rounding).

    Build it in configs with `from_dataset_dicts`, so the factors come from the records the loader uses and
    ``repeat_thresh`` is a config key; or pass factors computed any other way.

    Args:
        repeat_factors: float per-image factors [N] (finite, >= 0; 1 = sampled once per epoch).
        shuffle: shuffle each epoch (otherwise each epoch lists images in ascending order).
        seed: generator seed; None draws a random seed shared by all ranks (a collective call).
        rank: this process's rank; defaults to the live process group's.
        world_size: number of processes; defaults to the live process group's.
    """

    def __init__(
        self,
        repeat_factors: torch.Tensor | Sequence[float],
        shuffle: bool = True,
        seed: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        factors = torch.as_tensor(repeat_factors, dtype=torch.float32)
        if factors.ndim != 1 or len(factors) == 0:
            raise ValueError(
                "RepeatFactorTrainingSampler(repeat_factors=) must be a non-empty 1-D tensor of per-image "
                f"factors; got shape {tuple(factors.shape)}"
            )
        if not bool(torch.isfinite(factors).all()) or bool((factors < 0).any()):
            raise ValueError(
                "RepeatFactorTrainingSampler(repeat_factors=) must be finite and >= 0; got min "
                f"{factors.min().item()}, max {factors.max().item()}"
            )
        super().__init__(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self.repeat_factors = factors
        int_part = torch.trunc(factors)
        self._frac_part = (factors - int_part).numpy()  # exactly the reference's float32 arithmetic
        self._counts_base = int_part.to(torch.int32).numpy()
        self._image_ids = np.arange(len(factors), dtype=np.int32 if len(factors) < 2**31 else np.int64)

    @property
    def size(self) -> int:
        """Number of images sampled from."""
        return len(self.repeat_factors)

    # detectron2's name for the per-image factors, where its users call it
    # (``RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(dicts, thresh)``): the module's
    # function itself, with its signature (detectron2's plus ``instance_aware``) and float32 tensor [N].
    repeat_factors_from_category_frequency = staticmethod(repeat_factors_from_category_frequency)

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

        In a recipe (``"${..dataset}"`` is built once and shared with the loader, and
        ``dataloader.train.sampler.repeat_thresh`` can be overridden or swept)::

            sampler=L(RepeatFactorTrainingSampler.from_dataset_dicts)(
                dataset_dicts="${..dataset}", repeat_thresh=0.001, sqrt=True, instance_aware=False,
                seed="${train.seed}")

        Args:
            dataset_dicts: records, or a prebuilt `CategoryIndex`.
            repeat_thresh: t (>= 0); 0 samples uniformly.
            sqrt: r_c = sqrt(t / f_c) as in the LVIS paper; False uses t / f_c.
            instance_aware: instance-aware RFS (see `repeat_factors_from_category_frequency`).
            shuffle: shuffle each epoch.
            seed: generator seed; None draws a random seed shared by all ranks.
            rank: this process's rank; defaults to the live process group's.
            world_size: number of processes; defaults to the live process group's.
        """
        factors = repeat_factors_from_category_frequency(
            dataset_dicts, repeat_thresh, sqrt=sqrt, instance_aware=instance_aware
        )
        logger.debug(  # the run header shows it on the console
            "Repeat factor sampling (t=%g, sqrt=%s, instance_aware=%s): %d of %d images repeated, max factor "
            "%.2f, expected epoch length %.0f.",
            repeat_thresh,
            sqrt,
            instance_aware,
            int((factors > 1).sum()),
            len(factors),
            factors.max().item(),
            factors.sum(dtype=torch.float64).item(),
        )
        return cls(factors, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)

    def _epoch(self, generator: torch.Generator) -> torch.Tensor:
        # Element-wise work in numpy: single-threaded and fast; waking torch's intra-op threads costs more than
        # they save on work this small, most of all on a busy machine.
        rands = torch.rand(len(self._frac_part), generator=generator).numpy()
        counts = self._counts_base + (rands < self._frac_part)
        del rands
        indices = np.repeat(self._image_ids, counts)
        del counts
        if not self._shuffle:
            return torch.from_numpy(indices)
        # An int32 permutation has the same values and generator use as the int64 one, at half the memory;
        # index_select takes it as it is (np.take and advanced indexing would first copy it to int64).
        order = torch.randperm(len(indices), generator=generator, dtype=_index_dtype(len(indices)))
        return torch.index_select(torch.from_numpy(indices), 0, order)


class InferenceSampler(Sampler[int]):
    """Every index exactly once across ranks, in contiguous shards (``16/2 -> [0,8), [8,16)``;
    ``2/3 -> [0,1), [1,2), []``): the first ``size % world_size`` ranks get one more image.

    Args:
        size: number of images.
        rank: this process's rank; defaults to the live process group's.
        world_size: number of processes; defaults to the live process group's.
    """

    def __init__(self, size: int, *, rank: int | None = None, world_size: int | None = None) -> None:
        if size < 0:
            raise ValueError(f"InferenceSampler(size=) must be >= 0; got {size}")
        rank, world_size = resolve_rank("InferenceSampler", rank, world_size)
        shard, extra = divmod(int(size), world_size)
        begin = rank * shard + min(rank, extra)
        self._indices = range(begin, begin + shard + (rank < extra))

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)


class IterationBasedSampler(Sampler[int]):
    """Turn a finite sampler into an infinite, resumable stream (as maskrcnn-benchmark's
    IterationBasedBatchSampler did): iterate it again and again, calling ``set_epoch(epoch)`` when it has one.

    A `DistributedSampler` already shards by rank and is used as it is; any other sampler (Random,
    WeightedRandom, SubsetRandom, ...) must produce the same order on every rank, and rank r takes its items
    r, r+W, ... A sampler with a ``generator`` attribute left at None would draw a different order on each
    rank from the global RNG, so it is given a generator seeded with `seed`. The generator state is recorded at
    the start of each pass, so resuming replays one pass at most.

    Args:
        sampler: the finite sampler.
        seed: seeds the sampler's generator when it has none; None draws one shared by all ranks.
        rank: this process's rank; defaults to the live process group's.
        world_size: number of processes; defaults to the live process group's.
    """

    def __init__(
        self,
        sampler: Sampler,
        *,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self._sampler = sampler
        self._rank, self._world_size = resolve_rank("IterationBasedSampler", rank, world_size)
        if isinstance(sampler, torch.utils.data.DistributedSampler):
            self._rank, self._world_size = 0, 1
        if hasattr(sampler, "generator") and sampler.generator is None:
            seed = resolve_seed(seed)
            sampler.generator = torch.Generator().manual_seed(seed)
            logger.info(
                "IterationBasedSampler: gave %s a generator seeded with %d.", type(sampler).__name__, seed
            )
        generator = getattr(sampler, "generator", None)
        # Every iteration from position 0 replays the same passes, however often the sampler was iterated.
        start = {"position": 0, "epoch": 0, "epoch_start": 0}
        start["generator"] = None if generator is None else generator.get_state()
        self._start = start
        self._resume: dict[str, Any] = start
        self._state: dict[str, Any] = dict(start)

    def _passes(self, epoch: int) -> Iterator[tuple[int, torch.Tensor | None, Iterator[int]]]:
        generator = getattr(self._sampler, "generator", None)
        for number in itertools.count(epoch):
            if hasattr(self._sampler, "set_epoch"):
                self._sampler.set_epoch(number)
            yield number, None if generator is None else generator.get_state(), iter(self._sampler)

    def __iter__(self) -> Iterator[int]:
        resume = self._resume
        position = int(resume["position"])
        target = self._rank + position * self._world_size
        generator = getattr(self._sampler, "generator", None)
        if "epoch" not in resume or resume["epoch_start"] > target:
            resume = self._start
        epoch, pass_start = int(resume["epoch"]), int(resume["epoch_start"])
        if generator is not None and resume.get("generator") is not None:
            generator.set_state(resume["generator"])
        global_position = pass_start
        for number, generator_state, items in self._passes(epoch):
            state = {"position": position, "epoch": number, "epoch_start": pass_start}
            state["generator"] = generator_state
            self._state = state
            empty = True
            for index in items:
                empty = False
                global_position += 1
                if global_position - 1 == target:
                    target += self._world_size
                    position += 1
                    state["position"] = position
                    yield int(index)
            if empty:
                raise ValueError(f"IterationBasedSampler: {type(self._sampler).__name__} yielded no index")
            pass_start = global_position

    def state_dict(self) -> dict[str, Any]:
        """Per-rank ``position``, and the pass (``epoch``, ``epoch_start``, ``generator``) it is in."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration where `state` (from `state_dict`, or just ``{"position": k}``) points."""
        if "position" not in state:
            raise ValueError(
                f"IterationBasedSampler.load_state_dict: the state needs a 'position'; got {sorted(state)}"
            )
        self._resume = dict(state)
        self._state = dict(state)
