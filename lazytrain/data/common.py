"""Datasets in memory: `DatasetFromList` (records serialized in one buffer) and `MapDataset` (apply a mapper,
skipping bad images, with per-sample seeding for reproducible augmentation).

`DatasetFromList` pickles all records into one contiguous numpy byte buffer plus an int64 offset array. Data
loader workers forked from the main process then share two large arrays, instead of touching (and so copying,
through reference counts) millions of small Python objects page by page.
"""

from __future__ import annotations

import copy
import logging
import pickle
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.errors import LazytrainError

__all__ = ["DatasetFromList", "MapDataset", "seed_sample_rngs"]

logger = logging.getLogger(__name__)


class DatasetFromList(Dataset):
    """A list of records as a torch Dataset.

    Args:
        lst: the records (any picklable objects). `CachedRecords` (a json's records in its cache file) are
            served as they are: they already live in one buffer, which every process maps.
        copy: when not serialized, return a deep copy of the record on access so a mapper may modify it
            (serialized records are always fresh objects).
        serialize: keep the records pickled in one byte buffer (recommended: constant memory per worker).
    """

    def __init__(self, lst: Sequence[Any], copy: bool = True, serialize: bool = True) -> None:
        self._copy = copy
        self._serialize = serialize
        self._cached = lst if isinstance(lst, CachedRecords) else None
        if self._cached is not None:
            return
        if not serialize:
            self._records = list(lst)
            return
        blobs = [pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL) for record in lst]
        self._offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, blobs), np.int64, count=len(blobs)), out=self._offsets[1:])
        self._buffer = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        logger.debug("Serialized %d records into %.2f MiB.", len(blobs), self._buffer.nbytes / 2**20)

    @property
    def cached_records(self) -> CachedRecords | None:
        """The `CachedRecords` served, or None when the records were given as a list."""
        return self._cached

    def __len__(self) -> int:
        if self._cached is not None:
            return len(self._cached)
        return len(self._offsets) - 1 if self._serialize else len(self._records)

    def __getitem__(self, index: int) -> Any:
        if self._cached is not None:
            return self._cached[index]
        if self._serialize:
            start, end = int(self._offsets[index]), int(self._offsets[index + 1])
            return pickle.loads(memoryview(self._buffer[start:end]))
        return copy.deepcopy(self._records[index]) if self._copy else self._records[index]


def seed_sample_rngs(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs, from which random augmentations draw.

    Args:
        seed: any int >= 0 (numpy takes it modulo 2**32).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # The CPU generator only: torch.manual_seed also seeds every accelerator generator, at a cost per sample.
    torch.default_generator.manual_seed(seed)


class _PreservedGlobalRngs:
    """Context manager restoring the global RNGs on exit (so per-sample seeding in the main process does not
    change the trainer's randomness)."""

    def __enter__(self) -> None:
        self._states = random.getstate(), np.random.get_state(), torch.get_rng_state()

    def __exit__(self, *exc_info: object) -> None:
        python, numpy, torch_state = self._states
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(torch_state)


def _describe(record: Any) -> str:
    if isinstance(record, dict):
        return str(record.get("file_name", record.get("image_id", "a record without file_name")))
    return repr(record)[:200]


class MapDataset(Dataset):
    """Apply `map_func` to each item of `dataset`, replacing items that cannot be mapped.

    When the mapper returns None or raises (a missing or corrupt image, say), a warning names the record's
    ``file_name`` and another, deterministically chosen item is used instead. When the items that failed in
    this process exceed `max_failure_fraction` of the data set, an error stops the run: a broken data set
    should not train silently on what is left. Use ``max_failure_fraction=0`` for evaluation, where every
    image must be mapped.

    An item can be requested as ``(index, sample_seed)``: the global Python, numpy and torch RNGs are then
    seeded with `sample_seed` before mapping (and restored afterwards outside loader workers), which makes
    random augmentation a function of the sample; the train loader does this so resumed runs see the same
    augmented images.

    Args:
        dataset: a dataset of records (e.g. `DatasetFromList`).
        map_func: record -> model input, e.g. a `DatasetMapper`.
        max_failure_fraction: largest fraction of items that may fail (in [0, 1]).
        fraction_setting: where a user sets `max_failure_fraction`, named in the error as what to raise (the
            train loader passes its config key); None gives no such advice (evaluation maps every image).
    """

    def __init__(
        self,
        dataset: Dataset,
        map_func: Callable[[Any], Any],
        max_failure_fraction: float = 0.01,
        *,
        fraction_setting: str | None = "MapDataset(max_failure_fraction=)",
    ) -> None:
        if not 0 <= max_failure_fraction <= 1:
            setting = fraction_setting or "MapDataset(max_failure_fraction=)"
            raise ValueError(f"{setting} must be in [0, 1]; got {max_failure_fraction}")
        self._dataset = dataset
        self._map_func = map_func
        self._max_failures = int(max_failure_fraction * len(dataset))
        self._max_failure_fraction = max_failure_fraction
        self._fraction_setting = fraction_setting
        self._failed: set[int] = set()

    @property
    def dataset(self) -> Dataset:
        """The dataset of records being mapped (e.g. a `DatasetFromList`)."""
        return self._dataset

    @property
    def map_func(self) -> Callable[[Any], Any]:
        """The function each record is mapped with (e.g. a `DatasetMapper`)."""
        return self._map_func

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, item: int | tuple[int, int]) -> Any:
        index, seed = item if isinstance(item, tuple) else (item, None)
        if seed is None:
            return self._map_with_retries(index, None)
        if torch.utils.data.get_worker_info() is not None:
            return self._map_with_retries(index, seed)
        with _PreservedGlobalRngs():
            return self._map_with_retries(index, seed)

    def _map_with_retries(self, index: int, seed: int | None) -> Any:
        retry_rng = random.Random(index if seed is None else seed)  # the same replacement on every run
        while True:
            if seed is not None:
                seed_sample_rngs(seed)
            record = self._dataset[index]
            try:
                result, error = self._map_func(record), None
            except Exception as e:  # one bad image must not end a long run
                result, error = None, e
            if result is not None:
                return result
            self._record_failure(index, record, error)
            index = retry_rng.randrange(len(self._dataset))
            seed = None if seed is None else retry_rng.randrange(2**63)

    def _record_failure(self, index: int, record: Any, error: Exception | None) -> None:
        name = _describe(record)
        reason = f"{type(error).__name__}: {error}" if error is not None else "the mapper returned None"
        if index not in self._failed:
            self._failed.add(index)
            logger.warning("Skipping %s (%s); using another image instead.", name, reason)
        if len(self._failed) > self._max_failures:
            advice = f", or raise {self._fraction_setting}" if self._fraction_setting else ""
            raise LazytrainError(
                f"MapDataset: {len(self._failed)} of {len(self)} items failed to map, more than "
                f"max_failure_fraction={self._max_failure_fraction}; the last was {name} ({reason}). Check the "
                f"data set files (missing or corrupt images){advice}."
            ) from error
