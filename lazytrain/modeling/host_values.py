"""Values the host knows (sizes, counts, offsets) sent to the model's device, and integer rounding, for the
models' batch code: one home for the copies that must not make the host wait."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["round_up", "to_device"]


def to_device(values: Sequence[Any], device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """`values` (Python numbers or nested lists of them) as a tensor on `device`. The copy is asynchronous
    (``non_blocking``): the host goes on queueing work instead of waiting for the transfer."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def round_up(value: Any, multiple: int) -> Any:
    """The smallest multiple of `multiple` not below `value` (ints, or symbolic sizes under ``torch.export``)."""
    return (value + multiple - 1) // multiple * multiple
