"""A toy regression task for engine tests: importable targets, deterministic data, resumable loader."""

from __future__ import annotations

import os
import time

import torch

from lazytrain.engine.train_loop import HookBase, SimpleTrainer
from lazytrain.evaluation import DatasetEvaluator
from lazytrain.utils import comm

CONSTRUCTIONS: dict[str, int] = {}


def _count(name: str) -> None:
    CONSTRUCTIONS[name] = CONSTRUCTIONS.get(name, 0) + 1


class ToyRegressor(torch.nn.Module):
    """y = w.x + b with an MSE loss; returns a loss dict in training mode."""

    def __init__(self, dim: int = 4, nan_at_call: int = -1) -> None:
        super().__init__()
        _count("model")
        self.linear = torch.nn.Linear(dim, 1)
        self.norm = torch.nn.BatchNorm1d(dim)
        self.calls = 0
        self.nan_at_call = nan_at_call

    def forward(self, batch):
        x, y = batch
        prediction = self.linear(self.norm(x)).squeeze(1)
        if not self.training:
            return prediction
        self.calls += 1
        loss = torch.nn.functional.mse_loss(prediction, y)
        if self.calls == self.nan_at_call:
            loss = loss * float("nan")
        return {"loss_mse": loss, "loss_zero": 0.0 * loss}


class ToyLoader:
    """An infinite stream of batches; batch k is a pure function of (seed, k) plus noise from torch's
    global RNG (so RNG restore matters), with the resumable-data protocol."""

    def __init__(self, batch_size: int = 8, dim: int = 4, seed: int = 0) -> None:
        _count("loader")
        self.batch_size, self.dim, self.seed = batch_size, dim, seed
        self.position = 0
        self.true_w = torch.arange(1.0, dim + 1)

    def __iter__(self):
        # Like torch's DataLoader, which draws its workers' base seed from the global RNG in iter().
        torch.empty((), dtype=torch.int64).random_()
        return self._batches()

    def _batches(self):
        while True:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.position)
            x = torch.randn(self.batch_size, self.dim, generator=g)
            y = x @ self.true_w + 0.01 * torch.randn(self.batch_size)
            self.position += 1
            yield x, y

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def make_sgd(params, lr: float = 0.05):
    _count("optimizer")
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


class RecordingHook(HookBase):
    """Records (moment, iteration) for every call."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.events: list[tuple[str, int]] = []
        RecordingHook.last = self

    def before_train(self):
        self.events.append(("before_train", self.trainer.iter))

    def before_step(self):
        self.events.append(("before_step", self.trainer.iter))

    def after_backward(self):
        self.events.append(("after_backward", self.trainer.iter))

    def after_step(self):
        self.events.append(("after_step", self.trainer.iter))

    def after_train(self):
        self.events.append(("after_train", self.trainer.iter))


class MarkerTrainer(SimpleTrainer):
    """A user subclass: counts its steps."""

    def run_step(self):
        self.marker_steps = getattr(self, "marker_steps", 0) + 1
        super().run_step()


def make_test_loader(num_batches: int = 3, dim: int = 4) -> list:
    """A finite list of (x, y) batches for evaluation."""
    _count("test_loader")
    g = torch.Generator().manual_seed(12345)
    true_w = torch.arange(1.0, dim + 1)
    batches = []
    for _ in range(num_batches):
        x = torch.randn(8, dim, generator=g)
        batches.append((x, x @ true_w))
    return batches


class ToyEvaluator(DatasetEvaluator):
    """Evaluator protocol for toy runs: "AP" = 100 - mean absolute error, on the main process only.

    It also draws from torch's global RNG, as real evaluation code may (EvalHook must shield training).
    """

    def __init__(self, sleep_seconds: float = 0.0) -> None:
        _count("evaluator")
        self.sleep_seconds = sleep_seconds  # the main process evaluates this long alone (others wait)
        self.reset()

    def reset(self):
        self.errors = []

    def process(self, inputs, outputs):
        _, y = inputs
        self.errors.append(float((outputs - y).abs().mean()))
        torch.rand(3)

    def evaluate(self):
        if comm.get_rank() != 0:
            return {}
        time.sleep(self.sleep_seconds)
        mae = sum(self.errors) / len(self.errors)
        return {"toy": {"AP": 100.0 - mae, "MAE": mae}}


def kill_self_at(trainer, iteration: int) -> None:
    if trainer.iter == iteration:
        os.kill(os.getpid(), 9)


def kill_rank_before_any_restart(trainer, iteration: int, rank: int) -> None:
    """SIGKILL rank `rank` after step `iteration`, in the first run of a torchrun job only (torchrun's restarted
    workers have ``TORCHELASTIC_RESTART_COUNT`` >= 1)."""
    first_run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if trainer.iter == iteration and comm.get_rank() == rank and first_run:
        os.kill(os.getpid(), 9)


class RandomDrawingHook(HookBase):
    """Draws from every global RNG in before_train (setup code may do so); resume must not be affected."""

    def before_train(self):
        import random

        import numpy as np

        torch.rand(5)
        np.random.rand(5)
        random.random()


class RankWeightsHook(HookBase):
    """Saves this rank's model weights and eval results after training (for the two-process test)."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir

    def after_train(self):
        model = getattr(self.trainer.model, "module", self.trainer.model)
        state = {"model": model.state_dict(), "results": self.trainer.last_eval_results}
        torch.save(state, os.path.join(self.output_dir, f"rank{comm.get_rank()}.pth"))


def ddp_main(cfg_container: dict) -> None:
    """Per-rank program of the two-process test."""
    from omegaconf import OmegaConf

    from lazytrain.program.default import run

    torch.set_num_threads(1)
    run(OmegaConf.create(cfg_container))


def send_signal_at(
    trainer, iteration: int, signum: int, times: int = 1, to_parent: bool = False, interval: float = 0.0
) -> None:
    """After step `iteration`, send `signum` (`times` times, `interval` seconds apart) to this process, or on
    rank 1 to the process that launched the ranks."""
    if trainer.iter != iteration:
        return
    if to_parent and comm.get_rank() != 1:
        return
    for sent in range(times):
        if sent:
            time.sleep(interval)
        os.kill(_launching_pid() if to_parent else os.getpid(), signum)


def _launching_pid() -> int:
    """The process that launched this rank: the parent of the rank server (multiprocessing's forkserver) that
    forked it."""
    server = os.getppid()
    with open(f"/proc/{server}/cmdline", "rb") as f:
        assert b"forkserver" in f.read(), "ranks are expected to be forked from the rank server"
    with open(f"/proc/{server}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the state: the parent's pid


def sleep_each_step(trainer, seconds: float) -> None:
    """Make the toy run last long enough for signals from outside to land at random points."""
    time.sleep(seconds)


class EvaluatorFailingOnRankOne(ToyEvaluator):
    """Records each rank's pid in the output dir, then raises on rank 1 while evaluating."""

    def __init__(self, output_dir: str) -> None:
        super().__init__()
        self.output_dir = output_dir

    def process(self, inputs, outputs):
        with open(os.path.join(self.output_dir, f"pid{comm.get_rank()}"), "w") as f:
            f.write(str(os.getpid()))
        if comm.get_rank() == 1:
            raise RuntimeError("deliberate evaluation failure on rank 1")
        super().process(inputs, outputs)


def signal_during_evaluation(trainer, iteration: int, signum: int) -> None:
    """``before_train``: send `signum` to this process at the first image of the evaluation of `iteration`."""

    def before_forward(module, inputs) -> None:
        if not module.training and trainer.iter == iteration and not sent:
            sent.append(True)
            os.kill(os.getpid(), signum)

    sent: list[bool] = []
    # The model itself, not its DDP wrapper: evaluation runs the unwrapped model.
    getattr(trainer.model, "module", trainer.model).register_forward_pre_hook(before_forward)


def fail_at(trainer, iteration: int) -> None:
    """Raise after step `iteration` (one rank's own failure, e.g. a bug in a hook or bad data)."""
    if trainer.iter == iteration:
        raise RuntimeError(f"deliberate failure at iteration {iteration}")


def record_start_iteration(trainer, output_dir: str) -> None:
    """Write the iteration this rank starts (or resumes) from into ``start_iter.rank<R>``."""
    with open(os.path.join(output_dir, f"start_iter.rank{comm.get_rank()}"), "w") as f:
        f.write(str(trainer.start_iter))


def ddp_main_with_lagging_file_system(cfg_container: dict) -> None:
    """`ddp_main`, but rank 1 reads an older ``last_checkpoint`` (a shared file system that lags behind)."""
    from lazytrain.engine.checkpoint import Checkpointer

    if comm.get_rank() == 1:
        Checkpointer.get_checkpoint_file = lambda self: os.path.join(self.save_dir, "model_0000001.pth")
    ddp_main(cfg_container)


class MeanLossMLP(torch.nn.Module):
    """A model without BatchNorm whose losses are means over the batch (gradient accumulation is exact)."""

    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def forward(self, batch):
        x, y = batch
        prediction = self.net(x).squeeze(1)
        return {
            "loss_mse": torch.nn.functional.mse_loss(prediction, y),
            "loss_l1": torch.nn.functional.l1_loss(prediction, y),
        }


def regression_batch(size: int = 8, dim: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, dim, generator=g)
    return x, x @ torch.arange(1.0, dim + 1) + torch.randn(size, generator=g)


def accumulated_ddp_step(output_dir: str, images_per_forward: int) -> None:
    """One optimizer step of `MeanLossMLP` under DDP with gradient accumulation; each rank takes its half of
    `regression_batch` and saves its gradients, weights and how many times DDP all-reduced gradients."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch.manual_seed(0)
    model = MeanLossMLP()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    reductions = []

    def counting_hook(state, bucket):
        reductions.append(1)
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_hook)
    x, y = regression_batch()
    share = len(x) // comm.get_world_size()
    rank = comm.get_rank()
    batch = (x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    trainer = SimpleTrainer(ddp, [batch], optimizer, images_per_forward=images_per_forward)
    trainer.train(0, 1)
    torch.save(
        {
            "grads": {name: p.grad for name, p in model.named_parameters()},
            "weights": model.state_dict(),
            "reductions": len(reductions),
            "loss_mse": trainer.storage.history("loss_mse").latest() if rank == 0 else None,
        },
        os.path.join(output_dir, f"rank{rank}.pth"),
    )
