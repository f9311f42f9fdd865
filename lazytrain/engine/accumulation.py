"""Gradient accumulation: the loader's batch through the model in several forward/backward passes, then one
optimizer step (``SimpleTrainer(images_per_forward=)``, ``train.images_per_forward``).

The loader still yields the whole batch of a step (this process's share of
``dataloader.train.total_batch_size``), so samplers (RFS), aspect grouping and exact resume see the same batches
with and without accumulation; the trainer cuts it into consecutive chunks (`split_for_accumulation`), and only
one chunk at a time is on the device. Each chunk's loss is divided by the number of chunks and the gradients
are summed, so a model whose losses are means over its images (Mask R-CNN's are, up to the per-image sampling
of anchors and RoIs) gets the gradient of the whole batch, as DDP's average over ranks does; BatchNorm
statistics see the chunks. DDP all-reduces the gradients once, in the last chunk's backward pass
(`sync_gradients_if_last`), the grad scaler unscales and steps once, and clipping sees the summed gradient.

What a batch may be: a list of samples (lazytrain's loaders yield a list of per-image dicts), a tensor (cut
along its first dimension), or a tuple, named tuple or dict of those (any container `torch.utils._pytree`
knows; register another with ``torch.utils._pytree.register_pytree_node``), all of one batch size. Chunks keep
the batch's form.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = [
    "check_images_per_forward",
    "get_batch_size",
    "split_batch",
    "split_for_accumulation",
    "sync_gradients_if_last",
]


def check_images_per_forward(images_per_forward: int | None) -> None:
    """Raise a ValueError naming ``train.images_per_forward`` unless it is an integer >= 1 or None."""
    if images_per_forward is not None and (
        not isinstance(images_per_forward, int)
        or isinstance(images_per_forward, bool)
        or images_per_forward < 1
    ):
        raise ValueError(
            f"SimpleTrainer(images_per_forward=) must be an integer >= 1 or None (no accumulation); got "
            f"{images_per_forward!r} (train.images_per_forward)"
        )


def _is_samples(node: Any) -> bool:
    # A list is the batch's samples themselves (one per image), not a container of columns to look into.
    return isinstance(node, list)


def _unsplittable(got: str) -> TypeError:
    return TypeError(
        "gradient accumulation (train.images_per_forward) splits each training batch into smaller ones: a list "
        "of samples, a tensor (first dimension), or a tuple, named tuple or dict of those with one batch size; "
        f"got {got}. Set train.images_per_forward=null, register your batch type with "
        "torch.utils._pytree.register_pytree_node, or subclass SimpleTrainer to split your loader's batches."
    )


def _size_of_part(part: Any, batch: Any) -> int:
    if isinstance(part, list):
        return len(part)
    if isinstance(part, torch.Tensor) and part.dim() > 0:
        return part.shape[0]
    if part is batch:
        raise _unsplittable(type(batch).__name__)
    raise _unsplittable(f"a {type(batch).__name__} holding an element of type {type(part).__name__}")


def get_batch_size(batch: Any) -> int:
    """The number of samples in `batch`: a list's length, a tensor's first dimension, or that of the lists and
    tensors a tuple, named tuple or dict holds (which must agree)."""
    parts, _ = tree_flatten(batch, is_leaf=_is_samples)
    sizes = [_size_of_part(part, batch) for part in parts]
    if not sizes:
        raise _unsplittable(f"an empty {type(batch).__name__}")
    if len(set(sizes)) > 1:
        raise _unsplittable(f"a {type(batch).__name__} whose parts have batch sizes {sizes}")
    return sizes[0]


def _split_part(part: list | torch.Tensor, parts: int) -> list:
    if isinstance(part, list):
        size = len(part) // parts
        return [part[i * size : (i + 1) * size] for i in range(parts)]
    return list(part.chunk(parts))


def split_batch(batch: Any, parts: int) -> list:
    """`batch` cut into `parts` consecutive batches of equal size and of the same form (see
    `get_batch_size` for the forms)."""
    if parts == 1:
        return [batch]
    size = get_batch_size(batch)
    if size % parts:
        raise ValueError(f"split_batch: a batch of {size} cannot be cut into {parts} equal parts")
    leaves, spec = tree_flatten(batch, is_leaf=_is_samples)
    columns = [_split_part(leaf, parts) for leaf in leaves]
    return [tree_unflatten([column[i] for column in columns], spec) for i in range(parts)]


def split_for_accumulation(batch: Any, images_per_forward: int | None) -> list:
    """The chunks of `batch` that go through the model one at a time: `images_per_forward` samples each
    (the whole batch when None).

    Raises:
        ValueError: naming ``train.images_per_forward`` when it does not divide the batch.
    """
    if images_per_forward is None:
        return [batch]
    size = get_batch_size(batch)
    if size % images_per_forward:
        divisors = [n for n in range(1, size + 1) if size % n == 0]
        raise ValueError(
            f"SimpleTrainer(images_per_forward={images_per_forward}) must divide the batch of each process; "
            f"got a batch of {size} (dataloader.train.total_batch_size / processes). Set "
            f"train.images_per_forward to one of {divisors}, or change dataloader.train.total_batch_size."
        )
    return split_batch(batch, size // images_per_forward)


def sync_gradients_if_last(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """DDP all-reduces the gradients in the backward pass of the last chunk only (``no_sync`` before)."""
    if last or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()
