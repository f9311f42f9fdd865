"""Activation checkpointing (``model.backbone.grad_checkpointing``): peak memory and time of one training step of
the ViTDet-B recipe model (conf/maskrcnn_vitdet_b_rfs.py, random init) at 1024 px, with and without.

    python scripts/benchmark_grad_checkpointing.py                            # CPU, batch 1, 1024 px
    python scripts/benchmark_grad_checkpointing.py --device cuda --batch 2    # GPU, bf16 autocast (the recipe's)
    python scripts/benchmark_grad_checkpointing.py --size 256 --steps 1       # a quick look

Each setting runs in a fresh process (so one setting's freed memory cannot hide the other's peak), which builds
the recipe's model (``key=value`` arguments override the config, e.g. ``model.backbone.model_name=...``), makes
a synthetic batch of ``--batch`` images of ``--size`` squared with 3 boxes and masks each, and runs ``--steps``
training steps (forward, loss sum, backward, gradients zeroed; no optimizer, whose state is the same either way).
Peak memory is that of the first step above what was in use before it: on the CPU the growth of the resident
set's high-water mark (``VmHWM`` of /proc/self/status, restarted before the step through /proc/self/clear_refs),
on CUDA ``torch.cuda.max_memory_allocated`` minus the memory allocated before the step. The step time is the
median of the steps after the first (the first alone when ``--steps 1``), the device synchronised around each.
Autocast: bf16 on CUDA (the recipe's ``train.amp``), fp32 on the CPU (bf16 is emulated on CPUs without bf16
instructions); ``--amp on/off`` chooses. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO_ROOT, "conf", "maskrcnn_vitdet_b_rfs.py")
GB = 1024**3


def read_status_kb(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM) in kB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def restart_peak_rss() -> None:
    """Start VmHWM again from the current resident set (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def synthetic_batch(batch: int, size: int) -> list[dict]:
    """`batch` mapper outputs: noise images with 3 filled boxes each, their masks and classes."""
    import torch

    generator = torch.Generator().manual_seed(0)
    records = []
    for index in range(batch):
        image = torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=generator)
        boxes, masks = [], torch.zeros(3, size, size, dtype=torch.uint8)
        for k in range(3):
            x0, y0 = (int(v) for v in torch.randint(0, size // 2, (2,), generator=generator))
            x1, y1 = x0 + size // 4 + k * size // 16, y0 + size // 3
            boxes.append([x0, y0, x1, y1])
            masks[k, y0:y1, x0:x1] = 1
        instances = {
            "boxes": torch.tensor(boxes, dtype=torch.float32),
            "classes": torch.tensor([1, 2, 3]),
            "masks": masks,
        }
        records.append(
            {"image": image, "instances": instances, "height": size, "width": size, "image_id": index}
        )
    return records


def build_model(grad_checkpointing: bool, overrides: list[str], device: str):
    from lazytrain.config import LazyConfig, instantiate

    cfg = LazyConfig.load(RECIPE)
    setting = [f"model.backbone.grad_checkpointing={str(grad_checkpointing).lower()}"]
    LazyConfig.apply_overrides(cfg, ["model.backbone.pretrained=false", *setting, *overrides])
    return instantiate(cfg.model).to(device).train()


def training_step(model, records: list[dict], device: str, amp: bool) -> float:
    import torch

    synchronize = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
    synchronize()
    start = time.perf_counter()
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
        losses = model(records)
    sum(losses.values()).backward()
    model.zero_grad(set_to_none=True)
    synchronize()
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict:
    """One setting, in this process: the first step's peak memory and the steps' times."""
    import torch

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args.grad_checkpointing == "on", args.overrides, args.device)
    records = synthetic_batch(args.batch, args.size)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = read_status_kb("VmRSS") * 1024
        restart_peak_rss()
    times = [training_step(model, records, args.device, args.amp == "on")]
    peak = torch.cuda.max_memory_allocated() if cuda else read_status_kb("VmHWM") * 1024
    times += [training_step(model, records, args.device, args.amp == "on") for _ in range(args.steps - 1)]
    return {
        "peak_gb": (peak - before) / GB,
        "before_gb": before / GB,
        "step_s": statistics.median(times[1:] or times),
        "first_step_s": times[0],
    }


def run_setting(args: argparse.Namespace, setting: str) -> dict:
    """`measure` in a fresh process (its last stdout line is the result as JSON)."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--grad-checkpointing", setting]
    command += ["--device", args.device, "--size", str(args.size), "--batch", str(args.batch)]
    command += [
        "--steps",
        str(args.steps),
        "--amp",
        args.amp,
        "--threads",
        str(args.threads),
        *args.overrides,
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(args: argparse.Namespace, results: dict[str, dict]) -> None:
    kind = "max_memory_allocated" if args.device.startswith("cuda") else "VmHWM growth (RSS)"
    precision = "bf16 autocast" if args.amp == "on" else "fp32"
    print(f"ViTDet-B recipe model, {args.batch} x {args.size} px, {precision}, {args.device}")
    print(
        f"| grad_checkpointing | peak memory of a step, GB ({kind}) | in use before, GB | s/step | first step, s |"
    )
    print("|---|---|---|---|---|")
    for setting, r in results.items():
        print(
            f"| {setting} | {r['peak_gb']:.2f} | {r['before_gb']:.2f} | {r['step_s']:.2f} | {r['first_step_s']:.2f} |"
        )
    if {"off", "on"} <= results.keys():
        off, on = results["off"], results["on"]
        print(
            f"\nwith checkpointing: peak x{on['peak_gb'] / off['peak_gb']:.2f}, "
            f"step time x{on['step_s'] / off['step_s']:.2f}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--size", type=int, default=1024, help="square image side, px (a multiple of 32)")
    parser.add_argument("--batch", type=int, default=1, help="images per step")
    parser.add_argument("--steps", type=int, default=2, help="steps per setting (the first measures memory)")
    parser.add_argument(
        "--amp", choices=["auto", "on", "off"], default="auto", help="bf16 autocast (auto: on CUDA)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--settings", default="off,on", help="grad_checkpointing settings to run, in order")
    parser.add_argument("--grad-checkpointing", choices=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    if args.amp == "auto":
        args.amp = "on" if args.device.startswith("cuda") else "off"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args)))
        return
    results = {setting: run_setting(args, setting) for setting in args.settings.split(",")}
    print_table(args, results)


if __name__ == "__main__":
    main()
