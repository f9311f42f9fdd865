"""Engine overhead: a bare PyTorch loop vs SimpleTrainer with the default hooks, same model and data.

    python scripts/benchmark_trainer.py --iters 300 --repeats 5

The trainer and hooks come from ``recipes/train.py`` exactly as a run builds them (timer, LR schedule,
periodic checkpointer, metric writers: console, metrics.json, TensorBoard), minus ``eval`` (no test set).
Both loops are timed over the same steady-state window (after warm-up, up to the second-to-last
iteration, including every periodic write inside it); the one-time end of training (``model_final`` and
the last writes) is reported separately. Repeats alternate bare/trainer so machine load hits both alike.
Prints a markdown table; the goal is <= 2% overhead at ~10 ms/iteration.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from omegaconf import OmegaConf

from lazytrain.config import LazyConfig, instantiate
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.hooks import CallbackHook

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


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


def batches():
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(128, 256, generator=g), torch.randn(128, generator=g)) for _ in range(16)]
    while True:
        yield from data


def bare_loop(model, optimizer, iters: int, warmup: int) -> tuple[float, float]:
    """Seconds per iteration in the window [warmup, iters - 1), and total seconds."""
    stream = batches()
    start = time.perf_counter()
    for iteration in range(iters):
        if iteration == warmup:
            window_start = time.perf_counter()
        if iteration == iters - 1:
            window_end = time.perf_counter()
        losses = model(next(stream))
        total = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
    return (window_end - window_start) / (iters - 1 - warmup), time.perf_counter() - start


def default_run_config(output_dir: str, iters: int):
    train = LazyConfig.load(os.path.join(RECIPES, "train.py")).train
    lr_multiplier = LazyConfig.load(os.path.join(RECIPES, "schedules.py")).lr_multiplier
    cfg = OmegaConf.create({"train": train, "lr_multiplier": lr_multiplier})
    LazyConfig.apply_overrides(
        cfg,
        [
            f"train.output_dir={output_dir}",
            f"train.max_iter={iters}",
            "train.device=cpu",
            "~train.hooks.eval",
        ],
    )
    return cfg


def trainer_loop(model, optimizer, iters: int, warmup: int, output_dir: str) -> tuple[float, float]:
    """Same window as `bare_loop`, measured by hooks placed first and last (so all hook work is inside)."""
    cfg = default_run_config(output_dir, iters)
    trainer = instantiate(cfg.train.trainer, model=model, data_loader=batches(), optimizer=optimizer)
    trainer.checkpointer = Checkpointer(model, output_dir, optimizer=optimizer, trainer=trainer)
    marks = {}

    def mark_start(t):
        if t.iter == warmup:
            marks["start"] = time.perf_counter()

    def mark_end(t):
        if t.iter == iters - 2:
            marks["end"] = time.perf_counter()

    hooks = {"bench_start": CallbackHook(before_step=mark_start), **instantiate(cfg.train.hooks)}
    hooks["bench_end"] = CallbackHook(after_step=mark_end)
    trainer.register_hooks(hooks)
    start = time.perf_counter()
    trainer.train(0, iters)
    return (marks["end"] - marks["start"]) / (iters - 1 - warmup), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    window = {"bare": [], "trainer": []}
    total = {"bare": [], "trainer": []}
    for repeat in range(args.repeats):
        for name in ("bare", "trainer") if repeat % 2 == 0 else ("trainer", "bare"):
            torch.manual_seed(repeat)
            model = MLP(args.width)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if name == "bare":
                seconds = bare_loop(model, optimizer, args.iters, args.warmup)
            else:
                with tempfile.TemporaryDirectory() as output_dir:
                    seconds = trainer_loop(model, optimizer, args.iters, args.warmup, output_dir)
            window[name].append(seconds[0])
            total[name].append(seconds[1])
    bare, wrapped = statistics.median(window["bare"]), statistics.median(window["trainer"])
    ratios = sorted(t / b for t, b in zip(window["trainer"], window["bare"]))
    end_cost = statistics.median(
        t - w * (args.iters - 1 - args.warmup) for t, w in zip(total["trainer"], window["trainer"])
    )
    end_bare = statistics.median(
        t - w * (args.iters - 1 - args.warmup) for t, w in zip(total["bare"], window["bare"])
    )
    print(f"| loop | ms / iteration (median of {args.repeats}, iterations {args.warmup}..{args.iters - 2}) |")
    print("|---|---|")
    print(f"| bare PyTorch | {bare * 1000:.2f} |")
    print(f"| SimpleTrainer + default hooks | {wrapped * 1000:.2f} |")
    print(f"| overhead (ratio of medians) | {100 * (wrapped / bare - 1):+.1f}% |")
    print(
        f"| overhead per repeat (min / max) | {100 * (ratios[0] - 1):+.1f}% / {100 * (ratios[-1] - 1):+.1f}% |"
    )
    print(
        f"\nOutside the window: warm-up + end of training take {end_bare:.2f} s bare and {end_cost:.2f} s with the "
        "trainer (model_final.pth, last writes, writer setup)."
    )


if __name__ == "__main__":
    main()
