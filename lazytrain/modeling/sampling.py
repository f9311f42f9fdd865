"""Choosing the positive and negative training examples of each image as boolean masks, without host syncs.

torchvision's `BalancedPositiveNegativeSampler` finds each image's positives and negatives with
``torch.where`` and draws from them with ``randperm``: sizes read from the device, so on a GPU the host waits
for it twice per image. `BalancedMaskSampler` draws the same numbers of examples from fixed-size tensors (a
random key per example, then top-k), for every image at once, and returns masks.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BalancedMaskSampler"]


class BalancedMaskSampler:
    """Per image, up to ``batch_size_per_image`` examples, at most ``positive_fraction`` of them positive.

    The counts are torchvision's `BalancedPositiveNegativeSampler`'s: ``min(#positives,
    int(batch_size_per_image * positive_fraction))`` positives, then ``min(#negatives, batch_size_per_image -
    that)`` negatives, each set drawn uniformly without replacement (from ``torch.rand``, so
    ``torch.manual_seed`` makes it repeatable). Which examples are drawn differs from torchvision's for the
    same seed: the random numbers are used differently.

    Args:
        batch_size_per_image: examples per image.
        positive_fraction: the largest share of positives, in [0, 1].
    """

    def __init__(self, batch_size_per_image: int, positive_fraction: float) -> None:
        if isinstance(batch_size_per_image, bool) or not isinstance(batch_size_per_image, int):
            raise TypeError(
                f"BalancedMaskSampler(batch_size_per_image=) must be an int; got {batch_size_per_image!r}"
            )
        if batch_size_per_image < 1:
            raise ValueError(
                f"BalancedMaskSampler(batch_size_per_image=) must be at least 1; got {batch_size_per_image}"
            )
        if not 0.0 <= positive_fraction <= 1.0:
            raise ValueError(
                f"BalancedMaskSampler(positive_fraction=) must be in [0, 1]; got {positive_fraction}"
            )
        self.batch_size_per_image = batch_size_per_image
        self.positive_fraction = float(positive_fraction)

    @property
    def max_positives(self) -> int:
        """The most positives drawn per image (torchvision rounds the product down the same way)."""
        return int(self.batch_size_per_image * self.positive_fraction)

    def __call__(self, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Draw the examples of every image.

        Args:
            labels: [..., A] one row per image (a single image may be [A]): values >= 1 are positives, 0
                negatives, and anything else (-1 in the RPN) is never drawn. Rows of different lengths: pad
                with -1.

        Returns:
            ``(positive, negative)``: boolean masks shaped like `labels`, the drawn examples.
        """
        # 31 random bits per key: top-k breaks ties by position, and with float32's 24 bits the hundreds of
        # thousands of anchors of an 800 px image would tie often enough to favour some of them.
        keys = torch.randint(0, 2**31 - 1, labels.shape, dtype=torch.int32, device=labels.device)
        positive = _draw(keys, labels >= 1, self.max_positives)
        negative_room = self.batch_size_per_image - positive.sum(dim=-1, keepdim=True)
        negative = _draw(keys, labels == 0, self.batch_size_per_image, negative_room)
        return positive, negative


def _draw(keys: Tensor, eligible: Tensor, count: int, room: Tensor | None = None) -> Tensor:
    """The eligible entries with the `count` largest keys (fewer where fewer are eligible), and of those only
    the first `room` of each row; as a mask shaped like `keys`."""
    count = min(count, keys.shape[-1])
    values, index = keys.masked_fill(~eligible, -1).topk(count, dim=-1)
    drawn = values >= 0
    if room is not None:
        drawn &= torch.arange(count, device=keys.device) < room
    return torch.zeros_like(eligible).scatter_(-1, index, drawn)
