"""The engine: the hook-driven trainer, standard hooks, checkpointing and the plots a run leaves.

Modules: `train_loop` (HookBase, TrainerBase, SimpleTrainer) and what its step uses: `step_agreement` (one
all-reduce per step: losses, non-finite flags, stop requests), `accumulation` (gradient accumulation: the batch
in chunks), `training_batches` (the loader's iterator), `rng_state` (the global generators' states); `hooks`
(the standard hooks, a module per kind), `checkpoint` (Checkpointer), `lr_schedule` (LR multipliers),
`optimizer` (param groups), `plot_writer` (curves.png, ap_by_frequency.png), `trackers` (MLflowTracker,
WandbTracker: experiment trackers as hooks; their libraries are optional extras).
The default program (default_setup, do_train, do_test, run) reads the whole config and lives in
`lazytrain.program.default`.

How a config declares the trainer and hooks (see ``recipes/train.py``): ``train.trainer =
L(SimpleTrainer)(...)`` and ``train.hooks`` a named mapping in run order. The default program injects
``model``, ``data_loader`` and ``optimizer`` into the trainer; hooks reach those and the checkpointer through
``self.trainer``.
"""

from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.hooks import (
    BestCheckpointer,
    CallbackHook,
    EvalHook,
    IterationTimer,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
    TorchMemoryStats,
    TorchProfiler,
)
from lazytrain.engine.lr_schedule import WarmupCosineMultiplier, WarmupMultiStepMultiplier
from lazytrain.engine.train_loop import HookBase, SimpleTrainer, TrainerBase

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "Checkpointer",
    "EvalHook",
    "HookBase",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "SimpleTrainer",
    "TorchMemoryStats",
    "TorchProfiler",
    "TrainerBase",
    "WarmupCosineMultiplier",
    "WarmupMultiStepMultiplier",
]
