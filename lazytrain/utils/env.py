"""A short description of the software environment, logged at the start of every run."""

from __future__ import annotations

import os
import platform
import sys

__all__ = ["collect_env_info"]


def _version(module_name: str) -> str:
    try:
        module = __import__(module_name)
    except ImportError:
        return "not installed"
    return getattr(module, "__version__", "unknown")


def collect_env_info() -> str:
    """Python, torch, torchvision, CUDA, hydra and omegaconf versions, CPU count, as aligned lines."""
    import torch

    rows = [
        ("python", sys.version.split()[0]),
        ("platform", platform.platform()),
        ("cpu count", str(os.cpu_count())),
        ("torch", torch.__version__),
        ("torchvision", _version("torchvision")),
        ("cuda available", str(torch.cuda.is_available())),
        ("cuda devices", str(torch.cuda.device_count())),
        ("hydra", _version("hydra")),
        ("omegaconf", _version("omegaconf")),
        ("lazytrain", _version("lazytrain")),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
