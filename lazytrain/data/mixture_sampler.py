"""Mixture sampling: every batch holds a fixed share of images from each of several data sets (sources).

Detectors trained on a mixture (LVIS + COCO + an Objects365-style set) concatenate the sources
(``get_detection_dataset_dicts(names)``); sampling the concatenation uniformly gives each batch whatever mix
the sources' sizes make, and a small source is rarely seen. `MixtureTrainingSampler` fills every batch by
per-source ratios instead, and samples inside each source uniformly or with Repeat Factor Sampling. The
shares hold over each step's global batch, whatever the world size; ranks take different mixes within a step.

- **Shares.** Every step's global batch of B = ``total_batch_size`` images holds ``Q_k`` images of source k:
  the quota ``B * ratio_k / sum(ratios)`` rounded by largest remainder (every quota is floored, then the
  images left over go one each to the sources with the largest fractional parts, the earlier source on a tie).
  ``ratios=[2, 1]`` with 16 images gives 11/5, ``[2, 1, 1]`` gives 8/4/4 and ``[1, 1, 1]`` 6/5/5 (rounding is
  logged as a warning). The shares do not depend on the world size. A source whose ``Q_k`` would be 0 is an
  error that names a total batch size that is enough.
- **Ranks.** Each of the W ranks takes ``b = B / W`` images per step, computed from (step, shares, rank)
  alone, with no communication. Source k's ``Q_k`` items of the step (the next ``Q_k`` of its stream) are dealt
  round-robin, item i to rank ``(start_k + i) mod W``: within a step the ranks' items never overlap and
  together they are the next ``Q_k`` items of every source. Where W does not divide ``Q_k``, ``Q_k mod W``
  ranks take one image of source k more than the others. ``start_k`` lays these extras end to end over the
  sources (it is the number of extras of the sources before k, plus a rotation), so every rank gets the same
  number of extras and a batch of b. The rotation is the step mod W: over any W consecutive steps every rank
  takes ``Q_k`` images of source k, the global mix, rather than always the same part of it. Where W divides
  every ``Q_k`` there is no rotation and rank r takes items r, r + W, ... of every source, as the other
  training samplers shard. A rank's block of a step is its items of source 0, then of source 1, ...
- **Sources.** Source k holds the dataset indices ``[offset_k, offset_k + size_k)``, in the order of
  ``names``. Each has its own infinite stream, the same on every rank: shuffled epochs (`TrainingSampler`) or
  RFS (`RepeatFactorTrainingSampler`) with factors from that source's records alone. Source k's seed is
  derived from (seed, k), so adding a source leaves the other sources' streams as they were. Every rank reads
  all B items of a step and keeps its own (a few microseconds per item).
- **Resume.** ``state_dict()`` holds the per-rank ``position`` (items yielded; step ``position // b``), the
  world size, total batch size and shares it was saved with, and each source sampler's state at the start of
  that step. Loading it with the same world size and batch continues exactly. With another world size at a
  step boundary (every state the train loader saves) the global batches continue exactly, only split
  differently over the ranks (`reshard_state_dict`, which the train loader asks when a run is resumed on
  another number of processes); a state saved mid-step then restarts that step. A state with only
  ``{"position": k}`` gets the sources' positions from the step (``step * Q_k``). One saved before the shares
  were global (per-rank ``shares``, no ``world_size``) continues each source after the ``step * W * n_k``
  items the old run's W ranks drew from it, with today's shares (a warning says when they differ).

The train loader must batch consecutive items of the stream: aspect-ratio grouping puts landscape and
portrait images in separate batches, which would break the shares, so it is not supported. Set
``dataloader.train.aspect_ratio_grouping=False`` and give the sampler the loader's ``total_batch_size``;
`build_detection_train_loader` refuses other settings through `MixtureTrainingSampler.check_batching`, and the
checks before a run refuse them, and ratios that give a source no image, before anything is written or loaded
(`find_mixture_problems`).
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

__all__ = ["MixtureTrainingSampler", "find_mixture_problems"]

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


def _check_total_batch_size(total_batch_size: Any, world_size: int) -> int:
    if not _is_positive_int(total_batch_size) or total_batch_size % world_size:
        raise ValueError(
            f"{_NAME}(total_batch_size=) must be a positive multiple of the world size {world_size}; got "
            f'{total_batch_size!r}. Give it the loader\'s: total_batch_size="${{..total_batch_size}}".'
        )
    return int(total_batch_size)


def _step_shares(ratios: Sequence[Fraction], total: int, world_size: int, labels: Sequence[str]) -> list[int]:
    """Images of each source in every step's global batch; refuses a batch that cannot hold every source."""
    shares = _largest_remainder(ratios, total)
    empty = [label for label, share in zip(labels, shares) if share == 0]
    if empty:
        # Largest remainder is not monotone in the batch size (the Alabama paradox), so name one that works.
        first = (total // world_size + 1) * world_size
        enough = next(n for n in itertools.count(first, world_size) if min(_largest_remainder(ratios, n)) > 0)
        raise ValueError(
            f"{_NAME}(ratios=): the ratios {':'.join(f'{float(r):g}' for r in ratios)} give "
            f"{', '.join(empty)} no image of the {total} per step (total_batch_size={total} over "
            f"world_size={world_size}); expected at least one image of every source in every step's batch. "
            f"total_batch_size={enough} is enough, or raise the smallest ratios."
        )
    return shares


def find_mixture_problems(
    names: Sequence[str],
    ratios: Any,
    total_batch_size: Any,
    world_size: int,
    *,
    loader_total_batch_size: Any,
    aspect_ratio_grouping: bool,
) -> dict[str, str]:
    """What `MixtureTrainingSampler.from_dataset_names` and the train loader would refuse in these settings,
    from the values alone (no source is loaded), by the argument to change: the sampler's ``ratios`` (one per
    source, each source at least one image per step) or ``total_batch_size`` (a multiple of the world size,
    the loader's), or the loader's ``aspect_ratio_grouping``. The checks before a run report them with their key
    paths (`lazytrain.program.preflight.batch`).

    Args:
        names: the sources' data set names.
        ratios: the sampler's ratios.
        total_batch_size: the sampler's images per step over all ranks.
        world_size: the job's number of processes.
        loader_total_batch_size: the train loader's ``total_batch_size``.
        aspect_ratio_grouping: the train loader's ``aspect_ratio_grouping``.
    """
    fractions, ratios_problem = _checked(_check_ratios, ratios, names)
    total, total_problem = _checked(_check_total_batch_size, total_batch_size, world_size)
    if ratios_problem is None and total_problem is None:
        _, ratios_problem = _checked(_step_shares, fractions, total, world_size, names)
    problems = {"ratios": ratios_problem, "total_batch_size": total_problem}
    loader = _find_loader_problems(total_batch_size, loader_total_batch_size, aspect_ratio_grouping)
    for argument, problem in loader.items():
        problems[argument] = problems.get(argument) or problem
    return {argument: problem for argument, problem in problems.items() if problem is not None}


def _checked(check: Any, *args: Any) -> tuple[Any, str | None]:
    """`check(*args)`'s value and None, or None and the message of the ValueError it raises."""
    try:
        return check(*args), None
    except ValueError as e:
        return None, str(e)


def _find_loader_problems(
    total_batch_size: Any, loader_total_batch_size: Any, aspect_ratio_grouping: bool
) -> dict[str, str]:
    """The train loader's settings that would not keep the shares, by argument (the sampler's
    ``total_batch_size``, the loader's ``aspect_ratio_grouping``)."""
    problems = {}
    if loader_total_batch_size != total_batch_size:
        problems["total_batch_size"] = (
            f"{_NAME}: dataloader.train.total_batch_size={loader_total_batch_size} but the sampler's shares are "
            f"for total_batch_size={total_batch_size}; set "
            'dataloader.train.sampler.total_batch_size="${..total_batch_size}".'
        )
    if aspect_ratio_grouping:
        problems["aspect_ratio_grouping"] = (
            f"{_NAME}: dataloader.train.aspect_ratio_grouping=True would form batches of landscape or of "
            "portrait images only, not of the per-source shares; set "
            "dataloader.train.aspect_ratio_grouping=False."
        )
    return problems


def _deal_starts(shares: Sequence[int], world_size: int, step: int) -> list[int]:
    """The rank that takes the first of each source's items of step `step` (dealt round-robin from there).

    The extras (``share mod world_size`` per source) are laid end to end, each source's after the previous
    ones', and shifted by the step: every rank takes the same number of extras in a step, and each extra
    visits every rank once in any `world_size` steps. Without extras nothing rotates, so rank r takes items
    r, r + W, ... of every source, as the other training samplers shard.
    """
    extras = [share % world_size for share in shares]
    rotation = step % world_size if any(extras) else 0
    laid = itertools.accumulate(extras, initial=0)
    return [(before + rotation) % world_size for before, _ in zip(laid, extras)]


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
    """Infinite stream over concatenated sources in which every step's global batch holds a fixed share of
    each source.

    The module docstring says how shares are rounded, how the ranks split each step and how it resumes.
    Configs build it with `from_dataset_names` (a data set name per source, the loader's ``names``); this
    constructor takes the sources' sizes and, for RFS, their factors.

    Args:
        sizes: images per source, in the order the sources are concatenated in the dataset.
        ratios: share of each source in every step's batch over all ranks, finite and > 0 (``[2, 1, 1]``: a
            half, two quarters).
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
        total = _check_total_batch_size(total_batch_size, self._world_size)
        self._shares = _step_shares(fractions, total, self._world_size, labels)
        self._total_batch_size = int(total_batch_size)
        self._per_rank = self._total_batch_size // self._world_size
        factors = _check_factors(repeat_factors, self._sizes)
        self._seed = resolve_seed(seed)
        self._offsets = [0, *itertools.accumulate(self._sizes)][:-1]
        # Every rank reads each source's whole stream (world size 1) and keeps its own items of each step.
        self._sources = [
            self._source_sampler(size, source_factors, shuffle, _source_seed(self._seed, k))
            for k, (size, source_factors) in enumerate(zip(self._sizes, factors))
        ]
        self._position = 0  # items yielded so far; the step is position // per-rank batch
        # The sources' states at the start of a step, by step: the current one and, once its items are drawn,
        # the next (the state after a rank's last item of a step is the start of the next step).
        self._step_sources = {0: [source.state_dict() for source in self._sources]}
        self._resume = (self._position, self._step_sources)  # where the next iteration starts
        _log_shares(fractions, self._shares, self._world_size, labels)

    def _source_sampler(
        self, size: int, factors: torch.Tensor | Sequence[float] | None, shuffle: bool, seed: int
    ) -> TrainingSampler | RepeatFactorTrainingSampler:
        common = dict(shuffle=shuffle, seed=seed, rank=0, world_size=1)
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
        """Images of each source in every step's batch over all ranks (`get_rank_shares`: one rank's)."""
        return list(self._shares)

    def get_rank_shares(self, step: int, rank: int | None = None) -> list[int]:
        """Images of each source that `rank` (default: this sampler's) takes in step `step`.

        Args:
            step: the training step (0-based; the rank's ``position // (total_batch_size / world_size)``).
            rank: a rank in [0, world_size); None for this sampler's.
        """
        rank = self._rank if rank is None else rank
        if not 0 <= rank < self._world_size:
            raise ValueError(
                f"{_NAME}.get_rank_shares(rank=) must be in [0, {self._world_size}), the sampler's world size; "
                f"got {rank}."
            )
        starts = _deal_starts(self._shares, self._world_size, step)
        return [
            len(range((rank - start) % self._world_size, share, self._world_size))
            for start, share in zip(starts, self._shares)
        ]

    @property
    def total_batch_size(self) -> int:
        """Images per step over all ranks, the batch the shares are for."""
        return self._total_batch_size

    def check_batching(
        self, total_batch_size: int, aspect_ratio_grouping: bool, world_size: int | None = None
    ) -> None:
        """Refuse a train loader whose batches would not keep the shares.

        Each rank's stream is one block of ``total_batch_size / world_size`` items per step, so the loader
        must batch that many consecutive items.

        Args:
            total_batch_size: the loader's images per step over all ranks; must equal the sampler's.
            aspect_ratio_grouping: whether the loader groups batches by aspect ratio; must be False.
            world_size: the loader's number of processes; must equal the sampler's (None: not checked).
        """
        if world_size is not None and world_size != self._world_size:
            raise ValueError(
                f"{_NAME}: the train loader's world size is {world_size} but the sampler was built for "
                f"world_size={self._world_size}, so its per-step blocks are not the loader's batches; leave "
                "the sampler's rank and world_size unset (the live process group's)."
            )
        problems = _find_loader_problems(self._total_batch_size, total_batch_size, aspect_ratio_grouping)
        if problems:
            raise ValueError(next(iter(problems.values())))

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
            ratios: share of each source in every step's batch over all ranks.
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
        fractions = _check_ratios(ratios, labels)
        total = _check_total_batch_size(total_batch_size, checked_world_size)
        _step_shares(fractions, total, checked_world_size, labels)
        thresholds = _check_thresholds(repeat_thresh, labels)
        sizes, factors = _load_sources(
            labels, thresholds, filter_empty, sqrt=sqrt, instance_aware=instance_aware
        )
        logger.info("%s: sources %s of %s images.", _NAME, labels, sizes)
        common = dict(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        return cls(sizes, ratios, total_batch_size, repeat_factors=factors, **common)

    def __iter__(self) -> Iterator[int]:
        self._position, self._step_sources = self._resume
        step, slot = divmod(self._position, self._per_rank)
        streams = [iter(source) for source in self._sources]  # each starts at its loaded state
        while True:
            start = self._step_sources[step]
            drawn = [list(itertools.islice(stream, share)) for stream, share in zip(streams, self._shares)]
            self._step_sources = {step: start, step + 1: [source.state_dict() for source in self._sources]}
            for index in self._rank_block(step, drawn)[slot:]:
                self._position += 1
                yield index
            step, slot = step + 1, 0

    def _rank_block(self, step: int, drawn: Sequence[list[int]]) -> list[int]:
        """This rank's items of a step, source by source, from every source's items of the step."""
        world_size, block = self._world_size, []
        starts = _deal_starts(self._shares, world_size, step)
        for items, start, offset in zip(drawn, starts, self._offsets):
            block.extend(index + offset for index in items[(self._rank - start) % world_size :: world_size])
        return block

    def state_dict(self) -> dict[str, Any]:
        """The state after the items yielded so far: ``seed``, per-rank ``position``, the ``world_size``,
        ``total_batch_size`` and ``shares`` it was saved with and ``sources`` (each source sampler's
        `state_dict` at the start of the current step, from which it regenerates one epoch to resume)."""
        step = self._position // self._per_rank
        return {
            "seed": self._seed,
            "position": self._position,
            "world_size": self._world_size,
            "total_batch_size": self._total_batch_size,
            "shares": list(self._shares),
            "sources": [dict(source) for source in self._step_sources[step]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration where `state` (from `state_dict`, or just ``{"position": k}``) points.

        A ``seed`` in the state replaces the constructor's seed (the checkpoint describes the run). The module
        docstring says what a state saved with another world size or batch resumes to.
        """
        self._seed = resumed_seed(_NAME, state, self._seed)
        per_rank_shares = None
        if state.get("world_size") is None and state.get("shares") is not None:
            per_rank_shares = [int(share) for share in state["shares"]]
            state = self._from_per_rank_shares(state, self._world_size)
        sources = state.get("sources")
        if sources is not None and len(sources) != len(self._sources):
            raise ValueError(
                f"{_NAME}.load_state_dict: the state holds {len(sources)} sources, this sampler has "
                f"{len(self._sources)}; resume with the names the state was saved with."
            )
        current = (self._world_size, self._total_batch_size)
        # A state without a world size is only a position, which counts this sampler's steps.
        saved = (
            current if state.get("world_size") is None else (state["world_size"], state["total_batch_size"])
        )
        saved = (int(saved[0]), int(saved[1]))
        step, slot = divmod(int(state["position"]), saved[1] // saved[0])
        if saved != current:
            self._log_resized_resume(saved, slot)
            slot = 0
        if state.get("shares") is not None and [int(share) for share in state["shares"]] != self._shares:
            logger.warning(
                "%s: resuming a state saved with shares %s per step%s into shares %s: the sources continue "
                "from their positions, but the batches differ from those of an uninterrupted run.",
                _NAME,
                [int(share) for share in state["shares"]],
                f" (per rank {per_rank_shares} on {saved[0]} ranks)" if per_rank_shares else "",
                self._shares,
            )
        if sources is None:
            sources = [
                {"position": step * share, "seed": _source_seed(self._seed, k)}
                for k, share in enumerate(self._shares)
            ]
        for source, source_state in zip(self._sources, sources):
            source.load_state_dict(source_state)
        self._step_sources = {step: [source.state_dict() for source in self._sources]}
        self._position = step * self._per_rank + slot
        self._resume = (self._position, self._step_sources)

    def reshard_state_dict(self, state: dict[str, Any], world_size: int) -> dict[str, Any] | None:
        """`state`, saved by a rank of `world_size` ranks at a step boundary, as this rank's state at the same
        step: every rank's state is the same there, so rank 0's continues the global batches at any world size.

        None when that is not exact: the state was saved in the middle of a step, with another total batch
        size (the steps would hold other numbers of items), or holds only a position.
        """
        if state.get("world_size") is None:
            shares = state.get("shares")
            if shares is None or int(state["position"]) % sum(int(share) for share in shares):
                return None
            state = self._from_per_rank_shares(state, int(world_size))
        saved_world_size, saved_total = int(state["world_size"]), int(state["total_batch_size"])
        step, slot = divmod(int(state["position"]), saved_total // saved_world_size)
        if saved_world_size != int(world_size) or saved_total != self._total_batch_size or slot:
            return None
        return dict(state, position=step * self._per_rank, world_size=self._world_size)

    def _from_per_rank_shares(self, state: dict[str, Any], world_size: int) -> dict[str, Any]:
        """A state saved before the shares were global, by one of `world_size` ranks, in today's form.

        Such a state has per-rank ``shares`` and no ``world_size``, and its sources were sharded by rank: at
        step s every rank had drawn ``s * share_k`` items of source k, so the run had drawn
        ``s * world_size * share_k`` of its global stream, where the source continues.
        """
        seed = self._seed if state.get("seed") is None else int(state["seed"])
        shares = [int(share) for share in state["shares"]]
        step, slot = divmod(int(state["position"]), sum(shares))
        if slot:
            logger.warning(
                "%s: the state was saved in the middle of a step before the shares were global; that step "
                "starts again (its images taken before the stop come again).",
                _NAME,
            )
        return {
            "seed": seed,
            "position": step * sum(shares),
            "world_size": world_size,
            "total_batch_size": world_size * sum(shares),
            "shares": [world_size * share for share in shares],
            "sources": [
                {"position": step * world_size * share, "seed": _source_seed(seed, k)}
                for k, share in enumerate(shares)
            ],
        }

    def _log_resized_resume(self, saved: tuple[int, int], slot: int) -> None:
        """Say what resuming a state saved with (world size, total batch size) `saved` continues."""
        if slot:
            logger.warning(
                "%s: the state was saved in the middle of a step with world size %d and batch %d; with world "
                "size %d and batch %d that step starts again (its images taken before the stop come again).",
                _NAME,
                *saved,
                self._world_size,
                self._total_batch_size,
            )
        else:
            logger.info(
                "%s: resuming a state of world size %d and batch %d with world size %d and batch %d: the "
                "sources continue from the step's positions, split over the ranks anew.",
                _NAME,
                *saved,
                self._world_size,
                self._total_batch_size,
            )


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
    log("%s: every step's batch of %d over all ranks holds %s%s.", _NAME, sum(shares), text, rounded)
    if any(share % world_size for share in shares):
        spread = ", ".join(
            f"{label} {share // world_size}" + ("-" + str(share // world_size + 1)) * bool(share % world_size)
            for label, share in zip(labels, shares)
        )
        logger.info(
            "%s: each of the %d ranks takes %d per step: %s, the ranks that take one more rotating every step.",
            _NAME,
            world_size,
            sum(shares) // world_size,
            spread,
        )
