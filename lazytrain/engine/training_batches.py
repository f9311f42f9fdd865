"""`TrainingBatches`: the trainer's side of its data loader.

Three things about the loader's iterator matter to training and live here: batches come one at a time with
the time spent waiting for them (``data_time``); the loader's position is part of the checkpoint (the
"Resumable data protocol" of docs/architecture.md); and the loader's worker processes are stopped as soon as
training no longer needs them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["TrainingBatches"]


class TrainingBatches:
    """Batches from `data_loader`, an infinite iterable, one step at a time.

    Args:
        data_loader: yields a batch per step forever; with ``state_dict``/``load_state_dict`` its position is
            saved and restored for exact resume.
    """

    def __init__(self, data_loader: Iterable) -> None:
        self.data_loader = data_loader
        self._iterator: Iterator | None = None

    def start(self) -> None:
        """Create the loader's iterator now, if there is none (a torch ``DataLoader`` without a generator
        draws its base seed from the global RNG here)."""
        if self._iterator is None:
            self._iterator = iter(self.data_loader)

    def next(self, iteration: int) -> tuple[Any, float]:
        """The batch of step `iteration` and the seconds spent waiting for it."""
        self.start()
        start = time.perf_counter()
        try:
            batch = next(self._iterator)
        except StopIteration:
            raise RuntimeError(
                f"SimpleTrainer: the training data loader ended at iteration {iteration}; it must yield batches "
                "forever (use an infinite training sampler, e.g. lazytrain.data.samplers.TrainingSampler)."
            ) from None
        return batch, time.perf_counter() - start

    def close(self) -> None:
        """Stop the loader's worker processes now, rather than when the iterator is garbage-collected: the
        trainer may live on (reference cycles with its hooks), and a multirun sweep runs many jobs in one
        process, each of which would leave its workers and their memory behind."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
        self._iterator = None

    def state_dict(self) -> dict | None:
        """The loader's position (the batches consumed so far), or None when the loader has no state."""
        return self.data_loader.state_dict() if hasattr(self.data_loader, "state_dict") else None

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position: the next iterator starts there."""
        if hasattr(self.data_loader, "load_state_dict"):
            self.data_loader.load_state_dict(state)
            self._iterator = None

    def load_resharded_state_dict(self, state: dict) -> bool:
        """Continue from rank 0's position saved by another number of processes, where the loader's
        ``reshard_state_dict`` can (`TrainLoader.reshard_state_dict`); False (nothing loaded) where it cannot."""
        reshard = getattr(self.data_loader, "reshard_state_dict", None)
        resharded = None if reshard is None else reshard(state)
        if resharded is None:
            return False
        self.load_state_dict(resharded)
        return True
