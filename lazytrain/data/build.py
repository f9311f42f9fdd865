"""Loader builders: records -> `DatasetFromList` -> `MapDataset(mapper)` -> sampler -> batches.

The train loader is infinite and resumable (docs/architecture.md, "Resumable data protocol"): its batch sampler
(`lazytrain.data.aspect_grouping.GroupedBatchSampler`) forms batches of indices in the main process and
snapshots its state after each; when the loader hands batch n to the consumer, snapshot n becomes the loader's
`state_dict`, so the state describes exactly the batches consumed, never those the workers prefetched. Every
sample carries a seed derived from (seed, global stream position) (`lazytrain.data.workers`), so a resumed run
sees the same augmented images, whatever the worker count. Workers send each batch packed in one shared
buffer (`lazytrain.data.batch_transport`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lazytrain.data.aspect_grouping import GroupedBatchSampler, get_aspect_groups
from lazytrain.data.batch_transport import BatchReceiver, PackingCollate, pin_batch, resolve_pin_memory
from lazytrain.data.common import DatasetFromList, MapDataset
from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.data.samplers import InferenceSampler, IterationBasedSampler, TrainingSampler, resolve_seed
from lazytrain.data.workers import (
    WorkerSeeder,
    cap_num_workers,
    make_base_seed_generator,
    start_workers,
    worker_context,
)
from lazytrain.errors import LazytrainError
from lazytrain.utils.preemption import outlive_job_sigterm

__all__ = [
    "TrainLoader",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "get_detection_dataset_dicts",
    "trivial_batch_collator",
]

logger = logging.getLogger(__name__)

# The key of `build_detection_train_loader`'s max_failure_fraction in the recipes, named by MapDataset's error.
_TRAIN_FRACTION_KEY = "dataloader.train.max_failure_fraction"
# Batches each worker works ahead: torch's default, set explicitly because the ring size depends on it.
_PREFETCH_FACTOR = 2


def trivial_batch_collator(batch: list) -> list:
    """Keep a batch as the list of per-image dicts (detection models take images of different sizes)."""
    return batch


def _identity(record: Any) -> Any:
    return record


def get_detection_dataset_dicts(
    names: str | Sequence[str], filter_empty: bool = True
) -> list[dict] | CachedRecords:
    """Records of one or several registered data sets, concatenated in order.

    When every data set comes from a COCO/LVIS json (`CachedRecords`, the built-in and `register_json_dataset`
    ones), the result is `CachedRecords` over their cache files: the records stay in the files every process
    maps; otherwise a list of the records.

    Args:
        names: a registered name or a list of them (see `DatasetCatalog`; an unknown name is an error that
            lists the registered ones).
        filter_empty: drop images without annotations (training); keep them for evaluation.
    """
    from lazytrain.data.catalog import DatasetCatalog

    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError("get_detection_dataset_dicts(names=) needs at least one data set name; got []")
    parts = [DatasetCatalog.get(name) for name in names]
    before = sum(len(part) for part in parts)
    if all(isinstance(part, CachedRecords) for part in parts):
        records: list[dict] | CachedRecords = CachedRecords.concatenate(parts, filter_empty)
    else:
        records = list(itertools.chain.from_iterable(parts))
        if filter_empty:
            records = [record for record in records if record.get("annotations")]
    if before != len(records):
        logger.info("Removed %d images without annotations; %d left.", before - len(records), len(records))
    if not len(records):
        raise ValueError(
            f"get_detection_dataset_dicts: no images in {names}"
            + (" with annotations (filter_empty=True)" if filter_empty else "")
        )
    return records


class TrainLoader:
    """Infinite iterable of batches (lists of mapped records) with ``state_dict``/``load_state_dict``.

    Each ``iter()`` starts worker processes and continues from the state after the batches consumed so far;
    iterating never draws from the global RNGs, so the trainer's random stream is the same whether the loader
    started at iteration 0 or in a resumed run.
    Workers run the mapper and `collate_fn`, and send each batch's tensors packed in one shared buffer (a
    reused ring slot); the batch the consumer gets holds views of the main process's own copy of it, so it
    stays valid however long the consumer keeps it. With `pin_memory` that copy is page-locked (without
    workers, each tensor of the batch is copied into pinned memory), so the model's non-blocking copies to
    the GPU overlap with its work.
    To change how batches are formed, wrap this loader or pass another ``sampler``/``collate_fn`` to
    `build_detection_train_loader`.

    Args:
        dataset: the mapped dataset; items are requested as ``(index, sample_seed)``.
        batch_sampler: the grouped batch sampler.
        num_workers: worker processes (0: map in the main process).
        collate_fn: batch list -> what the model takes.
        pin_memory: put the tensors of each batch in page-locked memory (needs CUDA).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_sampler: GroupedBatchSampler,
        num_workers: int,
        collate_fn: Callable,
        *,
        pin_memory: bool = False,
    ) -> None:
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.pin_memory = pin_memory
        self._state = batch_sampler.start_state

    def _data_loader(self) -> DataLoader:
        workers = self.num_workers > 0
        seed, rank = self.batch_sampler.seed, self.batch_sampler.rank
        return DataLoader(
            self.dataset,
            batch_sampler=self.batch_sampler,
            num_workers=self.num_workers,
            collate_fn=(
                PackingCollate.for_loader(self.collate_fn, self.num_workers, _PREFETCH_FACTOR)
                if workers
                else self.collate_fn
            ),
            worker_init_fn=WorkerSeeder(seed, rank),
            multiprocessing_context=worker_context() if workers else None,
            prefetch_factor=_PREFETCH_FACTOR if workers else None,
            generator=make_base_seed_generator(seed),
        )

    def __iter__(self) -> Iterator[Any]:
        self.batch_sampler.start_state = self._state
        snapshots = self.batch_sampler.snapshots
        batches = start_workers(self._data_loader())
        receive = BatchReceiver(self.pin_memory)
        try:
            for batch in batches:
                state = snapshots.popleft()  # in-order loading: the snapshot taken when this batch was formed
                self._state = state
                if self.num_workers > 0:
                    yield receive(batch)
                else:
                    yield pin_batch(batch) if self.pin_memory else batch
        except LazytrainError as e:
            # From a worker it comes wrapped with the worker's traceback as its text: keep the message only.
            raise LazytrainError(str(e).rsplit("LazytrainError: ", 1)[-1]) from None

    def state_dict(self) -> dict[str, Any]:
        """Batches consumed, sampler state and group buffers after the last batch yielded to the consumer."""
        return dict(
            self._state, world_size=self.batch_sampler.world_size, batch_size=self.batch_sampler.batch_size
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches `state` describes at the next ``iter()``."""
        expected = (self.batch_sampler.world_size, self.batch_sampler.batch_size)
        if (state.get("world_size"), state.get("batch_size")) != expected:
            logger.warning(
                "Resuming a train loader saved with world size %s, batch size %s in a run with world size %d, "
                "batch size %d: the data order continues from the same sampler position but not exactly.",
                state.get("world_size"),
                state.get("batch_size"),
                *expected,
            )
        self._state = {key: state[key] for key in ("batches", "sampler", "buffers")}

    def reshard_state_dict(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """`state`, saved by rank 0 of a run with another number of processes, as this rank's state at the same
        point of the global stream, or None when that point cannot be continued exactly.

        A resharded state keeps the global position (a rank's sampler position times the world size, the items
        all ranks have taken), so the run goes on with the uninterrupted run's images and augmentation seeds.
        It needs every rank of the saved run to have stood where rank 0 did: batches of consecutive items (no
        aspect-ratio grouping, which leaves each rank's sampler elsewhere) and a sampler whose own
        ``reshard_state_dict`` continues its stream at this world size (`TrainingSampler`,
        `RepeatFactorTrainingSampler`, `MixtureTrainingSampler`).
        """
        saved_world_size = state.get("world_size")
        reshard = getattr(self.batch_sampler.sampler, "reshard_state_dict", None)
        grouped = self.batch_sampler.groups is not None or any(state["buffers"])
        if saved_world_size is None or reshard is None or grouped:
            return None
        sampler_state = reshard(state["sampler"], int(saved_world_size))
        world_size = self.batch_sampler.world_size
        global_position = int(state["sampler"]["position"]) * int(saved_world_size)
        if sampler_state is None or int(sampler_state["position"]) * world_size != global_position:
            return None
        return {
            "batches": state["batches"],
            "sampler": sampler_state,
            "buffers": [[], []],
            "world_size": world_size,
            "batch_size": self.batch_sampler.batch_size,
        }


def _infinite_sampler(sampler: Sampler | None, size: int, seed: int) -> Sampler:
    if sampler is None:
        return TrainingSampler(size, seed=seed)
    sampler_size = getattr(sampler, "size", size)
    if sampler_size != size:
        raise ValueError(
            f"build_detection_train_loader(sampler=): {type(sampler).__name__} samples {sampler_size} images but "
            f'the dataset has {size}; build the sampler from the loader\'s dataset (dataset_dicts="${{..dataset}}").'
        )
    if hasattr(sampler, "__len__"):  # a finite torch sampler
        return IterationBasedSampler(sampler, seed=seed)
    if hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict"):
        return sampler
    raise TypeError(
        f"build_detection_train_loader(sampler=) must be a lazytrain training sampler, a finite torch Sampler "
        f"(with __len__) or an infinite sampler with state_dict/load_state_dict; got {type(sampler).__name__}"
    )


def _check_total_batch_size(total_batch_size: int, world_size: int) -> None:
    if total_batch_size <= 0 or total_batch_size % world_size != 0:
        raise ValueError(
            f"build_detection_train_loader(total_batch_size={total_batch_size}) must be a positive multiple of the "
            f"world size {world_size}; set dataloader.train.total_batch_size to a multiple of {world_size} "
            f"(e.g. {max(1, total_batch_size // world_size) * world_size})."
        )


def build_detection_train_loader(
    dataset: Sequence[dict] | Dataset,
    *,
    mapper: Callable | None,
    sampler: Sampler | None = None,
    total_batch_size: int,
    aspect_ratio_grouping: bool = True,
    num_workers: int = 0,
    seed: int | None = None,
    collate_fn: Callable | None = None,
    pin_memory: bool | str | torch.device = False,
    max_failure_fraction: float = 0.01,
) -> TrainLoader:
    """An infinite, resumable train loader yielding lists of mapped records.

    Args:
        dataset: records (list of dicts) or a torch Dataset of records.
        mapper: record -> model input (e.g. `DatasetMapper`); None yields the records. A mapper with an
            ``attach_dataset`` method is first given the dataset of records (`DatasetMapper` with copy-paste
            draws its source images from it).
        sampler: a lazytrain training sampler; any finite torch Sampler (Random, WeightedRandom, SubsetRandom,
            Distributed), which is iterated again and again; or None for a shuffled `TrainingSampler`.
        total_batch_size: images per step over all processes; each takes total_batch_size // world size.
        aspect_ratio_grouping: form each batch from landscape or from portrait images only (needs ``width``
            and ``height`` in the records). A sampler with ``check_batching`` (`MixtureTrainingSampler`, whose
            batches hold fixed shares) is asked first and refuses it.
        num_workers: data-loader worker processes, at most the CPUs this process may use (more are lowered to
            that, with a log line: `lazytrain.data.workers.cap_num_workers`).
        seed: base of the per-sample augmentation seeds (and of the default sampler); None draws a random seed
            shared by all ranks (the resumed state carries it).
        collate_fn: batch list -> model input; default keeps the list.
        pin_memory: put each batch's tensors in page-locked host memory, from which the model's non-blocking
            copies to the GPU overlap with its work: True, False, or the device the batches are for (the
            recipes pass ``${train.device}``, so ``cuda`` pins and ``cpu`` does not). Ignored without CUDA.
        max_failure_fraction: largest fraction of the images the mapper may fail to read (each is replaced by
            another image, with a warning); more stops the run (`MapDataset`). The recipes' key is
            ``dataloader.train.max_failure_fraction``.
    """
    from lazytrain.utils import comm

    pin = resolve_pin_memory(pin_memory, "build_detection_train_loader")
    world_size, rank = comm.get_world_size(), comm.get_rank()
    _check_total_batch_size(total_batch_size, world_size)
    if hasattr(sampler, "check_batching"):  # it fills whole batches (MixtureTrainingSampler's shares)
        sampler.check_batching(total_batch_size, aspect_ratio_grouping, world_size=world_size)
    seed = resolve_seed(seed)
    groups = get_aspect_groups(dataset) if aspect_ratio_grouping else None
    if aspect_ratio_grouping and groups is None:
        logger.warning(
            "build_detection_train_loader: aspect_ratio_grouping needs records with 'width' and 'height' (a list "
            "of dicts or a DatasetFromList); batches are not grouped."
        )
    if isinstance(dataset, (list, tuple)):
        dataset = DatasetFromList(dataset, copy=False)
    if hasattr(mapper, "attach_dataset"):  # copy-paste reads its source images from the loader's own records
        mapper.attach_dataset(dataset)
    dataset = MapDataset(
        dataset,
        mapper if mapper is not None else _identity,
        max_failure_fraction,
        fraction_setting=_TRAIN_FRACTION_KEY,
    )
    sampler = _infinite_sampler(sampler, len(dataset), seed)
    batch_sampler = GroupedBatchSampler(
        sampler, total_batch_size // world_size, groups, seed=seed, rank=rank, world_size=world_size
    )
    num_workers = cap_num_workers(num_workers, "dataloader.train")
    return TrainLoader(
        dataset, batch_sampler, num_workers, collate_fn or trivial_batch_collator, pin_memory=pin
    )


def build_detection_test_loader(
    dataset: Sequence[dict] | Dataset,
    *,
    mapper: Callable | None,
    sampler: Sampler | None = None,
    batch_size: int = 1,
    num_workers: int = 0,
    pin_memory: bool | str | torch.device = False,
) -> DataLoader:
    """A finite loader over every image exactly once across ranks (contiguous `InferenceSampler` shards).

    An image the mapper cannot read is an error here (an evaluation must see every image).

    Args:
        dataset: records (list of dicts) or a torch Dataset of records.
        mapper: record -> model input; None yields the records.
        sampler: defaults to `InferenceSampler(len(dataset))`.
        batch_size: images per batch (per process).
        num_workers: data-loader worker processes, at most the CPUs this process may use.
        pin_memory: as in `build_detection_train_loader` (torch's DataLoader pins the batches).
    """
    pin = resolve_pin_memory(pin_memory, "build_detection_test_loader")
    if isinstance(dataset, (list, tuple)):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is not None:
        dataset = MapDataset(dataset, mapper, max_failure_fraction=0.0, fraction_setting=None)
    if sampler is None:
        sampler = InferenceSampler(len(dataset))
    num_workers = cap_num_workers(num_workers, "dataloader.test")
    return DataLoader(
        dataset,
        batch_sampler=torch.utils.data.BatchSampler(sampler, batch_size, drop_last=False),
        num_workers=num_workers,
        collate_fn=trivial_batch_collator,
        worker_init_fn=outlive_job_sigterm,
        multiprocessing_context=worker_context() if num_workers > 0 else None,
        pin_memory=pin,
    )
