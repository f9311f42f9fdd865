"""Mixture sampling: every batch holds a fixed share of images from each of several data sets (sources).

Detectors trained on a mixture (LVIS + COCO + an Objects365-style set) concatenate the sources
(``get_detection_dataset_dicts(names)``); sampling the concatenation uniformly gives each batch whatever mix
the sources' sizes make, and a small source is rarely seen. `MixtureTrainingSampler` fills every batch by
per-source ratios instead, and samples inside each source uniformly or with Repeat Factor Sampling.

- **Sources.** Source k holds the dataset indices ``[offset_k, offset_k + size_k)``, in the order of
  ``names``. Each has its own infinite stream: shuffled epochs (`TrainingSampler`) or RFS
  (`RepeatFactorTrainingSampler`) with factors from that source's records alone. Source k's seed is derived
  from (seed, k), so adding a source leaves the other sources' streams as they were.
- **Shares.** Each rank takes ``b = total_batch_size / world_size`` images per step, ``n_k`` of them from
  source k: the quota ``b * ratio_k / sum(ratios)`` rounded by largest remainder (every quota is floored, then
  the images left over go one each to the sources with the largest fractional parts, the earlier source on a
  tie). ``ratios=[2, 1, 1]`` with 16 images gives 8/4/4; ``[1, 1, 1]`` gives 6/5/5 (logged as a warning).
  Every rank has the same shares, so the global batch holds ``world_size * n_k`` images of source k. A source
  whose ``n_k`` would be 0 is an error that names a total batch size that is enough.
- **Layout and ranks.** A rank's stream is one block of b items per step: ``n_0`` items of source 0, then
  ``n_1`` of source 1, ... Rank r takes items r, r + W, r + 2W, ... of each source's stream (as the other
  training samplers shard), so within a step the ranks' items never overlap and together they are the next
  ``W * n_k`` items of every source.
- **Resume.** ``state_dict()`` holds the per-rank ``position`` and each source sampler's state; a state with
  only ``{"position": k}`` is accepted too (the source positions follow from the block layout).

The train loader must batch consecutive items of the stream: aspect-ratio grouping puts landscape and
portrait images in separate batches, which would break the shares, so it is not supported. Set
``dataloader.train.aspect_ratio_grouping=False`` and give the sampler the loader's ``total_batch_size``;
`build_detection_train_loader` refuses other settings through `MixtureTrainingSampler.check_batching`.
"""

from __future__ import annotations

import itertools
import logging
import math
import numbers
from collections.abc import Iterable, Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from lazytrain.data.repeat_factors import repeat_factors_from_category_frequency
from lazytrain.data.samplers import (
    RepeatFactorTrainingSampler,
    TrainingSampler,
    resolve_rank,
    resolve_seed,
    resumed_seed,
)

__all__ = ["MixtureTrainingSampler"]

logger = logging.getLogger(__name__)

_NAME = "MixtureTrainingSampler"


def _as_list(value: Any) -> list | None:
    """`value` as a list when it is a sequence (a config's ListConfig too), else None."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return None
    return list(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0


def _check_ratios(ratios: Any, labels: Sequence[str]) -> list[Fraction]:
    """One finite ratio > 0 per source, as exact fractions of the numbers as written (0.1 is 1/10)."""
    values = _as_list(ratios)
    if values is None or len(values) != len(labels):
        raise ValueError(
            f"{_NAME}(ratios=) needs one ratio per source ({len(labels)}: {', '.join(labels)}); got "
            f"{ratios!r}. Give e.g. ratios={[1] * len(labels)} for equal shares."
        )
    if not all(_is_number(value) and value > 0 for value in values):
        raise ValueError(
            f"{_NAME}(ratios=) must be finite numbers > 0; got {values}. Leave a source out of the names "
            "rather than give it a ratio of 0."
        )
    return [Fraction(int(v)) if isinstance(v, numbers.Integral) else Fraction(repr(float(v))) for v in values]


def _largest_remainder(ratios: Sequence[Fraction], slots: int) -> list[int]:
    """`slots` split in proportion to `ratios`: quotas floored, the rest to the largest remainders."""
    total = sum(ratios)
    quotas = [slots * ratio / total for ratio in ratios]
    shares = [math.floor(quota) for quota in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda k: (shares[k] - quotas[k], k))
    for k in by_remainder[: slots - sum(shares)]:
        shares[k] += 1
    return shares


def _source_shares(
    ratios: Sequence[Fraction], total_batch_size: Any, world_size: int, labels: Sequence[str]
) -> list[int]:
    """Images of each source in every rank's batch; refuses a batch that cannot hold every source."""
    if not _is_positive_int(total_batch_size) or total_batch_size % world_size:
        raise ValueError(
            f"{_NAME}(total_batch_size=) must be a positive multiple of the world size {world_size}; got "
            f'{total_batch_size!r}. Give it the loader\'s: total_batch_size="${{..total_batch_size}}".'
        )
    per_rank = int(total_batch_size) // world_size
    shares = _largest_remainder(ratios, per_rank)
    empty = [label for label, share in zip(labels, shares) if share == 0]
    if empty:
        enough = next(b for b in itertools.count(per_rank + 1) if min(_largest_remainder(ratios, b)) > 0)
        raise ValueError(
            f"{_NAME}(ratios=): the ratios {':'.join(f'{float(r):g}' for r in ratios)} give "
            f"{', '.join(empty)} no image of the {per_rank} each rank takes per step (total_batch_size="
            f"{total_batch_size}, world_size={world_size}); expected at least one image of every source per "
            f"rank and step. Set total_batch_size to {enough * world_size} or more, or raise the smallest "
            "ratios."
        )
    return shares


def _check_sizes(sizes: Any) -> list[int]:
    values = _as_list(sizes)
    if not values or not all(map(_is_positive_int, values)):
        raise ValueError(
            f"{_NAME}(sizes=) must be a non-empty list of positive ints, the number of images of each source "
            f"in the concatenated dataset; got {sizes!r}. Build it with "
            f"{_NAME}.from_dataset_names(names, ...)."
        )
    return [int(v) for v in values]


def _check_thresholds(repeat_thresh: Any, labels: Sequence[str]) -> list[float | None]:
    """Per-source RFS thresholds; None (or 0) means uniform sampling in that source."""
    values = [repeat_thresh] * len(labels) if repeat_thresh is None or _is_number(repeat_thresh) else None
    values = values or _as_list(repeat_thresh)
    if (
        values is None
        or len(values) != len(labels)
        or not all(v is None or (_is_number(v) and v >= 0) for v in values)
    ):
        raise ValueError(
            f"{_NAME}(repeat_thresh=) must be None, a number >= 0 for every source, or a list with one per "
            f"source ({len(labels)}: {', '.join(labels)}), each None or >= 0 (None or 0: uniform in that "
            f"source); got {repeat_thresh!r}. E.g. repeat_thresh=[0.001, None] for RFS in the first source "
            "only."
        )
    return [None if v is None or v == 0 else float(v) for v in values]


def _check_factors(repeat_factors: Any, sizes: Sequence[int]) -> list[torch.Tensor | None]:
    if repeat_factors is None:
        return [None] * len(sizes)
    values = _as_list(repeat_factors)
    lengths = None if values is None else [None if v is None else len(v) for v in values]
    if (
        lengths is None
        or len(lengths) != len(sizes)
        or any(n not in (None, s) for n, s in zip(lengths, sizes))
    ):
        raise ValueError(
            f"{_NAME}(repeat_factors=) must hold one entry per source, None (uniform) or that source's "
            f"per-image factors; expected lengths {list(sizes)}, got "
            f"{lengths if lengths is not None else repeat_factors!r}."
        )
    return values


def _source_seed(seed: int, source: int) -> int:
    """Source `source`'s seed: a function of (seed, source) only, well apart from the other sources'."""
    state = np.random.SeedSequence([seed % 2**64, source]).generate_state(1, np.uint64)
    return int(state[0]) % 2**63


class MixtureTrainingSampler(Sampler[int]):
    """Infinite stream over concatenated sources in which every batch holds a fixed share of each source.

    The module docstring says how shares are rounded, how a rank's stream is laid out and how it resumes.
    Configs build it with `from_dataset_names` (a data set name per source, the loader's ``names``); this
    constructor takes the sources' sizes and, for RFS, their factors.

    Args:
        sizes: images per source, in the order the sources are concatenated in the dataset.
        ratios: share of each source in every batch, finite and > 0 (``[2, 1, 1]``: a half, two quarters).
        total_batch_size: images per step over all ranks, the loader's ``total_batch_size``.
        repeat_factors: per source, None for shuffled epochs or its per-image RFS factors (length = its size).
        shuffle: shuffle each source's epochs.
        seed: base of the sources' seeds; None draws a random seed shared by all ranks (a collective call).
        rank: this process's rank; defaults to the live process group's.
        world_size: number of processes; defaults to the live process group's.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        ratios: Sequence[float],
        total_batch_size: int,
        *,
        repeat_factors: Sequence[torch.Tensor | Sequence[float] | None] | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self._sizes = _check_sizes(sizes)
        labels = [f"source {k}" for k in range(len(self._sizes))]
        fractions = _check_ratios(ratios, labels)
        self._rank, self._world_size = resolve_rank(_NAME, rank, world_size)
        self._shares = _source_shares(fractions, total_batch_size, self._world_size, labels)
        self._total_batch_size = int(total_batch_size)
        factors = _check_factors(repeat_factors, self._sizes)
        self._seed = resolve_seed(seed)
        self._offsets = [0, *itertools.accumulate(self._sizes)][:-1]
        self._sources = [
            self._source_sampler(size, source_factors, shuffle, _source_seed(self._seed, k))
            for k, (size, source_factors) in enumerate(zip(self._sizes, factors))
        ]
        # Source of each slot of a rank's per-step block.
        self._layout = [k for k, share in enumerate(self._shares) for _ in range(share)]
        self._resume_position = 0  # where the next iteration starts
        self._position = 0  # items yielded so far
        _log_shares(fractions, self._shares, self._world_size, labels)

    def _source_sampler(
        self, size: int, factors: torch.Tensor | Sequence[float] | None, shuffle: bool, seed: int
    ) -> TrainingSampler | RepeatFactorTrainingSampler:
        common = dict(shuffle=shuffle, seed=seed, rank=self._rank, world_size=self._world_size)
        if factors is None:
            return TrainingSampler(size, **common)
        return RepeatFactorTrainingSampler(factors, **common)

    @property
    def seed(self) -> int:
        """The base seed (shared by all ranks)."""
        return self._seed

    @property
    def size(self) -> int:
        """Images in the concatenated dataset (all sources)."""
        return sum(self._sizes)

    @property
    def sizes(self) -> list[int]:
        """Images per source."""
        return list(self._sizes)

    @property
    def shares(self) -> list[int]:
        """Images of each source in every rank's batch (times world size: in the global batch)."""
        return list(self._shares)

    @property
    def total_batch_size(self) -> int:
        """Images per step over all ranks, the batch the shares are for."""
        return self._total_batch_size

    def check_batching(self, total_batch_size: int, aspect_ratio_grouping: bool) -> None:
        """Refuse a train loader whose batches would not keep the shares.

        Args:
            total_batch_size: the loader's images per step over all ranks; must equal the sampler's.
            aspect_ratio_grouping: whether the loader groups batches by aspect ratio; must be False.
        """
        if total_batch_size != self._total_batch_size:
            raise ValueError(
                f"{_NAME}: dataloader.train.total_batch_size={total_batch_size} but the sampler's shares are "
                f"for total_batch_size={self._total_batch_size}; set "
                'dataloader.train.sampler.total_batch_size="${..total_batch_size}".'
            )
        if aspect_ratio_grouping:
            raise ValueError(
                f"{_NAME}: dataloader.train.aspect_ratio_grouping=True would form batches of landscape or of "
                "portrait images only, not of the per-source shares; set "
                "dataloader.train.aspect_ratio_grouping=False."
            )

    @property
    def sources(self) -> list[TrainingSampler | RepeatFactorTrainingSampler]:
        """The per-source samplers (their indices are local to the source)."""
        return list(self._sources)

    @classmethod
    def from_dataset_names(
        cls,
        names: str | Sequence[str],
        ratios: Sequence[float],
        total_batch_size: int,
        repeat_thresh: float | Sequence[float | None] | None = None,
        *,
        sqrt: bool = True,
        instance_aware: bool = False,
        filter_empty: bool = True,
        shuffle: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> MixtureTrainingSampler:
        """The config-facing constructor: sizes and RFS factors from each registered data set's records.

        In a recipe whose loader reads ``dataset=L(get_detection_dataset_dicts)(names=[...])``::

            sampler=L(MixtureTrainingSampler.from_dataset_names)(
                names="${..dataset.names}", ratios=[1, 1], total_batch_size="${..total_batch_size}",
                repeat_thresh=[0.001, None], seed="${train.seed}"),
            aspect_ratio_grouping=False,

        Every argument is checked before any data set is loaded. Each source is then loaded here, one at a
        time, besides the loader's own load: cheap for json-backed data sets, which map their annotation
        cache, while one registered as a plain function runs that function again.

        Args:
            names: the registered data sets, in the loader's order.
            ratios: share of each source in every batch.
            total_batch_size: the loader's images per step over all ranks.
            repeat_thresh: RFS threshold t for every source, or a list with one per source; None or 0 samples
                that source uniformly (shuffled epochs).
            sqrt: r_c = sqrt(t / f_c) as in the LVIS paper; False uses t / f_c.
            instance_aware: instance-aware RFS (see `repeat_factors_from_category_frequency`).
            filter_empty: as the loader's `get_detection_dataset_dicts` (default True: images without
                annotations are dropped), so the sizes match its records.
            shuffle: shuffle each source's epochs.
            seed: base of the sources' seeds; None draws a random seed shared by all ranks.
            rank: this process's rank; defaults to the live process group's.
            world_size: number of processes; defaults to the live process group's.
        """
        labels = [names] if isinstance(names, str) else _as_list(names)
        if not labels or not all(isinstance(name, str) for name in labels):
            raise ValueError(f"{_NAME}.from_dataset_names(names=) must be data set names; got {names!r}")
        _, checked_world_size = resolve_rank(_NAME, rank, world_size)
        _source_shares(_check_ratios(ratios, labels), total_batch_size, checked_world_size, labels)
        thresholds = _check_thresholds(repeat_thresh, labels)
        sizes, factors = _load_sources(
            labels, thresholds, filter_empty, sqrt=sqrt, instance_aware=instance_aware
        )
        logger.info("%s: sources %s of %s images.", _NAME, labels, sizes)
        common = dict(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        return cls(sizes, ratios, total_batch_size, repeat_factors=factors, **common)

    def __iter__(self) -> Iterator[int]:
        position = self._resume_position
        self._position = position
        streams = [iter(source) for source in self._sources]  # each starts at its loaded state
        layout, offsets = self._layout, self._offsets
        slot = position % len(layout)
        while True:
            source = layout[slot]
            index = next(streams[source]) + offsets[source]
            position += 1
            self._position = position
            yield index
            slot = slot + 1 if slot + 1 < len(layout) else 0

    def _source_positions(self, position: int) -> list[int]:
        """Items each source has given this rank once the rank has taken `position` items."""
        steps, slot = divmod(position, len(self._layout))
        positions = [steps * share for share in self._shares]
        for source in self._layout[:slot]:
            positions[source] += 1
        return positions

    def state_dict(self) -> dict[str, Any]:
        """The state after the items yielded so far: ``seed``, per-rank ``position``, ``shares`` and
        ``sources`` (each source sampler's `state_dict`, from which it regenerates one epoch to resume)."""
        return {
            "seed": self._seed,
            "position": self._position,
            "shares": list(self._shares),
            "sources": [source.state_dict() for source in self._sources],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration where `state` (from `state_dict`, or just ``{"position": k}``) points.

        A ``seed`` in the state replaces the constructor's seed (the checkpoint describes the run).
        """
        self._seed = resumed_seed(_NAME, state, self._seed)
        if state.get("shares") is not None and list(state["shares"]) != self._shares:
            logger.warning(
                "%s: resuming a state saved with shares %s per rank into shares %s: the sources continue "
                "from their positions, but the batches differ from those of an uninterrupted run.",
                _NAME,
                list(state["shares"]),
                self._shares,
            )
        position = int(state["position"])
        sources = state.get("sources")
        if sources is None:
            sources = [
                {"position": p, "seed": _source_seed(self._seed, k)}
                for k, p in enumerate(self._source_positions(position))
            ]
        if len(sources) != len(self._sources):
            raise ValueError(
                f"{_NAME}.load_state_dict: the state holds {len(sources)} sources, this sampler has "
                f"{len(self._sources)}; resume with the names the state was saved with."
            )
        for source, source_state in zip(self._sources, sources):
            source.load_state_dict(source_state)
        self._resume_position = self._position = position


def _load_sources(
    names: Sequence[str],
    thresholds: Sequence[float | None],
    filter_empty: bool,
    *,
    sqrt: bool,
    instance_aware: bool,
) -> tuple[list[int], list[torch.Tensor | None]]:
    """Each source's size and RFS factors (None where its threshold is None), one source at a time."""
    from lazytrain.data.build import get_detection_dataset_dicts

    sizes, factors = [], []
    for name, threshold in zip(names, thresholds):
        records = get_detection_dataset_dicts(name, filter_empty=filter_empty)
        sizes.append(len(records))
        factors.append(
            None
            if threshold is None
            else repeat_factors_from_category_frequency(
                records, threshold, sqrt=sqrt, instance_aware=instance_aware
            )
        )
        del records
    return sizes, factors


def _log_shares(ratios: Sequence[Fraction], shares: list[int], world_size: int, labels: list[str]) -> None:
    exact = [sum(shares) * ratio / sum(ratios) for ratio in ratios]
    text = ", ".join(f"{label} {share}" for label, share in zip(labels, shares))
    rounded = f" (rounded from {', '.join(f'{float(q):.2f}' for q in exact)})" if exact != shares else ""
    log = logger.warning if rounded else logger.info
    log("%s: each rank's batch of %d holds %s%s, x%d ranks.", _NAME, sum(shares), text, rounded, world_size)
