"""Where one training step of a config's model goes: forward parts, backward, optimizer (wall time), and the
costliest operators (torch.profiler).

    python scripts/profile_step.py conf/rfs_maskrcnn_demo.py --iters 20
    python scripts/profile_step.py conf/rfs_maskrcnn_demo.py model.roi_heads.batch_size_per_image=64
    python scripts/profile_step.py conf/rfs_maskrcnn_demo.py --weights RUN/model_final.pth   # a trained step

Batches come from the config's train loader and are fetched before timing, so data loading is excluded.
A fresh model's step is cheaper than a trained one's (once the RPN finds the objects, the mask branch runs on
up to 4 x 32 positive RoIs: 446-473 vs 569-586 ms per demo step, docs/benchmarks.md); ``--weights`` times the
step from a checkpoint, at a learning rate of 1e-6 so the weights stay where they are.
Parts are timed with forward hooks on the model's direct children (``backbone``, ``rpn``, ``roi_heads``);
what remains of the forward pass (normalisation, padding, loss sums) is ``other forward``. Prints markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# As `python -m lazytrain` runs: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from lazytrain.config import LazyConfig, instantiate  # noqa: E402
from lazytrain.engine.checkpoint import Checkpointer  # noqa: E402
from lazytrain.program.default import _build_optimizer, seed_all_rng  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", help="a LazyConfig .py or saved config.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--iters", type=int, default=20, help="timed steps (after 3 warm-up steps)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--top", type=int, default=12, help="operators listed from the profiler")
    parser.add_argument("--weights", default=None, help="model weights to start from (a run's .pth)")
    return parser.parse_args(argv)


class PartTimer:
    """Wall time of each direct child module's forward, accumulated over the steps."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds: dict[str, float] = {}
        self._starts: dict[str, float] = {}
        for name, child in model.named_children():
            if name != "transform":
                child.register_forward_pre_hook(self._start(name))
                child.register_forward_hook(self._stop(name))

    def _start(self, name: str):
        def hook(module, args):
            self._starts[name] = time.perf_counter()

        return hook

    def _stop(self, name: str):
        def hook(module, args, output):
            elapsed = time.perf_counter() - self._starts.pop(name)
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed

        return hook


def timed_steps(model, optimizer, batches, timer: PartTimer | None) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "step": []}
    for batch in batches:
        start = time.perf_counter()
        losses = model(batch)
        loss = sum(losses.values())
        forward_end = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        backward_end = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        times["forward"].append(forward_end - start)
        times["backward"].append(backward_end - forward_end)
        times["optimizer"].append(end - backward_end)
        times["step"].append(end - start)
    return times


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = LazyConfig.load(args.config)
    LazyConfig.apply_overrides(cfg, [*args.overrides, "train.device=cpu", "dataloader.train.num_workers=0"])
    seed_all_rng(0)
    model = instantiate(cfg.model).train()
    optimizer = _build_optimizer(cfg, model)
    if args.weights:
        Checkpointer(model).load(args.weights, checkpointables=[])
        for group in optimizer.param_groups:
            group["lr"] = 1e-6
    loader = iter(instantiate(cfg.dataloader.train))
    batches = [next(loader) for _ in range(args.iters + 3)]
    timed_steps(model, optimizer, batches[:3], None)  # warm-up
    timer = PartTimer(model)
    times = timed_steps(model, optimizer, batches[3:], timer)
    step = statistics.median(times["step"])
    start = f", from {args.weights}" if args.weights else ""
    print(
        f"\n{args.config} {' '.join(args.overrides)}: {args.iters} steps, {torch.get_num_threads()} threads{start}"
    )
    print("| part | ms / step (mean) | share of the step |\n|---|---|---|")
    mean_step = statistics.fmean(times["step"])
    forward_parts = sum(timer.seconds.values()) / args.iters
    rows = [(f"forward: {name}", seconds / args.iters) for name, seconds in timer.seconds.items()]
    rows.append(("forward: other", statistics.fmean(times["forward"]) - forward_parts))
    rows += [(part, statistics.fmean(times[part])) for part in ("backward", "optimizer")]
    for name, seconds in rows:
        print(f"| {name} | {seconds * 1000:.0f} | {seconds / mean_step:.0%} |")
    print(f"| **step** | {mean_step * 1000:.0f} (median {step * 1000:.0f}) | 100% |")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        timed_steps(model, optimizer, batches[3:6], None)
    print("\nTop operators over 3 steps (self CPU time):\n")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
