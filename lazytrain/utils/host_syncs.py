"""Count the operations that make the host wait for the accelerator ("host syncs"), by operator.

A CUDA step runs fast only while Python stays ahead of the GPU, queueing kernels. An operation whose result
the host must read (a value, or an output size that depends on the data) drains that queue: the host waits
for every kernel queued before it, then the GPU waits for the host to queue the next ones. `HostSyncCounter`
sees every ATen operator through a `TorchDispatchMode` (autograd's backward included) and counts those that
synchronise on CUDA, by name, without changing what runs.

What counts, and why (the CUDA kernels that end in ``at::cuda::memcpy_and_sync`` or a stream synchronise,
which is also what ``torch.cuda.set_sync_debug_mode("warn")`` reports):

- ``aten._local_scalar_dense``: ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``if t:``, formatting.
- ``aten.nonzero`` (``torch.where(cond)``, ``argwhere``), ``aten.masked_select``, the ``aten.unique`` family
  (``_unique``, ``_unique2``, ``unique_dim``, ``unique_consecutive``), ``aten.bincount``: the output size is
  read from the device.
- ``aten.index`` / ``aten.index_put(_)`` with a boolean or uint8 index: the mask becomes indices through
  ``nonzero``. Not counted: ``t[mask] = scalar`` (one mask, one value held by the host, no accumulate), which
  ATen turns into ``masked_fill_`` on the device.
- ``aten.repeat_interleave`` without ``output_size``, ``aten.equal``, ``aten.allclose``, ``aten.is_nonzero``.
- ``torchvision.nms``: its CUDA kernel (in the torchvision source read for this) copies the suppression mask
  to the host and the kept indices back: two synchronising copies per call, counted as one operation.
- Host-device copies that block: ``aten._to_copy`` / ``aten.copy_`` between the CPU and a device without
  ``non_blocking`` (``.cpu()``, ``.tolist()``, ``.to(device)`` of host memory), and ``torch.tensor(data,
  device=...)`` from Python data (seen as ``aten.lift_fresh`` of a device tensor).

On the CPU (the proxy for machines without a GPU) there is no device, so the counter treats every CPU tensor
as if it lived on the accelerator (``treat_cpu_as_device=True``). Copies cannot be seen there (``.to(device)``
of a CPU tensor to the CPU does nothing), so Python calls stand in for them, seen through a
`TorchFunctionMode`: ``torch.tensor``/``torch.as_tensor`` of Python data with an explicit ``device=`` and
``Tensor.new_tensor`` of Python data count as ``tensor from Python data on the device``;
``Tensor.tolist``/``numpy``/``cpu`` count as ``copy device->host``.

The CPU count is a proxy, not the CUDA count:

- an operation on a tensor that stays on the host in a GPU run (a loader tensor, a scalar made with
  ``torch.tensor(x)``, an optimizer's step counter) counts on the CPU and is free on the GPU;
- ``.to(device)`` of host memory and a device tensor used as a one-element ``index_put_`` value are missed;
- some code branches on the device: torchvision's ``batched_nms`` loops over classes (``unique``, one
  ``nonzero`` and one ``nms`` per class) above 4,000 box coordinates on the CPU; on CUDA it offsets the boxes
  instead (one ``nms``, one host-to-device copy) up to 100,000 (torchvision 0.29), and above that
  `lazytrain.modeling.nms.batched_nms` runs `grouped_batched_nms` (a few reads in all) on a device;
  lazytrain's dense RoIAlign (`lazytrain.modeling.poolers`, CPU training only) adds a ``nonzero`` per image and
  feature map.

`HostSyncCounter` also counts every operation that would launch work on the device (`operations`,
`is_device_operation`): views and allocations excluded, so about one per kernel launch. A step's kernel count
is what keeps a GPU busy or idle (each launch costs the host ~5-10 us); the count keeps it from creeping back
(tests/utils/test_host_syncs.py holds a training step's count). With them it adds up the bytes of their tensor
arguments and results (`memory_traffic`, by operator and, with ``record_sites=True``, by calling line): the
memory an operation reads and writes, each tensor counted once per argument or result (in-place results
twice), a proxy for the time of the operations that are bound by memory rather than arithmetic (element-wise
passes over large arrays; a convolution's figure says little about its time). Calls to ``torch.compile``d
code run eagerly under the counter (dynamo steps aside while a dispatch mode is active), so this counts what
their eager form would do.

Count a step after a first one: the first also sets up what later steps reuse (RoI pooler scales, with
``.item()`` calls on the host).

On a CUDA device give ``treat_cpu_as_device=False``: only operations that touch a device tensor count, and
the copies are seen as ATen copies. ``torch.cuda.set_sync_debug_mode("warn")`` gives the exact number there
(it warns inside the kernels); this counter says which operators and, with ``record_sites=True``, which lines.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "FROM_PYTHON_DATA",
    "TO_DEVICE",
    "TO_HOST",
    "HostSyncCounter",
    "get_host_sync_name",
    "is_device_operation",
]

# Operators whose CUDA kernels read a value or an output size from device memory on every call.
_ALWAYS_SYNC = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.is_nonzero",
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.unique_dim_consecutive",
        "aten.bincount",
        "aten.equal",
        "aten.allclose",
        "torchvision.nms",
    }
)
# Operators that are not views by their schema but only make or relabel memory: no kernel runs.
_NO_KERNEL = frozenset(
    {
        torch.ops.aten._unsafe_view.default,
        torch.ops.aten.empty.memory_format,
        torch.ops.aten.empty_strided.default,
        torch.ops.aten.new_empty.default,
        torch.ops.aten.new_empty_strided.default,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.lift_fresh.default,
        torch.ops.aten.set_.source_Storage_storage_offset,
    }
)
_INDEX_PUT = frozenset({"aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
_MASK_DTYPES = (torch.bool, torch.uint8)
# Names of the copies in `HostSyncCounter.counts` (operators are counted under their own names).
TO_HOST = "copy device->host"
TO_DEVICE = "copy host->device (blocking)"
FROM_PYTHON_DATA = "tensor from Python data on the device"

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _argument(args: Sequence[Any], kwargs: dict[str, Any], position: int, name: str, default: Any) -> Any:
    if len(args) > position:
        return args[position]
    return kwargs.get(name, default)


def _tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found = []
    for value in [*args, *kwargs.values()]:
        values = value if isinstance(value, (list, tuple)) else [value]
        found += [v for v in values if isinstance(v, torch.Tensor)]
    return found


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in `value` (tensors, lists, tuples and dicts of them), as they are shaped."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    return 0


def _is_device(tensor: torch.Tensor, treat_cpu_as_device: bool) -> bool:
    return treat_cpu_as_device or tensor.device.type != "cpu"


def _has_mask(indices: Sequence[torch.Tensor | None]) -> bool:
    return any(index is not None and index.dtype in _MASK_DTYPES for index in indices)


def _fills_a_mask(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """ATen's fast path for ``t[mask] = value``: one mask index, a one-element host value, no accumulate."""
    indices = [index for index in args[1] if index is not None]
    value = args[2]
    accumulate = _argument(args, kwargs, 3, "accumulate", False)
    # A CPU value in a CPU run may stand for a device value in a GPU run; Python scalars (the common case)
    # stay on the host there too, so the fast path is assumed.
    return not accumulate and len(indices) == 1 and value.numel() == 1 and value.device.type == "cpu"


def _copy_name(source: torch.device, target: torch.device | None, non_blocking: bool) -> str | None:
    if target is None or non_blocking or (source.type == "cpu") == (target.type == "cpu"):
        return None
    return TO_HOST if target.type == "cpu" else TO_DEVICE


def _copy_sync_name(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """A blocking copy between the host and a device (only visible when a device is present)."""
    if name == "aten._to_copy":
        target = kwargs.get("device")
        target = None if target is None else torch.device(target)
        return _copy_name(args[0].device, target, bool(kwargs.get("non_blocking", False)))
    if name == "aten.copy_":
        non_blocking = bool(_argument(args, kwargs, 2, "non_blocking", False))
        return _copy_name(args[1].device, args[0].device, non_blocking)
    if name in ("aten.lift_fresh", "aten.lift_fresh_copy") and args[0].device.type != "cpu":
        return FROM_PYTHON_DATA  # torch.tensor(data, device=...) copied it with non_blocking=False
    return None


def get_host_sync_name(
    func: torch._ops.OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    *,
    treat_cpu_as_device: bool = True,
) -> str | None:
    """The name under which `HostSyncCounter` counts one operator call, or None if it does not synchronise.

    Args:
        func: the ATen (or torchvision) operator overload, as a dispatch mode receives it.
        args: its positional arguments.
        kwargs: its keyword arguments.
        treat_cpu_as_device: count operations on CPU tensors as if the tensors lived on the accelerator.
    """
    kwargs = kwargs or {}
    name = str(func.overloadpacket)
    if not treat_cpu_as_device:
        copy = _copy_sync_name(name, args, kwargs)
        if copy is not None:
            return copy
    if not any(_is_device(tensor, treat_cpu_as_device) for tensor in _tensors(args, kwargs)):
        return None
    if name in _ALWAYS_SYNC:
        return name
    if func is torch.ops.aten.repeat_interleave.Tensor:
        return name if kwargs.get("output_size") is None else None
    if name == "aten.index" and _has_mask(args[1]):
        return "aten.index (bool index)"
    if name in _INDEX_PUT and _has_mask(args[1]) and not _fills_a_mask(args, kwargs):
        return f"{name} (bool index)"
    return None


def is_device_operation(
    func: torch._ops.OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    *,
    treat_cpu_as_device: bool = True,
) -> bool:
    """Whether an operator call would launch work on the device: it touches a device tensor (any tensor with
    `treat_cpu_as_device`) and is not a view or an allocation (those change metadata only). One call is
    usually one kernel; a few operators launch several and library calls (cuDNN, cuBLAS) count as one, so
    the count follows the kernel launches of a step without equalling them."""
    if func.is_view or func in _NO_KERNEL:
        return False
    return any(_is_device(tensor, treat_cpu_as_device) for tensor in _tensors(args, kwargs or {}))


def _python_call_sync_name(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """On the CPU: Python calls that copy between host and device in a GPU run (ATen sees no copy here)."""
    if func in (torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu):
        return TO_HOST
    if func is torch.Tensor.new_tensor:  # on its tensor's device unless told otherwise
        return (
            None if isinstance(_argument(args, kwargs, 1, "data", None), torch.Tensor) else FROM_PYTHON_DATA
        )
    if func in (torch.tensor, torch.as_tensor):
        data = _argument(args, kwargs, 0, "data", None)
        if kwargs.get("device") is not None and not isinstance(data, torch.Tensor):
            return FROM_PYTHON_DATA
    return None


def _caller_site() -> str:
    """``path:line (function)`` of the innermost frame outside torch and this module."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_TORCH_DIR) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    for marker in ("site-packages" + os.sep, os.getcwd() + os.sep):
        path = path.split(marker, 1)[-1]
    return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"


class _PythonCallCounter(TorchFunctionMode):
    """The Python-level half of `HostSyncCounter` on the CPU (see `_python_call_sync_name`)."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _python_call_sync_name(func, args, kwargs)
        if name is not None:
            self.counter._add(name)
        return func(*args, **kwargs)


class HostSyncCounter(TorchDispatchMode):
    """Counts, by operator, the operations of a block that make the host wait for the accelerator.

    Use it as a context manager around one training step; it only observes, so results are unchanged::

        with HostSyncCounter() as counter:
            loss = sum(model(batch).values())
            loss.backward()
        print(counter.total, counter.format_table())

    What counts and how the CPU count relates to a CUDA one: see this module's docstring.

    Args:
        treat_cpu_as_device: count operations on CPU tensors as if they ran on the accelerator (the CPU
            proxy, the default). Give False on a CUDA device to count only what touches device tensors.
        record_sites: also count where each one was called from (`sites`), the innermost line outside torch,
            and the memory traffic by line (`memory_traffic_sites`).
    """

    def __init__(self, *, treat_cpu_as_device: bool = True, record_sites: bool = False) -> None:
        super().__init__()
        self.treat_cpu_as_device = bool(treat_cpu_as_device)
        self.record_sites = bool(record_sites)
        self.counts: Counter[str] = Counter()
        self.operations: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str]] = Counter()
        self.memory_traffic: Counter[str] = Counter()
        self.memory_traffic_sites: Counter[str] = Counter()
        self._python_calls: _PythonCallCounter | None = None

    @property
    def total(self) -> int:
        """All counted host syncs."""
        return sum(self.counts.values())

    @property
    def operation_total(self) -> int:
        """All operations that would run a kernel on the device (`is_device_operation`), syncs or not."""
        return sum(self.operations.values())

    @property
    def memory_traffic_total(self) -> int:
        """Bytes read and written by the counted operations (see this module's docstring)."""
        return sum(self.memory_traffic.values())

    def _add(self, name: str) -> None:
        self.counts[name] += 1
        if self.record_sites:
            self.sites[(name, _caller_site())] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = get_host_sync_name(func, args, kwargs, treat_cpu_as_device=self.treat_cpu_as_device)
        if name is not None:
            self._add(name)
        result = func(*args, **kwargs)
        if is_device_operation(func, args, kwargs, treat_cpu_as_device=self.treat_cpu_as_device):
            operator = str(func.overloadpacket)
            self.operations[operator] += 1
            traffic = _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(result)
            self.memory_traffic[operator] += traffic
            if self.record_sites:
                self.memory_traffic_sites[_caller_site()] += traffic
        return result

    def __enter__(self) -> HostSyncCounter:
        if self.treat_cpu_as_device:
            self._python_calls = _PythonCallCounter(self)
            self._python_calls.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._exit_python_calls(*sys.exc_info())
            raise

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        try:
            super().__exit__(exc_type, exc_value, traceback)
        finally:
            self._exit_python_calls(exc_type, exc_value, traceback)

    def _exit_python_calls(self, exc_type, exc_value, traceback) -> None:
        if self._python_calls is not None:
            self._python_calls.__exit__(exc_type, exc_value, traceback)
            self._python_calls = None

    def format_counts(self) -> str:
        """One line, most frequent first: ``total 57: aten.nonzero 30, aten._local_scalar_dense 12, ...``."""
        parts = ", ".join(f"{name} {count}" for name, count in self.counts.most_common())
        return f"total {self.total}: {parts}" if parts else "total 0"

    def format_memory_traffic(self, *, top: int = 15) -> str:
        """A markdown table of the memory traffic in GB by calling line (needs ``record_sites=True``) or else
        by operator, the largest `top` first, and its total."""
        counter = self.memory_traffic_sites if self.record_sites else self.memory_traffic
        lines = [f"| {'line' if self.record_sites else 'operator'} | GB read and written |", "|---|---|"]
        lines += [f"| {name} | {size / 1e9:.3f} |" for name, size in counter.most_common(top)]
        lines.append(f"| **total** | {self.memory_traffic_total / 1e9:.3f} |")
        return "\n".join(lines)

    def format_table(self, *, sites: bool = False) -> str:
        """A markdown table of the counts (most frequent first) and their total.

        Args:
            sites: one row per (operation, calling line) instead; needs ``record_sites=True``.
        """
        if sites and not self.record_sites:
            raise ValueError(
                "HostSyncCounter.format_table(sites=True) needs the calling lines; build the counter with "
                "HostSyncCounter(record_sites=True)."
            )
        if sites:
            rows = [(f"{name} at {site}", count) for (name, site), count in self.sites.most_common()]
        else:
            rows = list(self.counts.most_common())
        lines = ["| operation | count |", "|---|---|"]
        lines += [f"| {name} | {count} |" for name, count in rows]
        lines.append(f"| **total** | {self.total} |")
        return "\n".join(lines)
