"""`Checkpointer`: save and load model + checkpointables, atomically, with safe (weights-only) loading.

Files: ``<save_dir>/<name>.pth`` and ``<save_dir>/last_checkpoint`` (the basename of the newest one, read by
`get_last_checkpoint`).
A write goes to a temporary file in the same directory, is fsynced and renamed into place; only then is
``last_checkpoint`` replaced the same way, so a process killed at any moment leaves a loadable newest
checkpoint. Loading uses ``torch.load(weights_only=True)``; a file that needs arbitrary unpickling is
refused unless ``allow_unsafe=True`` (for files you trust).

With an EMA of the weights (``model_ema``, `lazytrain.engine.ema`), ``model`` holds the EMA weights (what
evaluation measured; what loading weights only gives: predict, export, ``train.init_checkpoint``), and
``training_model`` the trained weights with ``ema`` the average's counters (what a full load, a resumed run,
restores).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from lazytrain.engine.batch_norm import averaged_batch_norm_statistics
from lazytrain.engine.optimizer import load_optimizer_state
from lazytrain.utils import comm

# `Checkpointer.save` calls `atomic_write` through this module's name, so replacing
# ``checkpoint.atomic_write`` reaches it (the recipe kill/resume tests do, tests/conf/interruptions.py).
from lazytrain.utils.file_io import PathManager, atomic_write, load_torch_file

if TYPE_CHECKING:
    from lazytrain.engine.ema import ModelEMA

__all__ = ["Checkpointer", "LoadReport", "get_last_checkpoint", "load_model_state"]

logger = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What a non-strict model load did not match."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = []
        if self.shape_mismatched:
            lines.append("skipped (shape mismatch, checkpoint vs model):")
            lines += [f"  {k}: {tuple(a)} vs {tuple(b)}" for k, a, b in self.shape_mismatched]
        if self.missing:
            lines.append(f"missing in checkpoint ({len(self.missing)}): " + ", ".join(self.missing))
        if self.unexpected:
            lines.append(f"unexpected in checkpoint ({len(self.unexpected)}): " + ", ".join(self.unexpected))
        return "\n".join(lines) or "all keys matched"


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> LoadReport:
    """Load `state` into `model` non-strictly: ``module.`` prefixes removed, shape mismatches skipped.

    Works both ways round: a checkpoint saved from a DDP-wrapped model (keys ``module.*``) loads into a plain
    model, and a plain checkpoint loads into a wrapped model (the wrapper is looked through).

    Returns:
        A `LoadReport` of missing, unexpected and shape-mismatched keys (also logged).
    """
    model = comm.unwrap_model(model)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    own = model.state_dict()
    report = LoadReport()
    filtered = {}
    for key, value in state.items():
        if key in own and isinstance(value, torch.Tensor) and own[key].shape != value.shape:
            report.shape_mismatched.append((key, tuple(value.shape), tuple(own[key].shape)))
        else:
            filtered[key] = value
    result = model.load_state_dict(filtered, strict=False)
    mismatched = {k for k, _, _ in report.shape_mismatched}
    report.missing = [k for k in result.missing_keys if k not in mismatched]
    report.unexpected = list(result.unexpected_keys)
    if report.missing or report.unexpected or report.shape_mismatched:
        logger.warning("model weights loaded non-strictly:\n%s", report)
    return report


def get_last_checkpoint(save_dir: str) -> str | None:
    """Path of the newest complete checkpoint in `save_dir`, the file its ``last_checkpoint`` names; None when
    there is none (no `save_dir`, no ``last_checkpoint``, or one that cannot be read)."""
    if not save_dir:
        return None
    try:
        with open(os.path.join(save_dir, "last_checkpoint")) as f:
            return os.path.join(save_dir, f.read().strip())
    except OSError:
        return None


def _remove_stale_temporary_files(directory: str) -> None:
    """Delete what writes killed before their rename left behind (`atomic_write`'s ``.<name>.tmp<pid>``, a
    checkpoint's size each); only rank 0 of one run writes into a directory, and its own write has just
    completed."""
    for name in os.listdir(directory):
        if name.startswith(".") and ".pth.tmp" in name:
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


class Checkpointer:
    """Save/load a model and other objects with ``state_dict``/``load_state_dict``.

    A training checkpoint written by the default program holds ``model``, ``optimizer``, ``trainer``
    (iteration, hook states, grad scaler, and per rank the data-loader state and RNG states) and
    ``iteration``; everything loads with ``torch.load(weights_only=True)``.

    With `model_ema`, ``model`` is the EMA's weights, and ``training_model`` and ``ema`` are added (see the
    module docstring).

    Args:
        model: the model (DDP-wrapped or not; the saved keys never carry ``module.``).
        save_dir: local directory of checkpoints and ``last_checkpoint`` ("" disables saving).
        allow_unsafe: allow loading files that need arbitrary unpickling (only for files you trust).
        model_ema: the run's `ModelEMA` (``train.ema.enabled``), or None.
        **checkpointables: e.g. ``optimizer=..., trainer=...``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        save_dir: str = "",
        *,
        allow_unsafe: bool = False,
        model_ema: ModelEMA | None = None,
        **checkpointables: Any,
    ) -> None:
        self.model = model
        self.save_dir = save_dir
        self.allow_unsafe = allow_unsafe
        self.model_ema = model_ema
        self.checkpointables = checkpointables
        self.last_saved_iteration: int | None = None  # the ``iteration`` of the last `save`, on every rank

    def save(self, name: str, **extra: Any) -> str | None:
        """Write ``<save_dir>/<name>.pth`` (all ranks must call: trainer state is gathered; rank 0 writes).

        The saved BatchNorm running statistics are their average over the ranks
        (`averaged_batch_norm_statistics`); the model keeps each rank's own."""
        data = self._model_entries()
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(extra)
        self.last_saved_iteration = extra.get("iteration")
        if not self.save_dir or not comm.is_main_process():
            return None
        path = os.path.join(self.save_dir, f"{name}.pth")
        try:
            os.makedirs(self.save_dir, exist_ok=True)
            atomic_write(path, lambda f: torch.save(data, f))
            atomic_write(
                os.path.join(self.save_dir, "last_checkpoint"), lambda f: f.write(f"{name}.pth".encode())
            )
        except OSError as e:
            raise OSError(
                f"Checkpointer: could not write checkpoint {path}: {e}. Previous checkpoints are intact; free "
                "disk space or point train.output_dir to a writable directory."
            ) from e
        logger.info("Saved checkpoint to %s", path)
        _remove_stale_temporary_files(self.save_dir)
        return path

    def _model_entries(self) -> dict[str, Any]:
        """``model`` (and with an EMA ``training_model`` and ``ema``), BatchNorm statistics averaged over the
        ranks."""
        weights = {**comm.unwrap_model(self.model).state_dict(), **averaged_batch_norm_statistics(self.model)}
        if self.model_ema is None:
            return {"model": weights}
        ema = self.model_ema.state_dict()
        averaged = {**ema.pop("averaged_state"), **self.model_ema.averaged_batch_norm_statistics()}
        return {"model": averaged, "training_model": weights, "ema": ema}

    def has_checkpoint(self) -> bool:
        """Whether `save_dir` names a newest checkpoint (`get_last_checkpoint`)."""
        return get_last_checkpoint(self.save_dir) is not None

    def get_checkpoint_file(self) -> str:
        """Path of the newest complete checkpoint ("" when there is none; see `get_last_checkpoint`)."""
        return get_last_checkpoint(self.save_dir) or ""

    def get_all_checkpoint_files(self) -> list[str]:
        if not os.path.isdir(self.save_dir):
            return []
        return sorted(os.path.join(self.save_dir, f) for f in os.listdir(self.save_dir) if f.endswith(".pth"))

    def read(self, path: str) -> dict:
        """Read a checkpoint file safely (weights only unless `allow_unsafe`)."""
        local = PathManager.get_local_path(path)
        if not os.path.isfile(local):
            raise FileNotFoundError(
                f"Checkpointer: checkpoint not found: {path}. Check train.init_checkpoint / train.output_dir."
            )
        return load_torch_file(path, local, allow_unsafe=self.allow_unsafe, reader="Checkpointer")

    def load(self, path: str, checkpointables: list[str] | None = None) -> dict:
        """Load model weights (non-strictly, see `load_model_state`) and the named checkpointables.

        Args:
            path: a local path or an iopath URI.
            checkpointables: names to restore; None restores all, ``[]`` only the model (a checkpoint of a run
                with an EMA then gives its EMA weights; any other value its training weights and the EMA).

        Returns:
            The remaining items of the file (e.g. ``{"iteration": 99}``).
        """
        logger.info("Loading checkpoint from %s", path)
        data = self.read(path)
        if "model" not in data:  # a bare state dict (e.g. torchvision weights)
            data = {"model": data}
        self.last_report = load_model_state(self.model, self._pop_model_weights(data, checkpointables == []))
        names = self.checkpointables if checkpointables is None else checkpointables
        for key in names:
            if key in data and isinstance(self.checkpointables[key], torch.optim.Optimizer):
                load_optimizer_state(self.checkpointables[key], data.pop(key), self.model, source=path)
            elif key in data:
                self.checkpointables[key].load_state_dict(data.pop(key))
            else:
                logger.warning("Checkpointer: %s has no '%s' state; it is not restored.", path, key)
        return data

    def _pop_model_weights(self, data: dict, weights_only: bool) -> dict[str, torch.Tensor]:
        """The weights to load into the model, taking the model entries out of `data` (restoring the EMA from
        them on a full load)."""
        weights, training, ema = data.pop("model"), data.pop("training_model", None), data.pop("ema", None)
        if training is None or weights_only:
            if training is not None:
                logger.info("Checkpointer: loading the EMA weights (the run trained with train.ema).")
            elif self.model_ema is not None and not weights_only:
                logger.warning(
                    "Checkpointer: the checkpoint has no EMA of the weights; the EMA starts from its weights."
                )
            return weights
        if self.model_ema is not None:
            self.model_ema.load_state_dict({**(ema or {}), "averaged_state": weights})
        else:
            logger.warning(
                "Checkpointer: the checkpoint's EMA weights are not restored (train.ema.enabled is false): "
                "training continues from its training weights, without an EMA."
            )
        return training

    def resume_or_load(self, path: str, *, resume: bool = True) -> dict:
        """Resume from ``last_checkpoint`` (everything) when `resume` and one exists; else load only the
        model weights from `path` (if given)."""
        if resume and self.has_checkpoint():
            return self.load(self.get_checkpoint_file())
        if not path:
            return {}
        return self.load(path, checkpointables=[])
