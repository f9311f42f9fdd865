"""Loader builders: records -> `DatasetFromList` -> `MapDataset(mapper)` -> sampler -> batches.

The train loader groups images by orientation (w > h or not) in the main process using the records'
sizes, so no image is read to batch it. It is resumable: its `state_dict` describes exactly the batches
handed to the trainer (the sampler position plus the group buffers after that batch), not those that
workers prefetched, and every sample carries a seed derived from (seed, rank, stream position) for its
random augmentations.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lazytrain.data.common import DatasetFromList, MapDataset, seed_sample_rngs
from lazytrain.data.samplers import InferenceSampler, IterationBasedSampler, TrainingSampler
from lazytrain.utils import comm

__all__ = [
    "build_detection_test_loader",
    "build_detection_train_loader",
    "get_detection_dataset_dicts",
    "trivial_batch_collator",
]

logger = logging.getLogger(__name__)


def trivial_batch_collator(batch: list) -> list:
    """Batches are lists of per-image dicts (models handle variable image sizes)."""
    return batch


def get_detection_dataset_dicts(names: str | Sequence[str], filter_empty: bool = True) -> list[dict]:
    """Records of one or several registered data sets, concatenated; images without annotations dropped
    when `filter_empty`."""
    from lazytrain.data.catalog import DatasetCatalog

    names = [names] if isinstance(names, str) else list(names)
    records = list(itertools.chain.from_iterable(DatasetCatalog.get(name) for name in names))
    if filter_empty:
        before = len(records)
        records = [r for r in records if r.get("annotations")]
        if before != len(records):
            logger.info(
                "Removed %d images without annotations; %d left.", before - len(records), len(records)
            )
    if not records:
        raise ValueError(f"get_detection_dataset_dicts: no images in {names}")
    return records


def _aspect_groups(dataset: Any) -> np.ndarray | None:
    if (
        isinstance(dataset, (list, tuple))
        and dataset
        and all("width" in r and "height" in r for r in dataset)
    ):
        return np.array([1 if r["width"] > r["height"] else 0 for r in dataset], dtype=np.int8)
    return None


class GroupedBatchSampler(Sampler):
    """Batches of `batch_size` (index, sample_seed) pairs from an infinite sampler, one orientation per batch.

    Keeps a snapshot (sampler position + group buffers) for each recently emitted batch so the loader can
    report the state after the batches actually consumed.
    """

    def __init__(
        self,
        sampler: Sampler,
        batch_size: int,
        groups: np.ndarray | None,
        seed: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.sampler, self.batch_size, self.groups = sampler, batch_size, groups
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self._state = {"batches": 0, "position": 0, "buffers": [[], []]}
        self.snapshots: collections.OrderedDict[int, dict] = collections.OrderedDict()

    def _sample_seed(self, position: int) -> int:
        global_position = position * self.world_size + self.rank
        return (self.seed * 1000003 + global_position * 7919 + 17) % (2**31)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        state = self._state
        self.sampler.load_state_dict({"position": state["position"]})
        buffers = [list(map(tuple, b)) for b in state["buffers"]]
        batches, position = state["batches"], state["position"]
        for index in self.sampler:
            group = int(self.groups[index]) if self.groups is not None else 0
            buffers[group].append((index, self._sample_seed(position)))
            position += 1
            if len(buffers[group]) == self.batch_size:
                batch, buffers[group] = buffers[group], []
                batches += 1
                self.snapshots[batches] = {
                    "batches": batches,
                    "position": position,
                    "buffers": [[list(p) for p in b] for b in buffers],
                }
                while len(self.snapshots) > 256:
                    self.snapshots.popitem(last=False)
                yield batch

    def load_state_dict(self, state: dict) -> None:
        self._state = {
            "batches": int(state["batches"]),
            "position": int(state["position"]),
            "buffers": state["buffers"],
        }
        self.snapshots.clear()


class _WorkerSeeder:
    """Picklable worker_init_fn seeding worker RNGs from (seed, rank, worker id)."""

    def __init__(self, seed: int, rank: int) -> None:
        self.seed, self.rank = seed, rank

    def __call__(self, worker_id: int) -> None:
        seed_sample_rngs(self.seed + 1000 * self.rank + worker_id)


class TrainLoader:
    """An infinite iterable of batches with the resumable-data protocol (`state_dict`/`load_state_dict`)."""

    def __init__(
        self, dataset: Dataset, batch_sampler: GroupedBatchSampler, num_workers: int, collate_fn: Callable
    ) -> None:
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self._consumed = 0

    def __iter__(self) -> Iterator[list]:
        # (Re)start from the state after the batches consumed so far.
        self.batch_sampler.load_state_dict(self.state_dict())
        self._consumed = 0
        loader = DataLoader(
            self.dataset,
            batch_sampler=self.batch_sampler,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            worker_init_fn=_WorkerSeeder(self.batch_sampler.seed, self.batch_sampler.rank),
            persistent_workers=False,
        )
        for batch in loader:
            self._consumed += 1
            yield batch

    def state_dict(self) -> dict:
        """Sampler position and group buffers after the last batch this loader yielded."""
        start = self.batch_sampler._state
        if self._consumed == 0:
            return {"batches": start["batches"], "position": start["position"], "buffers": start["buffers"]}
        return dict(self.batch_sampler.snapshots[start["batches"] + self._consumed])

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)
        self._consumed = 0


def build_detection_train_loader(
    dataset: Sequence[dict] | Dataset,
    *,
    mapper: Callable | None,
    total_batch_size: int,
    sampler: Sampler | None = None,
    aspect_ratio_grouping: bool = True,
    num_workers: int = 0,
    seed: int = 0,
    collate_fn: Callable | None = None,
) -> TrainLoader:
    """An infinite, resumable train loader yielding lists of mapped records.

    Args:
        dataset: records (list of dicts) or a torch Dataset.
        mapper: record -> model input (None: records as they are).
        total_batch_size: images per step over all processes; each process takes total // world size.
        sampler: a lazytrain training sampler, any finite torch Sampler (made infinite), or None for a
            shuffled `TrainingSampler`.
        aspect_ratio_grouping: batch landscape and portrait images separately.
        num_workers: data-loader worker processes.
        seed: base seed of per-sample augmentation and worker RNGs.
        collate_fn: default keeps batches as lists.
    """
    world_size, rank = comm.get_world_size(), comm.get_rank()
    if total_batch_size <= 0 or total_batch_size % world_size != 0:
        raise ValueError(
            f"build_detection_train_loader(total_batch_size={total_batch_size}) must be a positive multiple of the "
            f"world size {world_size}; set dataloader.train.total_batch_size to a multiple of {world_size}."
        )
    groups = _aspect_groups(dataset) if aspect_ratio_grouping else None
    if isinstance(dataset, (list, tuple)):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is not None:
        dataset = MapDataset(dataset, mapper)
    if sampler is None:
        sampler = TrainingSampler(len(dataset), seed=seed)
    elif not hasattr(sampler, "load_state_dict"):
        sampler = IterationBasedSampler(sampler)
    batch_sampler = GroupedBatchSampler(
        sampler, total_batch_size // world_size, groups, seed, rank, world_size
    )
    return TrainLoader(dataset, batch_sampler, num_workers, collate_fn or trivial_batch_collator)


def build_detection_test_loader(
    dataset: Sequence[dict] | Dataset,
    *,
    mapper: Callable | None,
    sampler: Sampler | None = None,
    batch_size: int = 1,
    num_workers: int = 0,
) -> DataLoader:
    """A finite loader over every image exactly once across ranks (`InferenceSampler` shards)."""
    if isinstance(dataset, (list, tuple)):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is not None:
        dataset = MapDataset(dataset, mapper)
    sampler = sampler or InferenceSampler(len(dataset))
    batch_sampler = torch.utils.data.BatchSampler(sampler, batch_size, drop_last=False)
    return DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=trivial_batch_collator
    )
