"""When a periodic hook acts: after the step that ends each period (steps ``period - 1``, ``2 * period - 1``, ...).

Every periodic hook asks the same question, so that hooks given the same period (`EvalHook` and
`BestCheckpointer`, say) act after the same steps.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_period_end"]


def is_period_end(trainer: Any, period: int) -> bool:
    """Whether the step that just ran (``trainer.iter``) ends a period of `period` steps; never when
    ``period <= 0`` (a hook switched off)."""
    return period > 0 and (trainer.iter + 1) % period == 0
