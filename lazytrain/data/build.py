"""Loader builders: records -> `DatasetFromList` -> `MapDataset(mapper)` -> sampler -> batches.

The train loader is infinite and resumable (docs/architecture.md, "Resumable data protocol"):

- Batching happens on indices in the main process: `GroupedBatchSampler` puts each index into the buffer of
  its image's orientation (w > h or not, read from the record's ``width``/``height``, no image is opened) and
  emits a buffer when it holds a batch. Workers only map the indices they are given.
- After each emitted batch the batch sampler snapshots its state (sampler state + group buffers). When the
  loader hands batch n to the consumer, snapshot n becomes the loader's `state_dict`, so the state describes
  exactly the batches consumed, never those the workers prefetched.
- Every sample carries a seed derived from (seed, global stream position); `MapDataset` seeds the global
  RNGs with it before mapping, so a resumed run sees the same augmented images, whatever the worker count.
"""

from __future__ import annotations

import collections
import gc
import itertools
import logging
import math
import multiprocessing
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lazytrain.data.common import DatasetFromList, MapDataset, seed_sample_rngs
from lazytrain.data.samplers import InferenceSampler, IterationBasedSampler, TrainingSampler, _resolve_seed
from lazytrain.errors import LazytrainError

__all__ = [
    "GroupedBatchSampler",
    "TrainLoader",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "get_detection_dataset_dicts",
    "sample_seed",
    "trivial_batch_collator",
]

logger = logging.getLogger(__name__)

_MASK64 = 2**64 - 1
# Batches each worker works ahead: torch's default, set explicitly because the ring size depends on it.
_PREFETCH_FACTOR = 2
_RING_BYTES = 32 * 2**20  # shared memory that all of a train loader's ring slots may take together


def trivial_batch_collator(batch: list) -> list:
    """Keep a batch as the list of per-image dicts (detection models take images of different sizes)."""
    return batch


def get_detection_dataset_dicts(names: str | Sequence[str], filter_empty: bool = True) -> list[dict]:
    """Records of one or several registered data sets, concatenated in order.

    Args:
        names: a registered name or a list of them (see `DatasetCatalog`; an unknown name is an error that
            lists the registered ones).
        filter_empty: drop images without annotations (training); keep them for evaluation.
    """
    from lazytrain.data.catalog import DatasetCatalog

    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError("get_detection_dataset_dicts(names=) needs at least one data set name; got []")
    records = list(itertools.chain.from_iterable(DatasetCatalog.get(name) for name in names))
    if filter_empty:
        before = len(records)
        records = [record for record in records if record.get("annotations")]
        if before != len(records):
            logger.info(
                "Removed %d images without annotations; %d left.", before - len(records), len(records)
            )
    if not records:
        raise ValueError(
            f"get_detection_dataset_dicts: no images in {names}"
            + (" with annotations (filter_empty=True)" if filter_empty else "")
        )
    return records


def _mix64(value: int) -> int:
    """splitmix64 finalizer: nearby inputs give unrelated outputs."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def sample_seed(seed: int, global_position: int) -> int:
    """The augmentation seed (in [0, 2**63)) of the sample at `global_position` of a run seeded with `seed`.

    It depends on the global stream position only, so it does not change with the world size or the number of
    workers.
    """
    return _mix64((_mix64(seed & _MASK64) + global_position) & _MASK64) >> 1


def _aspect_groups(dataset: Sequence[Any] | Dataset) -> np.ndarray | None:
    """int8 [N]: 1 for landscape (w > h) records, 0 otherwise; None when records lack the sizes."""
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


class _WorkerSeeder:
    """Picklable ``worker_init_fn``: seed a worker's RNGs from (seed, rank, worker id)."""

    def __init__(self, seed: int, rank: int) -> None:
        self.seed, self.rank = seed, rank

    def __call__(self, worker_id: int) -> None:
        seed_sample_rngs(sample_seed(self.seed ^ 0x5EED, self.rank * 4096 + worker_id))


def _identity(record: Any) -> Any:
    return record


class _TensorSlot:
    """Where a tensor was in a packed batch: its index in the metadata list."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _map_structure(obj: Any, leaf: Callable[[Any], Any], kind: type) -> Any:
    if isinstance(obj, kind):
        return leaf(obj)
    if isinstance(obj, dict):
        return {key: _map_structure(value, leaf, kind) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_structure(value, leaf, kind) for value in obj)
    return obj


class _PackedBatch(NamedTuple):
    """One batch as a worker sends it: the tensors' bytes in `storage` (or in ring slot `slot` of worker
    `worker`, sent once), where each tensor is (`layout`), and the batch with `_TensorSlot` placeholders."""

    worker: int
    slot: int | None
    storage: torch.Tensor | None
    nbytes: int
    layout: list[tuple[int, torch.dtype, tuple]]
    skeleton: Any


class _PackingCollate:
    """Worker side of the train loader: collate, then copy every tensor of the batch into one shared buffer.

    Torch sends each tensor from a worker through its own shared-memory segment, and the main process fetches
    each segment's file descriptor over a socket with an authentication handshake. For a batch of small images
    with boxes, classes and masks that fixed cost exceeds the mapping itself. Packing the batch into one buffer
    pays it once per batch (synthetic_lt: 1.7x more images/s); reusing a ring of `ring_slots` buffers per worker,
    each sent to the main process once, stops paying it at all (docs/benchmarks.md). The main process copies
    each batch out of its slot (`_BatchReceiver`), so a slot can be refilled once the batches sent after it fill
    the loader's prefetch window. Batches over `slot_bytes` travel in a fresh segment, as before.
    """

    def __init__(self, collate_fn: Callable, ring_slots: int, slot_bytes: int) -> None:
        self.collate_fn, self.ring_slots, self.slot_bytes = collate_fn, ring_slots, slot_bytes
        self.ring: list[torch.Tensor | None] = [None] * ring_slots  # this worker's (each worker has a copy)
        self.next_slot = 0

    def __call__(self, batch: list) -> _PackedBatch:
        tensors: list[torch.Tensor] = []

        def take(tensor: torch.Tensor) -> _TensorSlot:
            tensors.append(tensor.detach().contiguous())
            return _TensorSlot(len(tensors) - 1)

        skeleton = _map_structure(self.collate_fn(batch), take, torch.Tensor)
        offsets, total = [], 0
        for tensor in tensors:
            offsets.append(total)
            total += -(-tensor.nbytes // 16) * 16  # aligned for any dtype view
        slot, storage, buffer = self._buffer(total)
        for tensor, offset in zip(tensors, offsets):
            buffer[offset : offset + tensor.nbytes] = tensor.view(-1).view(torch.uint8)
        layout = [(o, t.dtype, tuple(t.shape)) for o, t in zip(offsets, tensors)]
        worker = torch.utils.data.get_worker_info()
        return _PackedBatch(worker.id if worker else 0, slot, storage, total, layout, skeleton)

    def _buffer(self, nbytes: int) -> tuple[int | None, torch.Tensor | None, torch.Tensor]:
        """(slot, storage to send or None when the main process has it already, buffer to fill)."""
        if nbytes > self.slot_bytes:
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            return None, buffer, buffer
        slot = self.next_slot
        self.next_slot = (slot + 1) % self.ring_slots
        if self.ring[slot] is None:
            self.ring[slot] = torch.empty(self.slot_bytes, dtype=torch.uint8).share_memory_()
            return slot, self.ring[slot], self.ring[slot]
        return slot, None, self.ring[slot]


class _BatchReceiver:
    """Main-process side of `_PackingCollate` for one ``iter()``: keeps the workers' ring slots and copies each
    batch out of its slot (into pinned memory when `pin_memory`), then rebuilds the batch as views of that copy.
    """

    def __init__(self, pin_memory: bool = False) -> None:
        self.slots: dict[tuple[int, int], torch.Tensor] = {}
        self.pin_memory = pin_memory

    def __call__(self, packed: _PackedBatch) -> Any:
        if packed.slot is None:
            source = packed.storage
        else:
            key = (packed.worker, packed.slot)
            if packed.storage is not None:
                self.slots[key] = packed.storage
            source = self.slots[key]
        if packed.slot is None and not self.pin_memory:
            buffer = source  # a segment of its own, not reused by the worker: no copy needed
        else:
            # The one copy out of the worker's memory goes straight into pinned memory when asked (torch's own
            # pin_memory would copy the shared segments a second time). numpy copies in this thread; a torch
            # copy this size would wake OpenMP threads, which spin on the cores the workers need.
            buffer = (
                _pinned_empty(packed.nbytes)
                if self.pin_memory
                else torch.empty(packed.nbytes, dtype=torch.uint8)
            )
            buffer.numpy()[:] = source[: packed.nbytes].numpy()

        def restore(slot: _TensorSlot) -> torch.Tensor:
            offset, dtype, shape = packed.layout[slot.index]
            size = math.prod(shape) * dtype.itemsize
            return buffer[offset : offset + size].view(dtype).view(shape)

        return _map_structure(packed.skeleton, restore, _TensorSlot)


def _pinned_empty(nbytes: int) -> torch.Tensor:
    """Uninitialised page-locked bytes (from torch's caching host allocator, which reuses freed blocks)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory()


def _resolve_pin_memory(pin_memory: bool | str | torch.device, component: str) -> bool:
    """Whether a loader pins its batches: `pin_memory` is a bool or the device the batches are for (the recipes
    pass ``${train.device}``: pin for ``cuda``). Never without CUDA, where pinning is impossible (torch's
    DataLoader would only warn).

    Args:
        pin_memory: True, False, or a device such as ``"cuda"``, ``"cuda:1"``, ``"cpu"``.
        component: the builder's name, for errors.
    """
    if isinstance(pin_memory, bool):
        wanted = pin_memory
    elif isinstance(pin_memory, (str, torch.device)):
        try:
            wanted = torch.device(pin_memory).type == "cuda"
        except RuntimeError as e:
            raise ValueError(
                f"{component}(pin_memory=) must be a bool or a device such as 'cuda' or 'cpu'; got {pin_memory!r}"
            ) from e
    else:
        raise TypeError(
            f"{component}(pin_memory=) must be a bool or a device such as 'cuda' or 'cpu'; got "
            f"{type(pin_memory).__name__} {pin_memory!r}"
        )
    return wanted and torch.cuda.is_available()


def worker_context() -> multiprocessing.context.BaseContext | None:
    """The start method of data-loader workers: fork on Linux, the platform default elsewhere.

    `lazytrain.launch.launch` makes "spawn" the global start method (per-rank processes must not inherit CUDA
    or gloo state), and torch's DataLoader follows the global method. Spawned workers re-import torch and unpickle the
    dataset: ~5 s before the first batch of every loader (each evaluation included), and no copy-on-write
    sharing of the serialized records. Workers never touch CUDA, so forking them is safe.
    """
    return _FlushingForkContext() if sys.platform.startswith("linux") else None


class _FlushingForkContext(multiprocessing.context.ForkContext):
    """Fork, after flushing the parent's stdout/stderr: a forked worker inherits their buffers and flushes them
    when it exits, which repeats earlier output in a log redirected to a file (as under SLURM)."""

    def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.context.ForkProcess:  # noqa: N802 (torch's name)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        return multiprocessing.context.ForkProcess(*args, **kwargs)


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
        # Without a generator of its own, torch's DataLoader draws its workers' base seed from the global torch
        # RNG when iterating starts (the first next() of our generator): at iteration 0 in a fresh run but right
        # after the restored RNG state in a resumed one, which then draws other proposals (issue 17). Workers
        # reseed per sample anyway (`_WorkerSeeder`, `MapDataset`), so the base seed only has to be fixed.
        return DataLoader(
            self.dataset,
            batch_sampler=self.batch_sampler,
            num_workers=self.num_workers,
            collate_fn=self._packing_collate() if self.num_workers > 0 else self.collate_fn,
            worker_init_fn=_WorkerSeeder(self.batch_sampler.seed, self.batch_sampler.rank),
            multiprocessing_context=worker_context() if self.num_workers > 0 else None,
            prefetch_factor=_PREFETCH_FACTOR if self.num_workers > 0 else None,
            generator=torch.Generator().manual_seed(self.batch_sampler.seed & _MASK64),
        )

    def _packing_collate(self) -> _PackingCollate:
        # A worker refills a slot only after `ring_slots` more batches: the DataLoader requests a batch only when
        # fewer than prefetch x workers are waiting, so by then the main process has copied the slot's batch.
        ring_slots = _PREFETCH_FACTOR * self.num_workers + 1
        return _PackingCollate(self.collate_fn, ring_slots, _RING_BYTES // (ring_slots * self.num_workers))

    def __iter__(self) -> Iterator[Any]:
        self.batch_sampler.start_state = self._state
        snapshots = self.batch_sampler.snapshots
        if self.num_workers > 0:
            # Forked workers inherit the parent's objects; a garbage collection in a worker would write to
            # every tracked object (the records list of the config, say) and copy its pages. Frozen objects
            # are skipped by the workers' collector; the parent unfreezes right after the fork.
            gc.freeze()
            try:
                batches = iter(self._data_loader())
            finally:
                gc.unfreeze()
        else:
            batches = iter(self._data_loader())
        receive = _BatchReceiver(self.pin_memory)
        try:
            for batch in batches:
                state = snapshots.popleft()  # in-order loading: the snapshot taken when this batch was formed
                self._state = state
                if self.num_workers > 0:
                    yield receive(batch)
                else:
                    yield _map_structure(batch, _pin, torch.Tensor) if self.pin_memory else batch
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
) -> TrainLoader:
    """An infinite, resumable train loader yielding lists of mapped records.

    Args:
        dataset: records (list of dicts) or a torch Dataset of records.
        mapper: record -> model input (e.g. `DatasetMapper`); None yields the records.
        sampler: a lazytrain training sampler; any finite torch Sampler (Random, WeightedRandom, SubsetRandom,
            Distributed), which is iterated again and again; or None for a shuffled `TrainingSampler`.
        total_batch_size: images per step over all processes; each takes total_batch_size // world size.
        aspect_ratio_grouping: form each batch from landscape or from portrait images only (needs ``width``
            and ``height`` in the records).
        num_workers: data-loader worker processes.
        seed: base of the per-sample augmentation seeds (and of the default sampler); None draws a random seed
            shared by all ranks (the resumed state carries it).
        collate_fn: batch list -> model input; default keeps the list.
        pin_memory: put each batch's tensors in page-locked host memory, from which the model's non-blocking
            copies to the GPU overlap with its work: True, False, or the device the batches are for (the
            recipes pass ``${train.device}``, so ``cuda`` pins and ``cpu`` does not). Ignored without CUDA.
    """
    from lazytrain.utils import comm

    pin = _resolve_pin_memory(pin_memory, "build_detection_train_loader")
    world_size, rank = comm.get_world_size(), comm.get_rank()
    if total_batch_size <= 0 or total_batch_size % world_size != 0:
        raise ValueError(
            f"build_detection_train_loader(total_batch_size={total_batch_size}) must be a positive multiple of the "
            f"world size {world_size}; set dataloader.train.total_batch_size to a multiple of {world_size} "
            f"(e.g. {max(1, total_batch_size // world_size) * world_size})."
        )
    seed = _resolve_seed(seed)
    groups = _aspect_groups(dataset) if aspect_ratio_grouping else None
    if aspect_ratio_grouping and groups is None:
        logger.warning(
            "build_detection_train_loader: aspect_ratio_grouping needs records with 'width' and 'height' (a list "
            "of dicts or a DatasetFromList); batches are not grouped."
        )
    if isinstance(dataset, (list, tuple)):
        dataset = DatasetFromList(dataset, copy=False)
    dataset = MapDataset(dataset, mapper if mapper is not None else _identity)
    sampler = _infinite_sampler(sampler, len(dataset), seed)
    batch_sampler = GroupedBatchSampler(
        sampler, total_batch_size // world_size, groups, seed=seed, rank=rank, world_size=world_size
    )
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
        num_workers: data-loader worker processes.
        pin_memory: as in `build_detection_train_loader` (torch's DataLoader pins the batches).
    """
    pin = _resolve_pin_memory(pin_memory, "build_detection_test_loader")
    if isinstance(dataset, (list, tuple)):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is not None:
        dataset = MapDataset(dataset, mapper, max_failure_fraction=0.0)
    if sampler is None:
        sampler = InferenceSampler(len(dataset))
    return DataLoader(
        dataset,
        batch_sampler=torch.utils.data.BatchSampler(sampler, batch_size, drop_last=False),
        num_workers=num_workers,
        collate_fn=trivial_batch_collator,
        multiprocessing_context=worker_context() if num_workers > 0 else None,
        pin_memory=pin,
    )
