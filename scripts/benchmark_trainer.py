"""Engine overhead: a bare PyTorch loop vs SimpleTrainer with the default hooks, same model and data.

    python scripts/benchmark_trainer.py --iters 300 --repeats 3

Prints a table with seconds per iteration of both and the overhead ratio (goal: <= 2% at ~10 ms/iter).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from lazytrain.engine import hooks
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.lr_schedule import WarmupMultiStepMultiplier
from lazytrain.engine.train_loop import SimpleTrainer


class MLP(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(256, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )

    def forward(self, batch):
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)}


def batches(n: int):
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(128, 256, generator=g), torch.randn(128, generator=g)) for _ in range(16)]
    while True:
        yield from data


def bare_loop(model, optimizer, iters: int) -> float:
    stream = batches(iters)
    start = time.perf_counter()
    for _ in range(iters):
        losses = model(next(stream))
        total = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
    return (time.perf_counter() - start) / iters


def trainer_loop(model, optimizer, iters: int, output_dir: str) -> float:
    trainer = SimpleTrainer(model, batches(iters), optimizer)
    trainer.checkpointer = Checkpointer(model, output_dir, optimizer=optimizer, trainer=trainer)
    trainer.register_hooks(
        {
            "timer": hooks.IterationTimer(),
            "lr_scheduler": hooks.LRScheduler(WarmupMultiStepMultiplier([iters // 2], warmup_iters=10)),
            "checkpointer": hooks.PeriodicCheckpointer(period=10**9),  # only model_final, outside the timing
            "writer": hooks.PeriodicWriter(output_dir, period=20, tensorboard=False),
        }
    )
    start = time.perf_counter()
    trainer.train(0, iters)
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(2)
    bare, wrapped = [], []
    for repeat in range(args.repeats):
        for name, results in (("bare", bare), ("trainer", wrapped)):
            torch.manual_seed(repeat)
            model = MLP(args.width)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            if name == "bare":
                results.append(bare_loop(model, optimizer, args.iters))
            else:
                with tempfile.TemporaryDirectory() as output_dir:
                    results.append(trainer_loop(model, optimizer, args.iters, output_dir))
    b, t = statistics.median(bare), statistics.median(wrapped)
    print(f"| loop | ms / iteration (median of {args.repeats}) |")
    print("|---|---|")
    print(f"| bare PyTorch | {b * 1000:.2f} |")
    print(f"| SimpleTrainer + default hooks | {t * 1000:.2f} |")
    print(f"| overhead | {100 * (t / b - 1):+.1f}% |")


if __name__ == "__main__":
    main()
