"""Batch transport: how a train batch travels from a loader worker to the consumer, and into pinned memory.

Torch sends each tensor from a worker through its own shared-memory segment, and the main process fetches each
segment's file descriptor over a socket with an authentication handshake. For a batch of small images with
boxes, classes and masks that fixed cost exceeds the mapping itself. So a worker packs the batch's tensors into
one buffer (`PackingCollate`), taken from a ring of buffers that each go to the main process once; the main
process copies the batch out of its slot and rebuilds it as views of that copy (`BatchReceiver`), so a slot
can be refilled once the batches sent after it fill the loader's prefetch window. Batches larger than a slot
travel in a fresh segment. docs/benchmarks.md ("Train-loader throughput") has the measurements.

With pinning the one copy out of the worker's memory goes straight into page-locked memory, from which the
model's non-blocking copies to the GPU overlap with its work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = [
    "BatchReceiver",
    "PackedBatch",
    "PackingCollate",
    "map_structure",
    "pin_batch",
    "resolve_pin_memory",
]

_RING_BYTES = 32 * 2**20  # shared memory that all of a train loader's ring slots may take together


def map_structure(obj: Any, leaf: Callable[[Any], Any], kind: type) -> Any:
    """`obj` with every instance of `kind` replaced by ``leaf(instance)``, through dicts, lists and tuples."""
    if isinstance(obj, kind):
        return leaf(obj)
    if isinstance(obj, dict):
        return {key: map_structure(value, leaf, kind) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_structure(value, leaf, kind) for value in obj)
    return obj


class _TensorSlot:
    """Where a tensor was in a packed batch: its index in the metadata list."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class PackedBatch(NamedTuple):
    """One batch as a worker sends it: the tensors' bytes in `storage` (or in ring slot `slot` of worker
    `worker`, sent once), where each tensor is (`layout`), and the batch with `_TensorSlot` placeholders."""

    worker: int
    slot: int | None
    storage: torch.Tensor | None
    nbytes: int
    layout: list[tuple[int, torch.dtype, tuple]]
    skeleton: Any


class PackingCollate:
    """Worker side of the train loader: collate, then copy every tensor of the batch into one shared buffer.

    Each worker has its own copy of this object and so its own ring of `ring_slots` buffers of `slot_bytes`.

    Args:
        collate_fn: batch list -> what the model takes.
        ring_slots: buffers per worker.
        slot_bytes: size of each buffer; a larger batch travels in a segment of its own.
    """

    def __init__(self, collate_fn: Callable, ring_slots: int, slot_bytes: int) -> None:
        self.collate_fn, self.ring_slots, self.slot_bytes = collate_fn, ring_slots, slot_bytes
        self.ring: list[torch.Tensor | None] = [None] * ring_slots
        self.next_slot = 0

    @classmethod
    def for_loader(cls, collate_fn: Callable, num_workers: int, prefetch_factor: int) -> PackingCollate:
        """The ring for a loader with `num_workers` workers that each work `prefetch_factor` batches ahead.

        A worker refills a slot only after `ring_slots` more batches: the DataLoader requests a batch only when
        fewer than prefetch x workers are waiting, so by then the main process has copied the slot's batch.
        """
        ring_slots = prefetch_factor * num_workers + 1
        return cls(collate_fn, ring_slots, _RING_BYTES // (ring_slots * num_workers))

    def __call__(self, batch: list) -> PackedBatch:
        tensors: list[torch.Tensor] = []

        def take(tensor: torch.Tensor) -> _TensorSlot:
            tensors.append(tensor.detach().contiguous())
            return _TensorSlot(len(tensors) - 1)

        skeleton = map_structure(self.collate_fn(batch), take, torch.Tensor)
        offsets, total = [], 0
        for tensor in tensors:
            offsets.append(total)
            total += -(-tensor.nbytes // 16) * 16  # aligned for any dtype view
        slot, storage, buffer = self._buffer(total)
        for tensor, offset in zip(tensors, offsets):
            buffer[offset : offset + tensor.nbytes] = tensor.view(-1).view(torch.uint8)
        layout = [(o, t.dtype, tuple(t.shape)) for o, t in zip(offsets, tensors)]
        worker = torch.utils.data.get_worker_info()
        return PackedBatch(worker.id if worker else 0, slot, storage, total, layout, skeleton)

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


class BatchReceiver:
    """Main-process side of `PackingCollate` for one ``iter()``: keeps the workers' ring slots and copies each
    batch out of its slot (into pinned memory when `pin_memory`), then rebuilds the batch as views of that copy.

    Args:
        pin_memory: copy each batch into page-locked memory.
    """

    def __init__(self, pin_memory: bool = False) -> None:
        self.slots: dict[tuple[int, int], torch.Tensor] = {}
        self.pin_memory = pin_memory

    def __call__(self, packed: PackedBatch) -> Any:
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

        return map_structure(packed.skeleton, restore, _TensorSlot)


def _pinned_empty(nbytes: int) -> torch.Tensor:
    """Uninitialised page-locked bytes (from torch's caching host allocator, which reuses freed blocks)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory()


def pin_batch(batch: Any) -> Any:
    """`batch` with each of its tensors copied into page-locked memory (a batch mapped without workers)."""
    return map_structure(batch, _pin, torch.Tensor)


def resolve_pin_memory(pin_memory: bool | str | torch.device, component: str) -> bool:
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
