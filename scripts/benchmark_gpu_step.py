"""One training step on a GPU: lazytrain's recipe model against a bare torchvision loop on the same batches.

    python scripts/benchmark_gpu_step.py                  # R50-FPN, 1203 classes, batch 2 and 8, fp32, bf16
    python scripts/benchmark_gpu_step.py --channels-last  # one measure at a time: --tf32, --fused-optimizer
    python scripts/benchmark_gpu_step.py --models lazytrain --compile default   # or reduce-overhead (CUDA graphs)
    python scripts/benchmark_gpu_step.py --models lazytrain --batch-sizes 8 --precisions bf16 \
        --variants 'base;tf32;fused-optimizer;cudnn-benchmark;compile=default;compile=reduce-overhead'
    python scripts/benchmark_gpu_step.py --models lazytrain --batch-sizes 2 --precisions bf16 --sync-table
    python scripts/benchmark_gpu_step.py --models lazytrain --batch-sizes 8 \
        --variants 'base;fixed-shapes;fixed-shapes fixed-compile=default;fixed-shapes cuda-graph'
    python scripts/benchmark_gpu_step.py --device cpu --iters 1 --warmup 1 --batch-sizes 1 --precisions fp32 \
        --size 64 --max-size 64 --num-classes 30 --num-images 1  # a smoke run without a GPU (~10 s)
    python scripts/benchmark_gpu_step.py --device cpu --recipe recipes/models/mask_rcnn_r18_fpn_cpu.py \
        --models lazytrain --num-classes 30 --size 192 --max-size 256 --precisions fp32 --iters 3 \
        --warmup 1 --sync-table +model.roi_heads.box_roi_pool.dense_max_elements=0 \
        +model.roi_heads.mask_roi_pool.dense_max_elements=0  # the demo model's syncs on GPU code paths

Batches: images of the embedded data set (``synthetic_lt``, 192 px squares, generated into ``--data-root``
when absent) through lazytrain's `DatasetMapper`, resized to ``--size`` (short edge 800: 800 x 800 images)
with their boxes and masks, all built before timing (no data loading). lazytrain's model gets them as its
loader delivers them (page-locked host memory; the model copies them, as in training; ``--inputs-on-device``
moves them first); the torchvision loop gets the same images as float 0-1 tensors and targets on the device.

Models: ``--recipe`` (default the R50-FPN Mask R-CNN of recipes/models/mask_rcnn_fpn.py: FrozenBN, 3
trainable stages; positional ``key=value`` arguments override it) with the recipe's SGD parameter groups
(recipes/optim.py), and torchvision's Mask R-CNN assembled from the same parts (ResNet-50 FrozenBN + FPN, 3
trainable stages; ``maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)`` would train BatchNorm in
every stage) with one SGD group; its transform resizes to ``--size`` (no change in size, a resampling kernel
in time). Both start from random init; SGD momentum 0.9, weight decay 1e-4, learning rate ``--lr`` ramped up
over the first 50 steps (0.02 from random init diverges). A step is forward, loss sum, backward and optimizer
step (the trainer's own work: scripts/benchmark_trainer.py). Without ``--tf32`` torch's defaults hold: TF32
convolutions, fp32 matmuls.

Columns: s/it is the median over ``--iters`` steps after ``--warmup`` (the device synchronised around each);
GPU busy is the time any kernel, copy or memset runs (torch.profiler, over ``--profile-steps`` steps) per
step over that median; peak memory is torch.cuda.max_memory_allocated; host syncs per step counts one step
with `lazytrain.utils.host_syncs.HostSyncCounter` (on the CPU, its proxy count) and, on CUDA, the warnings of
``torch.cuda.set_sync_debug_mode("warn")`` (the exact number, as far as torch instruments it); host syncs per
inference counts one eval-mode forward pass of the first batch; device ops per step counts the step's
operations that launch device work (`HostSyncCounter.operation_total`: about one per kernel launch); GB moved
per step adds up the bytes those operations read and write (`HostSyncCounter.memory_traffic_total`). Compiled
code runs eagerly under the counter, so with a compiled part (``--compile``, ``model.rpn.compiled_nms``, ...)
these two columns say "eager X": what the eager form launches and moves, not the compiled kernels.
``--sync-table`` prints the counted syncs by operation and calling line,
and the memory traffic by line. Prints markdown.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.ops.misc import FrozenBatchNorm2d

from lazytrain.config import LazyConfig, instantiate
from lazytrain.data.datasets.builtin import get_datasets_root
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import generate_synthetic_lt, is_complete
from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.transforms import ResizeShortestEdge
from lazytrain.modeling import FixedShapes
from lazytrain.modeling.fixed_shapes import pad_batch
from lazytrain.utils.host_syncs import HostSyncCounter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LR_RAMP_STEPS = 50
MODELS = ("lazytrain", "torchvision")
PRECISIONS = ("fp32", "bf16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the recipe (lazytrain only)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke runs)")
    parser.add_argument("--recipe", default=os.path.join(REPO, "recipes", "models", "mask_rcnn_fpn.py"))
    parser.add_argument("--num-classes", type=int, default=1203, help="foreground classes (LVIS: 1203)")
    parser.add_argument("--models", default=",".join(MODELS), help="lazytrain,torchvision (always R50-FPN)")
    parser.add_argument("--batch-sizes", default="2,8", help="comma-separated images per step")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32,bf16 (bf16: autocast)")
    parser.add_argument("--size", type=int, default=800, help="short edge of the images in pixels")
    parser.add_argument("--max-size", type=int, default=1333, help="longest edge at most")
    parser.add_argument("--iters", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled for the GPU busy share")
    parser.add_argument("--lr", type=float, default=0.002, help="SGD learning rate after the ramp")
    parser.add_argument("--data-root", default=None, help="synthetic_lt folder (default $LAZYTRAIN_DATASETS)")
    parser.add_argument("--num-images", type=int, default=64, help="distinct images, cycled through")
    parser.add_argument("--channels-last", action="store_true", help="NHWC convolutions")
    parser.add_argument("--tf32", action="store_true", help="TF32 matmuls (torch's default: convs only)")
    parser.add_argument("--fused-optimizer", action="store_true", help="SGD(fused=True)")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark")
    parser.add_argument(
        "--compile",
        default=None,
        metavar="MODE",
        help="lazytrain: RCNN.compile_backbone with this torch.compile mode (default, reduce-overhead: CUDA "
        "graphs, max-autotune-no-cudagraphs); compiled during the warm-up steps",
    )
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend for --compile")
    parser.add_argument(
        "--variants",
        default=None,
        help="';'-separated option sets measured one after the other in this process (one table), each a "
        "space-separated list of the flags above without their dashes, compile=MODE, or recipe key=value overrides "
        "(lazytrain only); 'base' is none of them. E.g. "
        "'base;tf32;fused-optimizer;compile=default;+model.backbone.fold_frozen_bn=false'",
    )
    parser.add_argument(
        "--fixed-shapes",
        action="store_true",
        help="lazytrain: the training step with fixed shapes (model.fixed_shapes: the batches' padded size and "
        "their most instances per image)",
    )
    parser.add_argument(
        "--fixed-compile",
        default=None,
        metavar="MODE",
        help="with --fixed-shapes: torch.compile(model.fixed_step, fullgraph=True) with this mode (default, "
        "reduce-overhead: CUDA graphs of forward and backward), --compile-backend's backend",
    )
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --fixed-shapes, CUDA only: forward, backward and optimizer step captured in one "
        "torch.cuda.CUDAGraph and replayed (the learning rate stays at its value at the capture)",
    )
    parser.add_argument("--inputs-on-device", action="store_true", help="give lazytrain device tensors")
    parser.add_argument("--sync-table", action="store_true", help="print each step's syncs by line")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return parser.parse_args(argv)


# --variants flags: the boolean options of the command line.
VARIANT_FLAGS = (
    "channels-last", "tf32", "fused-optimizer", "cudnn-benchmark", "inputs-on-device", "fixed-shapes", "cuda-graph",
)  # fmt: skip


def variant_args(args: argparse.Namespace, variant: str) -> argparse.Namespace:
    """`args` with one ``--variants`` option set applied (flags on, compile=MODE, recipe overrides added)."""
    changed = argparse.Namespace(**vars(args))
    changed.overrides = list(args.overrides)
    for token in variant.split():
        if token == "base":
            continue
        if token in VARIANT_FLAGS:
            setattr(changed, token.replace("-", "_"), True)
        elif token.startswith("compile="):
            changed.compile = token.split("=", 1)[1]
        elif token.startswith("fixed-compile="):
            changed.fixed_compile = token.split("=", 1)[1]
        elif "=" in token:
            changed.overrides.append(token)
        else:
            raise ValueError(
                f"benchmark_gpu_step: --variants takes {', '.join(VARIANT_FLAGS)}, compile=MODE or key=value "
                f"overrides, separated by spaces; got {token!r} in {variant!r}"
            )
    return changed


def _split(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    values = [value for value in text.split(",") if value]
    unknown = sorted(set(values) - set(allowed))
    if unknown or not values:
        raise ValueError(f"benchmark_gpu_step: {option} takes {','.join(allowed)}; got {text!r}")
    return values


def _check_fixed_options(args: argparse.Namespace) -> None:
    if (args.fixed_compile or args.cuda_graph) and not args.fixed_shapes:
        raise ValueError("benchmark_gpu_step: --fixed-compile and --cuda-graph need --fixed-shapes")
    if args.fixed_compile and args.cuda_graph:
        raise ValueError("benchmark_gpu_step: give --fixed-compile or --cuda-graph, not both")
    if args.cuda_graph and torch.device(args.device).type != "cuda":
        raise ValueError(
            f"benchmark_gpu_step: --cuda-graph captures a CUDA graph and needs --device cuda; got {args.device!r}"
        )


def _check_counts(args: argparse.Namespace) -> None:
    # The counted step must not be the first: that one also sets up what later steps reuse (pooler scales).
    for option, value, least in (("--warmup", args.warmup, 1), ("--iters", args.iters, 1)):
        if value < least:
            raise ValueError(f"benchmark_gpu_step: {option} must be >= {least}; got {value}")


def load_samples(args: argparse.Namespace) -> list[dict]:
    """Mapper outputs of the first `--num-images` annotated train images, resized to `--size`."""
    root = args.data_root or os.path.join(get_datasets_root(), "synthetic_lt")
    if not is_complete(root):
        generate_synthetic_lt(root)
    records = load_lvis_json(os.path.join(root, "lvis_v1_train.json"), root)
    records = [record for record in records if record["annotations"]][: args.num_images]
    resize = ResizeShortestEdge(short_edge_length=[args.size], max_size=args.max_size, sample_style="choice")
    mapper = DatasetMapper(is_train=True, augmentations=[resize], use_instance_mask=True)
    samples = [mapper(record) for record in records]
    classes = max(int(sample["instances"]["classes"].max()) + 1 for sample in samples)
    if classes > args.num_classes:
        raise ValueError(
            f"benchmark_gpu_step: --num-classes {args.num_classes} is too few for the images, whose "
            f"classes go up to {classes}; give at least --num-classes {classes}."
        )
    return samples


def make_batches(samples: list[dict], batch_size: int) -> list[list[dict]]:
    """Consecutive samples, as many batches as the samples fill (at least one, cycling if needed)."""
    count = max(1, len(samples) // batch_size)
    return [[samples[(b * batch_size + i) % len(samples)] for i in range(batch_size)] for b in range(count)]


def _move(value, device: torch.device, pin: bool):
    if isinstance(value, torch.Tensor):
        return value.pin_memory() if pin else value.to(device)
    if isinstance(value, dict):
        return {key: _move(item, device, pin) for key, item in value.items()}
    return value


def lazytrain_inputs(batch: list[dict], device: torch.device, on_device: bool) -> list[dict]:
    """As lazytrain's loader hands batches to the model: page-locked when training on cuda."""
    if on_device:
        return [_move(sample, device, pin=False) for sample in batch]
    return [_move(sample, device, pin=device.type == "cuda") for sample in batch]


def torchvision_inputs(batch: list[dict], device: torch.device) -> tuple[list, list]:
    images = [sample["image"].to(device).float() / 255 for sample in batch]
    targets = [
        {
            "boxes": sample["instances"]["boxes"].to(device),
            "labels": sample["instances"]["classes"].to(device) + 1,  # 0 is the background
            "masks": sample["instances"]["masks"].to(device),
        }
        for sample in batch
    ]
    return images, targets


def fixed_shapes_for(samples: list[dict]) -> FixedShapes:
    """The capacities the samples need: their largest size rounded up to 32 px, their most instances."""
    height = max(sample["image"].shape[-2] for sample in samples)
    width = max(sample["image"].shape[-1] for sample in samples)
    instances = max(len(sample["instances"]["classes"]) for sample in samples)
    return FixedShapes([-(-height // 32) * 32, -(-width // 32) * 32], instances)


def build_lazytrain(args: argparse.Namespace, device: torch.device, samples: list[dict]):
    cfg = LazyConfig.load(args.recipe)
    overrides = [f"model.num_classes={args.num_classes}", f"model.channels_last={args.channels_last}"]
    LazyConfig.apply_overrides(cfg, [*overrides, *args.overrides])
    fixed = {"fixed_shapes": fixed_shapes_for(samples)} if args.fixed_shapes else {}
    model = instantiate(cfg.model, **fixed).to(device).train()
    if args.compile:
        model.compile_backbone(
            mode=None if args.compile == "default" else args.compile, backend=args.compile_backend
        )
    optim = LazyConfig.load(os.path.join(REPO, "recipes", "optim.py")).optimizer
    params = instantiate(optim.params, model=model)
    fused = {"fused": True} if args.fused_optimizer else {}
    return model, instantiate(optim, params=params, lr=args.lr, **fused)


def build_torchvision(args: argparse.Namespace, device: torch.device):
    backbone = resnet_fpn_backbone(
        backbone_name="resnet50", weights=None, norm_layer=FrozenBatchNorm2d, trainable_layers=3
    )
    model = MaskRCNN(backbone, num_classes=args.num_classes + 1, min_size=args.size, max_size=args.max_size)
    model = model.to(device).train()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    params = [param for param in model.parameters() if param.requires_grad]
    fused = {"fused": True} if args.fused_optimizer else {}
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4, **fused)
    return model, optimizer


def _autocast(device: torch.device, precision: str) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def make_fixed_step(args: argparse.Namespace, model, optimizer, batches: list, precision: str, device):
    """`step(index)` of the step with fixed shapes: each batch padded (`pad_batch`, as `RCNN.forward` does), then
    `RCNN.fixed_step` eager, compiled whole (``--fixed-compile``) or replayed as a CUDA graph (``--cuda-graph``)."""
    fixed, masks = model.fixed_shapes, model.roi_heads.has_mask()
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    losses_of = model.fixed_step
    if args.fixed_compile:
        mode = None if args.fixed_compile == "default" else args.fixed_compile
        losses_of = torch.compile(
            model.fixed_step, fullgraph=True, dynamic=False, mode=mode, backend=args.compile_backend
        )

    def train(batch) -> None:
        # Under the host-sync counter (a dispatch mode, which a fullgraph compile refuses) the eager form runs.
        counting = torch.utils._python_dispatch._get_current_dispatch_mode() is not None
        # A CUDA graph replays the casts it captured: autocast's cache of cast weights would go stale in it.
        autocast = torch.autocast(
            device.type, dtype=torch.bfloat16, enabled=precision == "bf16", cache_enabled=not args.cuda_graph
        )
        with autocast:
            losses, _ = (model.fixed_step if counting else losses_of)(batch)
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    if not args.cuda_graph:

        def step(index: int) -> None:
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * min(1.0, (index + 1) / LR_RAMP_STEPS)
            train(pad_batch(batches[index % len(batches)], fixed, device, masks))

        return step
    static = pad_batch(batches[0], fixed, device, masks)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # the optimizer's state and every lazily made tensor exist before the capture
            train(static)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        train(static)

    def replay(index: int) -> None:
        batch = pad_batch(batches[index % len(batches)], fixed, device, masks)
        for target, source in zip(static, batch):
            if target is not None:
                target.copy_(source, non_blocking=True)
        graph.replay()

    return replay


def make_step(name: str, model, optimizer, batches: list, precision: str, device: torch.device):
    """`step(index)`: one training step on batch `index` (cycled), at the ramped learning rate."""
    base_lrs = [group["lr"] for group in optimizer.param_groups]

    def step(index: int) -> None:
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * min(1.0, (index + 1) / LR_RAMP_STEPS)
        inputs = batches[index % len(batches)]
        with _autocast(device, precision):
            losses = model(inputs) if name == "lazytrain" else model(*inputs)
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[int], None], first: int, count: int, device: torch.device) -> list[float]:
    times = []
    for index in range(first, first + count):
        _synchronize(device)
        start = time.perf_counter()
        step(index)
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def gpu_seconds_per_step(step: Callable[[int], None], first: int, count: int, device: torch.device) -> float:
    """Seconds per step in which the GPU runs anything (kernels, copies, memsets), from torch.profiler."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        time_steps(step, first, count, device)
    intervals = [
        (event.time_range.start, event.time_range.end)
        for event in profiler.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    return union_length(intervals) / 1e6 / count


def count_host_syncs(step: Callable[[int], None], index: int, device: torch.device) -> HostSyncCounter:
    with HostSyncCounter(treat_cpu_as_device=device.type == "cpu", record_sites=True) as counter:
        step(index)
    _synchronize(device)
    return counter


def count_inference_syncs(name: str, model, inputs, precision: str, device: torch.device) -> HostSyncCounter:
    """Host syncs of one eval-mode forward pass on `inputs` (a training batch; targets are not used)."""
    images = inputs if name == "lazytrain" else inputs[0]  # torchvision's model takes the images only
    counter = HostSyncCounter(treat_cpu_as_device=device.type == "cpu", record_sites=True)
    model.eval()
    with torch.no_grad(), _autocast(device, precision), counter:
        model(images)
    _synchronize(device)
    model.train()
    return counter


def count_cuda_sync_warnings(step: Callable[[int], None], index: int, device: torch.device) -> int:
    """Synchronising CUDA operations of one step, as torch's sync debug mode reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(index)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _synchronize(device)
    return sum("called a synchronizing" in str(warning.message) for warning in caught)


def build_run(
    name: str, args: argparse.Namespace, samples: list[dict], batch_size: int, device: torch.device
):
    """The model, its optimizer and the batches in the form that model takes."""
    torch.manual_seed(0)
    if name == "lazytrain":
        model, optimizer = build_lazytrain(args, device, samples)
    else:
        model, optimizer = build_torchvision(args, device)
    batches = make_batches(samples, batch_size)
    if name == "lazytrain":
        return model, optimizer, [lazytrain_inputs(batch, device, args.inputs_on_device) for batch in batches]
    return model, optimizer, [torchvision_inputs(batch, device) for batch in batches]


def measure(
    name: str, args: argparse.Namespace, samples: list[dict], batch_size: int, precision: str
) -> dict:
    """One row: warm-up, host syncs of one step, timed steps, GPU busy share, peak memory, inference syncs."""
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    model, optimizer, batches = build_run(name, args, samples, batch_size, device)
    if name == "lazytrain" and args.fixed_shapes:
        step = make_fixed_step(args, model, optimizer, batches, precision, device)
    else:
        step = make_step(name, model, optimizer, batches, precision, device)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    time_steps(step, 0, args.warmup, device)
    training = count_host_syncs(step, args.warmup, device)
    exact = count_cuda_sync_warnings(step, args.warmup + 1, device) if on_cuda else None
    first = args.warmup + 2
    seconds = statistics.median(time_steps(step, first, args.iters, device))
    busy = None
    if on_cuda:
        busy = gpu_seconds_per_step(step, first + args.iters, args.profile_steps, device) / seconds
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if on_cuda else None
    inference = count_inference_syncs(name, model, batches[0], precision, device)
    eager = "eager " if _has_compiled_parts(model) or (name == "lazytrain" and args.fixed_compile) else ""
    tables = {
        "training step": training.format_table(sites=True),
        "training step, memory traffic": training.format_memory_traffic(),
        "inference": inference.format_table(sites=True),
    }
    return {
        "model": name, "batch": batch_size, "precision": precision, "s/it": seconds,
        "images/s": batch_size / seconds, "GPU busy": busy, "peak memory GiB": memory,
        "host syncs / step": training.total, "syncs (CUDA debug mode)": exact,
        "host syncs / inference": inference.total, "device ops / step": f"{eager}{training.operation_total}",
        "GB moved / step": f"{eager}{training.memory_traffic_total / 1e9:.2f}", "sync tables": tables,
    }  # fmt: skip


def _has_compiled_parts(model: torch.nn.Module) -> bool:
    """Whether the model runs parts through torch.compile: a compiled backbone or a compiled NMS."""
    backbone = getattr(model, "compiled_backbone", None) is not None
    return backbone or any(getattr(module, "compiled_nms", False) for module in model.modules())


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _options(args: argparse.Namespace, name: str) -> str:
    chosen = [flag for flag in VARIANT_FLAGS if getattr(args, flag.replace("-", "_"))]
    if name == "lazytrain":
        if args.compile:
            chosen.append(f"compile {args.compile} ({args.compile_backend})")
        if args.fixed_compile:
            chosen.append(f"fixed-compile {args.fixed_compile} ({args.compile_backend})")
        chosen += args.overrides[len(args.base_overrides) :]
    return ", ".join(chosen) or "-"


def significant(value: float, digits: int = 3) -> str:
    """`value` with `digits` significant digits and no exponent (0.0434, 5.27, 123, 4567): a slow CPU smoke
    run's images/s stays positive in the table instead of rounding to 0.0."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
    return f"{value:.{decimals}f}"


def _cell(value) -> str:
    return "n/a" if value is None else str(value)


def format_table(rows: list[dict]) -> str:
    columns = ["model", "batch", "precision", "options", "s/it", "images/s", "GPU busy", "peak memory GiB"]
    columns += ["host syncs / step", "syncs (CUDA debug mode)", "host syncs / inference", "device ops / step"]
    columns += ["GB moved / step"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = dict(row)
        cells["s/it"] = f"{row['s/it']:.4f}"
        cells["images/s"] = significant(row["images/s"])
        cells["GPU busy"] = "n/a" if row["GPU busy"] is None else f"{row['GPU busy']:.0%}"
        memory = row["peak memory GiB"]
        cells["peak memory GiB"] = "n/a" if memory is None else f"{memory:.2f}"
        lines.append("| " + " | ".join(_cell(cells[column]) for column in columns) + " |")
    return "\n".join(lines)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    models = _split(args.models, MODELS, "--models")
    precisions = _split(args.precisions, PRECISIONS, "--precisions")
    batch_sizes = [int(size) for size in args.batch_sizes.split(",") if size]
    _check_counts(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.base_overrides = list(args.overrides)
    variants = [variant_args(args, variant) for variant in (args.variants or "base").split(";")]
    for variant in variants:
        _check_fixed_options(variant)
    samples = load_samples(args)
    device = torch.device(args.device)
    rows = []
    for batch_size in batch_sizes:
        for precision in precisions:
            for variant in variants:
                torch.set_float32_matmul_precision("high" if variant.tf32 else "highest")
                torch.backends.cudnn.benchmark = variant.cudnn_benchmark
                for name in models:
                    row = measure(name, variant, samples, batch_size, precision)
                    rows.append({**row, "options": _options(variant, name)})
                    _free_memory(device)
    size = samples[0]["image"].shape[-2:]
    recipe = " ".join([args.recipe.removeprefix(REPO + os.sep), *args.overrides])
    print(
        f"\n{_device_name(device)}, torch {torch.__version__}; {recipe}, {args.num_classes} classes, images "
        f"{size[1]} x {size[0]}, {args.iters} timed steps after {args.warmup}\n"
    )
    print(format_table(rows))
    if args.sync_table:
        for row in rows:
            for part, table in row["sync tables"].items():
                title = part if "memory" in part else f"Host syncs, {part}"
                print(f"\n{title}, {row['model']} batch {row['batch']} {row['precision']}:\n")
                print(table)
    return rows


if __name__ == "__main__":
    main()
