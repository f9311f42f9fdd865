"""`CompiledBackbone`: a detector's backbone (with its FPN) through ``torch.compile`` for training steps at
fixed input shapes (a regional compile: the RPN and RoI heads, whose shapes depend on the data, stay eager).

The invariant: the compiled callable never enters the model's module tree and never recompiles silently. It
is kept here, outside the model's modules (no ``_orig_mod.`` state-dict keys, no second listing of the
parameters, checkpoints and EMA unaffected), it is dropped when the model is copied or pickled (a copy compiles
its own backbone at first use), and a training batch of a shape beyond those allowed raises an error that says
the fix instead of compiling again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["CompiledBackbone"]


class CompiledBackbone:
    """The compile settings of a backbone, the input shapes it was compiled for, and the compiled callable.

    Args:
        mode: ``torch.compile``'s mode: None/"default", "reduce-overhead" (CUDA graphs on a GPU),
            "max-autotune", "max-autotune-no-cudagraphs".
        backend: ``torch.compile``'s backend ("inductor"; "aot_eager" traces without generating code).
    """

    def __init__(self, *, mode: str | None = None, backend: str = "inductor") -> None:
        self.options: dict[str, Any] = {"mode": mode, "backend": backend}
        self.input_shapes: list[tuple[int, ...]] = []
        self.compiled: nn.Module | None = None

    def __getstate__(self) -> dict[str, Any]:
        # dynamo's code cache cannot be copied or pickled; a copy compiles again at first use.
        return {**self.__dict__, "compiled": None}

    def for_batch(self, backbone: nn.Module, batch: Tensor, max_shapes: int) -> nn.Module:
        """The compiled `backbone` to run `batch` through, compiled at the first call.

        Args:
            backbone: the model's backbone (the model's own module, so that a copy compiles its copy).
            batch: the padded image batch of a training step.
            max_shapes: how many input shapes may be compiled (one per padded size); a further shape raises.
        """
        shape = tuple(batch.shape)
        if shape not in self.input_shapes:
            self._check_new_input_shape(shape, max_shapes)
            self.input_shapes.append(shape)
        if self.compiled is None:
            self.compiled = torch.compile(backbone, dynamic=False, **self.options)
        if self.options["mode"] in ("reduce-overhead", "max-autotune"):
            # CUDA graphs reuse their output memory: each training forward starts a new step.
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled

    def _check_new_input_shape(self, shape: tuple[int, ...], max_shapes: int) -> None:
        if len(self.input_shapes) < max_shapes:
            return
        compiled = ", ".join(str(list(s)) for s in self.input_shapes)
        raise ValueError(
            f"RCNN.compile_backbone (train.compile.enabled=true): the backbone was compiled for the input shape "
            f"{compiled} and a training batch now has {list(shape)}. Each new shape would compile again (and "
            "record new CUDA graphs). Give training fixed shapes: model.pad_to_sizes=[[H, W]] (one size, e.g. "
            "[[1024,1024]] for large-scale jitter) or a few buckets (one compile each), and a fixed "
            "dataloader.train.total_batch_size per process; or set train.compile.enabled=false."
        )
