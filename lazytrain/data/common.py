"""Datasets in memory: `DatasetFromList` (records serialized in one buffer) and `MapDataset` (apply a mapper).

`DatasetFromList` pickles all records into one contiguous numpy byte buffer plus offsets: data-loader
workers then share a few large arrays instead of touching (and so copying, through reference counts)
millions of small Python objects.
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

__all__ = ["DatasetFromList", "MapDataset", "seed_sample_rngs"]

logger = logging.getLogger(__name__)


class DatasetFromList(Dataset):
    """A list of records as a torch Dataset.

    Args:
        records: the records.
        copy: return a deep copy of a record on access (when not serialized), so mappers may modify it.
        serialize: keep records pickled in one byte buffer (recommended for large data sets).
    """

    def __init__(self, records: Sequence[Any], copy: bool = True, serialize: bool = True) -> None:
        self._copy = copy
        self._serialize = serialize
        if serialize:
            blobs = [np.frombuffer(pickle.dumps(r, protocol=-1), dtype=np.uint8) for r in records]
            self._offsets = np.cumsum([0] + [len(b) for b in blobs], dtype=np.int64)
            self._buffer = np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)
            logger.info("Serialized %d records into %.2f MB", len(records), len(self._buffer) / 1024**2)
        else:
            self._records = list(records)

    def __len__(self) -> int:
        return len(self._offsets) - 1 if self._serialize else len(self._records)

    def __getitem__(self, index: int) -> Any:
        if self._serialize:
            start, end = self._offsets[index], self._offsets[index + 1]
            return pickle.loads(memoryview(self._buffer[start:end]))
        return copy.deepcopy(self._records[index]) if self._copy else self._records[index]


def seed_sample_rngs(seed: int) -> None:
    """Seed python/numpy/torch global RNGs for one sample (random augmentations draw from them)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class MapDataset(Dataset):
    """Apply `map_func` to each item; on a failure (None or an exception such as a missing image) log a
    warning naming the file and use another item, stopping with an error when failures exceed
    `max_failure_fraction` of the items mapped (after at least 5 failures).

    Items may be requested as ``(index, sample_seed)``: the global RNGs are then seeded with `sample_seed`
    before mapping, which makes random augmentation a function of the sample (exact resume).
    """

    def __init__(
        self, dataset: Dataset, map_func: Callable[[Any], Any], max_failure_fraction: float = 0.01
    ) -> None:
        self._dataset = dataset
        self._map_func = map_func
        self._max_failure_fraction = max_failure_fraction
        self._attempts = 0
        self._failures = 0

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, item: int | tuple[int, int]) -> Any:
        index, seed = item if isinstance(item, tuple) else (item, None)
        retry_rng = random.Random(index if seed is None else seed)
        while True:
            if seed is not None:
                seed_sample_rngs(seed)
            record = self._dataset[index]
            self._attempts += 1
            try:
                result = self._map_func(record)
                error = None
            except Exception as e:  # a bad/missing image must not kill a long run
                result, error = None, e
            if result is not None:
                return result
            self._record_failure(record, error)
            index = retry_rng.randrange(len(self._dataset))
            seed = None if seed is None else retry_rng.randrange(2**31)

    def _record_failure(self, record: Any, error: Exception | None) -> None:
        self._failures += 1
        name = record.get("file_name", record) if isinstance(record, dict) else record
        reason = f"{type(error).__name__}: {error}" if error else "the mapper returned None"
        logger.warning("Skipping %s (%s); using another image instead.", name, reason)
        if self._failures >= 5 and self._failures > self._max_failure_fraction * self._attempts:
            raise RuntimeError(
                f"MapDataset: {self._failures} of {self._attempts} items failed to map (more than "
                f"max_failure_fraction={self._max_failure_fraction}); last: {name} ({reason}). Check the data set "
                "files, or raise max_failure_fraction."
            ) from error
