"""The torch backend settings of a run must be values torch accepts before any process starts:
``train.cudnn_benchmark`` (a bool), ``train.float32_matmul_precision`` (torch's names), ``train.compile``
(torch.compile's modes and backends, and the compiler its code generation needs) and the ``compiled_nms`` keys of
``model.rpn`` and ``model.roi_heads`` (bools, and the same compiler)."""

from __future__ import annotations

import importlib.util
import os
import shutil

from omegaconf import DictConfig

__all__ = ["FLOAT32_MATMUL_PRECISIONS", "find_backend_problems"]

# torch.set_float32_matmul_precision's values: "highest" (torch's default, fp32 matmuls), "high" (TF32 on
# Ampere and later), "medium" (bfloat16 passes).
FLOAT32_MATMUL_PRECISIONS = ("highest", "high", "medium")


def find_backend_problems(cfg: DictConfig) -> list[str]:
    """One message per backend setting torch would refuse (or silently take for another)."""
    problems = []
    benchmark = cfg.train.get("cudnn_benchmark", False)
    if not isinstance(benchmark, bool):
        problems.append(
            f"train.cudnn_benchmark={benchmark!r}: must be true or false (detectron2's key: let cuDNN time its "
            "convolution algorithms for each new input shape; it pays when the shapes repeat)."
        )
    precision = cfg.train.get("float32_matmul_precision", "highest")
    if precision not in FLOAT32_MATMUL_PRECISIONS:
        problems.append(
            f"train.float32_matmul_precision={precision!r}: must be one of {', '.join(FLOAT32_MATMUL_PRECISIONS)} "
            "(torch.set_float32_matmul_precision; 'high' runs float32 matmuls in TF32 on Ampere and later)."
        )
    return problems + find_compile_problems(cfg) + find_compiled_nms_problems(cfg)


def find_compile_problems(cfg: DictConfig) -> list[str]:
    """``train.compile``: a bool ``enabled``, torch.compile's ``mode`` and ``backend`` names, and for inductor
    the code generator it needs (a C++ compiler on the CPU, Triton on a GPU)."""
    options = cfg.train.get("compile") or {}
    enabled = options.get("enabled", False)
    if not isinstance(enabled, bool):
        return [f"train.compile.enabled={enabled!r}: must be true or false."]
    if not enabled:
        return []
    import torch._dynamo  # about a second: only for runs that compile
    import torch._inductor

    mode, backend = options.get("mode"), options.get("backend", "inductor")
    backends = torch._dynamo.list_backends(exclude_tags=())
    if backend not in backends:
        return [
            f"train.compile.backend={backend!r}: not a torch.compile backend; one of {', '.join(backends)}."
        ]
    modes = list(torch._inductor.list_mode_options())
    if mode is not None and (backend != "inductor" or mode not in modes):
        return [
            f"train.compile.mode={mode!r} (backend {backend!r}): modes are inductor's ({', '.join(modes)}); "
            "use train.compile.backend=inductor with one of them, or train.compile.mode=null."
        ]
    if backend != "inductor":
        return []
    return _inductor_code_generator_problems(
        cfg, "train.compile.enabled=true", "train.compile.backend=aot_eager"
    )


def find_compiled_nms_problems(cfg: DictConfig) -> list[str]:
    """``model.rpn.compiled_nms`` and ``model.roi_heads.compiled_nms`` (`lazytrain.modeling.nms`): bools, and
    inductor's code generator when one is true."""
    model = cfg.get("model") or {}
    problems, compiled = [], []
    for part in ("rpn", "roi_heads"):
        node = model.get(part) if isinstance(model, DictConfig) else None
        if not isinstance(node, DictConfig) or "compiled_nms" not in node:
            continue
        value = node.compiled_nms
        if not isinstance(value, bool):
            problems.append(f"model.{part}.compiled_nms={value!r}: must be true or false.")
        elif value:
            compiled.append(f"model.{part}.compiled_nms")
    if problems or not compiled:
        return problems
    setting = " and ".join(f"{key}=true" for key in compiled)
    alternative = " and ".join(f"{key}=false" for key in compiled)
    return _inductor_code_generator_problems(cfg, setting, alternative)


def _inductor_code_generator_problems(cfg: DictConfig, setting: str, alternative: str) -> list[str]:
    """Inductor's code generator for the run's device: a C++ compiler on the CPU, Triton on a GPU."""
    on_cpu = cfg.train.get("device", "cpu") == "cpu"
    if on_cpu and not _cpp_compiler():
        return [
            f"{setting} with train.device=cpu: inductor compiles C++ and finds no compiler (g++, clang++, or "
            f"$CXX). Install one (apt install g++), or use {alternative}."
        ]
    if not on_cpu and importlib.util.find_spec("triton") is None:
        return [
            f"{setting} on a GPU: inductor generates Triton kernels and the triton package is missing (it comes "
            "with torch's CUDA wheels: pip install triton)."
        ]
    return []


def _cpp_compiler() -> str | None:
    candidates = [os.environ.get("CXX", ""), "g++", "clang++", "c++"]
    return next((path for path in map(shutil.which, filter(None, candidates)) if path), None)
