"""Aspect-ratio grouping: batches formed from landscape or from portrait images only, resumably.

Batching happens on indices in the main process: `GroupedBatchSampler` puts each index into the buffer of its
image's group (`get_aspect_groups`: w > h or not, read from the record's ``width``/``height``, or from the
array a json's `CachedRecords` hold; no image is opened) and emits a buffer when it holds a batch; loader
workers only map the indices they are given. After each emitted batch it snapshots its state (sampler state +
group buffers), from which the train loader takes the state of exactly the batches consumed
(docs/architecture.md, "Resumable data protocol").
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Sampler

from lazytrain.data.common import DatasetFromList
from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.data.workers import sample_seed

__all__ = ["GroupedBatchSampler", "get_aspect_groups"]


def get_aspect_groups(dataset: Sequence[Any] | Dataset) -> np.ndarray | None:
    """int8 [N]: 1 for landscape (w > h) records, 0 otherwise; None when the records lack the sizes.

    Args:
        dataset: a list or tuple of records, a `DatasetFromList` or `CachedRecords` (whose arrays hold the
            groups: no record is read); any other dataset gives None.
    """
    if isinstance(dataset, DatasetFromList) and dataset.cached_records is not None:
        dataset = dataset.cached_records
    if isinstance(dataset, CachedRecords):
        return dataset.aspect_groups
    if isinstance(dataset, DatasetFromList):
        records: Any = (dataset[i] for i in range(len(dataset)))
    elif isinstance(dataset, (list, tuple)):
        records = iter(dataset)
    else:
        return None
    try:
        return np.fromiter((r["width"] > r["height"] for r in records), np.int8, count=len(dataset))
    except (KeyError, TypeError):
        return None


class GroupedBatchSampler(Sampler):
    """Batches of `batch_size` ``(index, sample_seed)`` pairs from an infinite sampler, every batch from one
    aspect group, with a snapshot of the state after each emitted batch.

    Args:
        sampler: an infinite sampler with ``state_dict``/``load_state_dict`` and a per-rank ``position``.
        batch_size: images per batch (this rank's).
        groups: group id (0 or 1) per dataset index, or None for no grouping.
        seed: base of the per-sample seeds.
        rank: this process's rank.
        world_size: number of processes.
    """

    def __init__(
        self,
        sampler: Sampler,
        batch_size: int,
        groups: np.ndarray | None,
        *,
        seed: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.sampler, self.batch_size, self.groups = sampler, batch_size, groups
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.start_state: dict[str, Any] = {
            "batches": 0,
            "sampler": sampler.state_dict(),
            "buffers": [[], []],
        }
        self.snapshots: collections.deque[dict[str, Any]] = collections.deque()

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        start = self.start_state
        self.sampler.load_state_dict(start["sampler"])
        self.snapshots.clear()
        # Buffered items are [index, per-rank position]; the seed is derived when the batch is emitted.
        buffers = [[tuple(item) for item in buffer] for buffer in start["buffers"]]
        batches, position = start["batches"], int(start["sampler"]["position"])
        for index in self.sampler:
            buffer = buffers[int(self.groups[index]) if self.groups is not None else 0]
            buffer.append((index, position))
            position += 1
            if len(buffer) < self.batch_size:
                continue
            batch = [(i, sample_seed(self.seed, p * self.world_size + self.rank)) for i, p in buffer]
            buffer.clear()
            batches += 1
            self.snapshots.append(
                {
                    "batches": batches,
                    "sampler": self.sampler.state_dict(),
                    "buffers": [[list(item) for item in b] for b in buffers],
                }
            )
            yield batch
