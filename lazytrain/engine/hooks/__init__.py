"""The standard hooks. Each is configured with plain values (so hook configs stay saveable and overridable)
and reaches the objects the program built through its trainer: ``self.trainer.model``, ``.optimizer``,
``.data_loader``, ``.checkpointer``, ``.test_function``, ``.storage``.

Recipes list them as a named mapping in run order (``train.hooks.timer``, ``train.hooks.lr_scheduler``,
``train.hooks.checkpointer``, ``train.hooks.eval``, ``train.hooks.writer``), so ``~train.hooks.eval`` removes
one and ``train.hooks.checkpointer.period=1000`` tunes one. Order matters in two places: `EvalHook` before
`BestCheckpointer` (which reads its metrics) and before `PeriodicWriter` (so the final evaluation is written
to ``metrics.json``).

Hooks that save checkpoints call ``trainer.checkpointer.save`` on every rank (saving gathers per-rank state);
their decisions must therefore be the same on all ranks.

A module per kind of hook: `callback` (`CallbackHook`: plain functions), `timing` (`IterationTimer`),
`lr_scheduler` (`LRScheduler`), `checkpointing` (`PeriodicCheckpointer`, `BestCheckpointer`), `evaluation`
(`EvalHook`, `flatten_results`), `writers` (`PeriodicWriter`), `profiling` (`TorchProfiler`,
`TorchMemoryStats`); `period` says when a periodic hook acts. This package names the standard hooks, so a
config writes ``lazytrain.engine.hooks.EvalHook``. Hooks of other concerns live beside their concern
(`lazytrain.engine.ema.EMAHook`, `lazytrain.engine.plot_writer.PlotWriter`, the trackers).
"""

from lazytrain.engine.hooks.callback import CallbackHook
from lazytrain.engine.hooks.checkpointing import BestCheckpointer, PeriodicCheckpointer
from lazytrain.engine.hooks.evaluation import EvalHook
from lazytrain.engine.hooks.lr_scheduler import LRScheduler
from lazytrain.engine.hooks.profiling import TorchMemoryStats, TorchProfiler
from lazytrain.engine.hooks.timing import IterationTimer
from lazytrain.engine.hooks.writers import PeriodicWriter

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "EvalHook",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "TorchMemoryStats",
    "TorchProfiler",
]
