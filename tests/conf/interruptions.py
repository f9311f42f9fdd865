"""Ways to interrupt a real run from inside, at exact moments, for the recipe kill/resume tests.

Each function is a `CallbackHook` callback ``fn(trainer, **kwargs)`` named by path on the command line. Kills
hit the whole process group (the launcher and every rank), as when a node dies or SLURM's grace period ends;
the tests start each run in its own session. Only rank 0 acts, so each kill happens once.
"""

from __future__ import annotations

import io
import os
import signal
import time

from lazytrain.engine import checkpoint
from lazytrain.utils import comm


def _kill_job(signum: int = signal.SIGKILL) -> None:
    os.killpg(os.getpgrp(), signum)


def kill_during_step(trainer, iteration: int, signum: int = signal.SIGKILL) -> None:
    """``after_backward``: `signum` (SIGKILL by default) between the backward pass and the optimizer step of
    `iteration`."""
    if trainer.iter == iteration and comm.is_main_process():
        _kill_job(signum)


def kill_during_checkpoint_write(trainer, iteration: int) -> None:
    """``before_train``: SIGKILL after half of the bytes of ``model_<iteration>.pth`` are in its temporary file."""
    if not comm.is_main_process():
        return
    atomic_write = checkpoint.atomic_write

    def write_half_then_die(path: str, write) -> None:
        if not path.endswith(f"model_{iteration:07d}.pth"):
            atomic_write(path, write)
            return
        buffer = io.BytesIO()
        write(buffer)
        data = buffer.getvalue()
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        _kill_job()

    checkpoint.atomic_write = write_half_then_die


def interrupt_final_evaluation(trainer, signum: int, seconds_per_image: float = 0.0) -> None:
    """``before_train``: during the final evaluation, send `signum` to the job at the second image of rank 0 and
    make every image from the second on take `seconds_per_image` more; the moment the signal was sent goes to
    ``<output_dir>/signal_sent``."""
    images = [0]

    def before_forward(module, inputs) -> None:
        if module.training or trainer.iter < trainer.max_iter:
            return
        images[0] += 1
        if images[0] < 2:
            return
        if images[0] == 2 and comm.is_main_process():
            with open(os.path.join(trainer.checkpointer.save_dir, "signal_sent"), "w") as f:
                f.write(repr(time.time()))
            _kill_job(signum)
        time.sleep(seconds_per_image)

    # The model itself, not its DDP wrapper: evaluation runs the unwrapped model.
    getattr(trainer.model, "module", trainer.model).register_forward_pre_hook(before_forward)
