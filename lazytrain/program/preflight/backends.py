"""The torch backend settings of a run must be values torch accepts before any process starts:
``train.cudnn_benchmark`` (a bool) and ``train.float32_matmul_precision`` (torch's names)."""

from __future__ import annotations

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
    return problems
