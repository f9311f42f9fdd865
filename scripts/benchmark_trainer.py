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

# As `python -m lazytrain` runs: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from lazytrain.config import LazyConfig, instantiate  # noqa: E402
from lazytrain.engine.checkpoint import Checkpointer  # noqa: E402
from lazytrain.engine.hooks import CallbackHook  # noqa: E402

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


def bare_loop(model, optimizer, iters: int, warmup: int) -> tuple[float, float, float]:
    """Seconds per iteration in the window [warmup, iters - 1), total seconds, CPU seconds per iteration."""
    stream = batches()
    start = time.perf_counter()
    for iteration in range(iters):
        if iteration == warmup:
            window_start, cpu_start = time.perf_counter(), time.process_time()
        if iteration == iters - 1:
            window_end, cpu_end = time.perf_counter(), time.process_time()
        losses = model(next(stream))
        total = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
    steps = iters - 1 - warmup
    return (window_end - window_start) / steps, time.perf_counter() - start, (cpu_end - cpu_start) / steps


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


def trainer_loop(model, optimizer, iters: int, warmup: int, output_dir: str) -> tuple[float, float, float]:
    """Same window as `bare_loop`, measured by hooks placed first and last (so all hook work is inside)."""
    cfg = default_run_config(output_dir, iters)
    trainer = instantiate(cfg.train.trainer, model=model, data_loader=batches(), optimizer=optimizer)
    trainer.checkpointer = Checkpointer(model, output_dir, optimizer=optimizer, trainer=trainer)
    marks = {}

    def mark_start(t):
        if t.iter == warmup:
            marks["start"], marks["cpu_start"] = time.perf_counter(), time.process_time()

    def mark_end(t):
        if t.iter == iters - 2:
            marks["end"], marks["cpu_end"] = time.perf_counter(), time.process_time()

    hooks = {"bench_start": CallbackHook(before_step=mark_start), **instantiate(cfg.train.hooks)}
    hooks["bench_end"] = CallbackHook(after_step=mark_end)
    trainer.register_hooks(hooks)
    start = time.perf_counter()
    trainer.train(0, iters)
    steps = iters - 1 - warmup
    return (
        (marks["end"] - marks["start"]) / steps,
        time.perf_counter() - start,
        (marks["cpu_end"] - marks["cpu_start"]) / steps,
    )


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
    cpu = {"bare": [], "trainer": []}
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
            cpu[name].append(seconds[2])
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
    # CPU time of this process (all its threads) does not count time the machine gave to other processes,
    # so it is steadier than wall time on a shared or virtualised machine.
    cpu_bare, cpu_wrapped = statistics.median(cpu["bare"]), statistics.median(cpu["trainer"])
    print(
        f"| CPU ms / iteration, bare / SimpleTrainer (medians) | {cpu_bare * 1000:.2f} / {cpu_wrapped * 1000:.2f} |"
    )
    print(f"| overhead in CPU time (ratio of medians) | {100 * (cpu_wrapped / cpu_bare - 1):+.1f}% |")
    print(
        f"\nOutside the window: warm-up + end of training take {end_bare:.2f} s bare and {end_cost:.2f} s with the "
        "trainer (model_final.pth, last writes, writer setup)."
    )


if __name__ == "__main__":
    main()
