"""`CallbackHook`: plain functions ``fn(trainer)`` run at chosen moments, for what needs no hook class."""

from __future__ import annotations

from collections.abc import Callable

from lazytrain.engine.train_loop import HookBase

__all__ = ["CallbackHook"]


class CallbackHook(HookBase):
    """Run plain functions ``fn(trainer)`` at chosen moments.

    In a config, give a function by path: ``L(CallbackHook)(after_step=L(functools.partial)(
    L(locate)("my_module.fn"), ...))`` or any ``_partial_: true`` node.
    """

    def __init__(
        self,
        *,
        before_train: Callable | None = None,
        after_train: Callable | None = None,
        before_step: Callable | None = None,
        after_backward: Callable | None = None,
        after_step: Callable | None = None,
    ) -> None:
        self._callbacks = {
            "before_train": before_train,
            "after_train": after_train,
            "before_step": before_step,
            "after_backward": after_backward,
            "after_step": after_step,
        }

    def _run_callback(self, moment: str) -> None:
        if self._callbacks[moment] is not None:
            self._callbacks[moment](self.trainer)

    def before_train(self) -> None:
        self._run_callback("before_train")

    def after_train(self) -> None:
        self._run_callback("after_train")

    def before_step(self) -> None:
        self._run_callback("before_step")

    def after_backward(self) -> None:
        self._run_callback("after_backward")

    def after_step(self) -> None:
        self._run_callback("after_step")
