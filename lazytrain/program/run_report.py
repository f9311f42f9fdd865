"""What a run tells its user: a short header before the first step (with a warning when the warm-up outlasts
the run) and a closing summary (final metrics, AP-fixed and AP-pool when computed, time, what each experiment
tracker holds or lacks, the files written and the commands to resume or evaluate: an evaluation of the run
writes into a dated sub-folder of it, `EVAL_FOLDER`). An evaluation-only run (``train.eval_only``) gets a header
and a closing block of its own. The plots in the run directory come from `lazytrain.engine.plot_writer`.

The console shows the header and the summary; the full config, the environment and the model's repr go to
``log.txt`` only (DEBUG level), and ``train.verbose=true`` prints them on the console too. Everything here
logs on the main process only.
"""

from __future__ import annotations

import datetime
import glob
import logging
import math
import os
import shlex
from collections import Counter
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lazytrain.engine.hooks import EvalHook, LRScheduler
from lazytrain.engine.plot_writer import (
    AP_BY_FREQUENCY_FILE,
    CURVES_FILE,
    RecordsSummary,
    get_train_records,
    summarize_records,
)
from lazytrain.engine.trackers.base import Tracker
from lazytrain.modeling.checkpointing import CheckpointedSequential
from lazytrain.program.batch_size import get_accumulation_steps, get_lr_scale
from lazytrain.utils import comm, run_dirs

__all__ = [
    "COMMAND_ENV",
    "EVAL_FOLDER",
    "EVAL_FOLDER_NAME",
    "find_short_warmup",
    "format_eval_header",
    "format_eval_summary",
    "format_run_header",
    "format_run_summary",
    "log_eval_header",
    "log_eval_summary",
    "log_run_header",
    "log_run_summary",
    "resume_command",
]

logger = logging.getLogger(__name__)

# The entrypoint puts the command line here, so that ranks (spawned or not) can show it in the header.
COMMAND_ENV = "LAZYTRAIN_COMMAND"
_BUCKET_NAMES = {"r": "rare", "c": "common", "f": "frequent"}
# The sub-folder of a run that the closing block's Evaluate command writes into.
EVAL_FOLDER = "eval"
EVAL_FOLDER_NAME = "${now:%Y-%m-%d_%H-%M-%S.%f}"
"""The folder of an evaluation in `EVAL_FOLDER`: the time to the microsecond (Hydra's ``now`` resolver), so that
two evaluations never share one."""


# ------------------------------------------------------------------------------------------------- header


def _get_dataset_names(cfg: DictConfig, split: str = "train") -> list[str]:
    """``dataloader.<split>.dataset.names`` as a list; a registering call (e.g. ``register_json_dataset``),
    alone or as an item of the list (a mixture of a built-in set and one's own), gives its ``name`` argument."""
    names = OmegaConf.select(cfg, f"dataloader.{split}.dataset.names", default=None)
    if names is None:
        return []
    items = list(names) if OmegaConf.is_list(names) else [names]
    return [str(item.get("name", "?")) if OmegaConf.is_dict(item) else str(item) for item in items]


def _describe_copy_paste(cfg: DictConfig) -> str:
    """The train mapper's Copy-Paste (``dataloader.train.mapper.copy_paste``) when it pastes, else ""."""
    node = OmegaConf.select(cfg, "dataloader.train.mapper.copy_paste", default=None)
    if not OmegaConf.is_dict(node) or node.get("mode", "uniform") == "none":
        return ""
    text = f"Copy-Paste {node.get('mode', 'uniform')} (prob {node.get('prob', 1.0)}, up to "
    text += f"{node.get('max_objects', 20)} objects"
    if node.get("mode", "uniform") == "rare":
        text += f", t={node.get('repeat_thresh', 0.001)}"
    return text + ")"


def _describe_checkpointing(model: torch.nn.Module) -> str:
    """The model's parts whose activations are recomputed in the backward pass (``grad_checkpointing``), else
    ""."""
    parts = [
        name
        for name, module in comm.unwrap_model(model).named_modules()
        if isinstance(module, CheckpointedSequential) or getattr(module, "grad_checkpointing", False) is True
    ]
    # The outermost only: a timm backbone's switch is also on its inner model and stages.
    outer = [name for name in parts if not any(name.startswith(other + ".") for other in parts)]
    if not outer:
        return ""
    shown = ", ".join(outer[:4]) + (f" and {len(outer) - 4} more" if len(outer) > 4 else "")
    return f"activation checkpointing in {shown}"


def _describe_data(cfg: DictConfig, summary: RecordsSummary | None) -> str:
    from lazytrain.data.catalog import MetadataCatalog
    from lazytrain.data.datasets.lvis import frequency_of_image_count

    names = _get_dataset_names(cfg)
    label = ", ".join(names) or "train set"
    if summary is None:
        return label
    # The data set's own buckets when registered (they follow its thresholds), else LVIS's from the counts.
    metadata = MetadataCatalog.get(names[0]) if len(names) == 1 else None
    frequency = metadata.get("class_frequency") if metadata is not None else None
    if frequency:
        buckets = Counter(frequency)
    else:
        buckets = Counter(frequency_of_image_count(n) for n in summary.image_counts.values())
    categories = sum(buckets.values())
    per_bucket = ", ".join(f"{_BUCKET_NAMES[b]} {buckets[b]}" for b in "rcf")
    return (
        f"{label}: {summary.images} images, {summary.instances} instances, {categories} categories "
        f"({per_bucket})"
    )


def _describe_data_line(cfg: DictConfig, summary: RecordsSummary | None) -> str:
    copy_paste = _describe_copy_paste(cfg)
    return _describe_data(cfg, summary) + (f"; {copy_paste}" if copy_paste else "")


def _describe_sampler(cfg: DictConfig, data_loader: Any) -> tuple[str, float | None]:
    """The sampler line and the expected number of images per epoch (None when unknown)."""
    sampler = getattr(getattr(data_loader, "batch_sampler", None), "sampler", None)
    factors = getattr(sampler, "repeat_factors", None)
    if factors is not None:
        threshold = OmegaConf.select(cfg, "dataloader.train.sampler.repeat_thresh", default="?")
        epoch = float(factors.sum(dtype=float))
        return (
            f"{type(sampler).__name__}: t={threshold}, {int((factors > 1).sum())} of {len(factors)} images "
            f"repeated (max x{float(factors.max()):.1f}), expected epoch {epoch:.0f} images"
        ), epoch
    shares = getattr(sampler, "shares", None)
    if shares is not None:
        names = _get_dataset_names(cfg)
        if len(names) == len(shares):
            thresholds = _source_thresholds(cfg, len(shares))
            per_source = ", ".join(
                f"{name} {share} (of {size} images{f', RFS t={t} inside it' if t is not None else ''})"
                for name, share, size, t in zip(names, shares, sampler.sizes, thresholds)
            )
            return f"{type(sampler).__name__}: images per step (all ranks) {per_source}", None
        return (
            f"{type(sampler).__name__}: {'/'.join(map(str, shares))} images per step (all ranks) from sources of "
            f"{'/'.join(map(str, sampler.sizes))} images"
        ), None
    size = getattr(sampler, "size", None)
    name = type(sampler).__name__ if sampler is not None else "unknown sampler"
    return (f"{name}: epoch {size} images" if size else name), size


def _source_thresholds(cfg: DictConfig, count: int) -> list[Any]:
    """A mixture's RFS threshold per source (None: shuffled epochs), from ``dataloader.train.sampler``."""
    thresholds = OmegaConf.select(cfg, "dataloader.train.sampler.repeat_thresh", default=None)
    if OmegaConf.is_list(thresholds) and len(thresholds) == count:
        return list(thresholds)
    return [thresholds] * count  # one threshold for every source, or None


def _describe_schedule(cfg: DictConfig, epoch: float | None) -> str:
    train = cfg.train
    batch = OmegaConf.select(cfg, "dataloader.train.total_batch_size", default=None)
    text = f"{train.max_iter} iterations"
    if batch:
        text += f" x {batch} images"
        if epoch:
            text += f" ({train.max_iter * batch / epoch:.2f} epochs)"
        passes = get_accumulation_steps(cfg, comm.get_world_size())
        if passes and passes > 1:
            text += f", {train.images_per_forward} per forward pass ({passes} passes per step and process)"
    optimizer = OmegaConf.select(cfg, "optimizer._target_", default="")
    lr = OmegaConf.select(cfg, "optimizer.lr", default=None)
    if optimizer:
        scale = get_lr_scale(cfg)
        if scale is not None and lr is not None:
            lr = f"{lr * scale:g} ({lr} x {batch}/{train.auto_scale_lr.base_batch_size}, auto_scale_lr)"
        text += f"; {str(optimizer).rsplit('.', 1)[-1]} lr {lr}"
    multiplier = OmegaConf.select(cfg, "lr_multiplier._target_", default="")
    if multiplier:
        warmup = OmegaConf.select(cfg, "lr_multiplier.warmup_iters", default=None)
        text += f" x {str(multiplier).rsplit('.', 1)[-1]}" + (f" (warmup {warmup})" if warmup else "")
    ema = train.get("ema") or {}
    if ema.get("enabled", False):
        text += f"; EMA decay {ema.get('decay')} (tau {ema.get('tau')})"
    has_eval = "eval" in (train.get("hooks") or {})
    eval_period = int(train.get("eval_period", 0) or 0)
    if has_eval:
        text += f"; eval every {eval_period} and at the end" if eval_period > 0 else "; eval at the end"
    period = OmegaConf.select(cfg, "train.checkpointer.period", default=None)
    return text + (f"; checkpoint every {period}" if period else "")


def format_run_header(cfg: DictConfig, trainer: Any, summary: RecordsSummary | None = None) -> str:
    """The lines shown before the first step: command, output, processes, data, sampler, model, schedule.

    Args:
        cfg: the run's config.
        trainer: the built trainer (reads ``model`` and ``data_loader``).
        summary: counts of the train records (`summarize_records`); None leaves them out.
    """
    output_dir = str(cfg.train.output_dir)
    sampler, epoch = _describe_sampler(cfg, trainer.data_loader)
    world_size = comm.get_world_size()
    lines = []
    if os.environ.get(COMMAND_ENV):
        lines.append(f"  command   {os.environ[COMMAND_ENV]}")
    lines += [
        f"  output    {output_dir} (full config, environment and model in log.txt; train.verbose=true "
        "prints them here)",
        f"  world     {world_size} process{'es' if world_size > 1 else ''} on {cfg.train.get('device', 'cpu')}, "
        f"seed {cfg.train.get('seed', 0)}",
        f"  data      {_describe_data_line(cfg, summary)}",
        f"  sampler   {sampler}",
        f"  model     {_describe_model(trainer.model)}",
        f"  schedule  {_describe_schedule(cfg, epoch)}",
    ]
    return "Run:\n" + "\n".join(lines)


def _describe_model(model: torch.nn.Module) -> str:
    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    checkpointing = _describe_checkpointing(model)
    return (
        f"{type(comm.unwrap_model(model)).__name__}: {parameters / 1e6:.1f}M parameters "
        f"({trainable / 1e6:.1f}M trainable)" + (f"; {checkpointing}" if checkpointing else "")
    )


def find_short_warmup(cfg: DictConfig, trainer: Any) -> str | None:
    """A line when the LR schedule's warm-up outlasts the run (a shortened ``train.max_iter``): the learning
    rate never reaches its value, and the line says what it peaks at. None otherwise.

    Args:
        cfg: the run's config (reads ``train.max_iter``).
        trainer: the built trainer (reads its `LRScheduler` hook's multiplier and its optimizer's LR).
    """
    max_iter = int(cfg.train.max_iter)
    schedulers = [hook for hook in getattr(trainer, "hooks", ()) if isinstance(hook, LRScheduler)]
    multiplier = schedulers[0].multiplier if schedulers else None
    warmup = getattr(multiplier, "warmup_iters", None)
    if not isinstance(warmup, int) or warmup <= max_iter or max_iter < 1:
        return None
    group = trainer.optimizer.param_groups[0]
    lr = group.get("initial_lr", group["lr"])
    peak = max(multiplier(iteration) for iteration in range(max_iter))
    key = "lr_multiplier.warmup_iters" if OmegaConf.select(cfg, "lr_multiplier.warmup_iters") else "warm-up"
    return (
        f"{key}={warmup} is longer than the run (train.max_iter={max_iter}): the learning rate peaks at "
        f"{lr * peak:.3g} (x{peak:.2g} of {lr:g}) and never reaches its value; shorten the warm-up (e.g. "
        f"{key}={max(1, max_iter // 10)}) or train longer."
    )


def log_run_header(cfg: DictConfig, trainer: Any) -> None:
    """Log `format_run_header` on the main process, after one pass over the train records to count them
    (each record unpickled once: seconds for a full LVIS-sized train set, see docs/benchmarks.md), and a
    warning when the warm-up outlasts the run (`find_short_warmup`)."""
    if not comm.is_main_process():
        return
    records = get_train_records(trainer.data_loader)
    summary = summarize_records(records) if records is not None else None
    logger.info(format_run_header(cfg, trainer, summary))
    short_warmup = find_short_warmup(cfg, trainer)
    if short_warmup:
        logger.warning(short_warmup)


# ------------------------------------------------------------------------------------------------ summary

_FILES = (  # (file name, what it holds), in the order the summary lists them
    ("metrics.json", "losses, learning rate and evaluations, one JSON line per logged iteration"),
    ("lvis_per_category_ap.csv", "AP per category with its frequency bucket and train images (also .md)"),
    ("coco_per_category_ap.csv", "AP per category (also .md)"),
    ("model_final.pth", "final weights (last_checkpoint names the newest checkpoint)"),
    ("model_best.pth", "weights of the best evaluation"),
    ("config.yaml", "the full config; runs again as CONFIG"),
    ("categories.json", "class names and json ids (predict and export read them)"),
    (CURVES_FILE, "losses, learning rate and AP over iterations"),  # `_CURVES_WITHOUT_AP` without evaluation
    (AP_BY_FREQUENCY_FILE, "AP per category against its train images, rare/common/frequent"),
    ("log.txt", "the full log, with the config, environment and model"),
)


_CURVES_WITHOUT_AP = {CURVES_FILE: "losses and learning rate over iterations"}

# With train.ema the checkpoints' "model" is the EMA of the weights.
_EMA_FILES = {
    "model_final.pth": "final EMA weights (the trained ones as training_model; last_checkpoint names the newest)",
    "model_best.pth": "EMA weights of the best evaluation",
}


# Dave et al.'s metrics, shown when the evaluator computed them (`LVISEvaluator(ap_fixed=, ap_pool=)`).
_EXTRA_METRICS = {"APfixed": "AP-fixed", "APpool": "AP-pool"}


def _format_metrics(results: dict) -> list[str]:
    """A small aligned table: one row per task (mask first), AP then APr/APc/APf (or AP50/AP75), then AP-fixed
    and AP-pool when computed."""
    tasks = sorted((t for t in results if isinstance(results[t], dict)), key=lambda t: (t != "segm", t))
    if not tasks:
        return ["  no evaluation results"]
    names = run_dirs.DEFAULT_EVAL_METRICS if "APr" in results[tasks[0]] else ("AP", "AP50", "AP75")
    names += tuple(name for name in _EXTRA_METRICS if any(name in results[task] for task in tasks))
    rows = [["", *(_EXTRA_METRICS.get(name, name) for name in names)]]
    for task in tasks:
        label = {"segm": "mask", "bbox": "box"}.get(task, task)
        rows.append([label, *(_format_value(results[task].get(name)) for name in names)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(names) + 1)]
    return ["  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]


def _format_value(value: Any) -> str:
    if value is None:
        return "-"
    return "nan" if math.isnan(float(value)) else f"{float(value):.1f}"


def _seconds_per_iteration(trainer: Any) -> tuple[float, int] | None:
    """Mean step time after the first 3 steps (the `IterationTimer` warm-up; all of them when there are no
    more), from the event storage, and the number of steps it is the mean of."""
    storage = getattr(trainer, "storage", None)
    if storage is None or "time" not in storage.histories():
        return None
    times = [value for value, _ in storage.history("time").values()]
    counted = times[3:] if len(times) > 3 else times
    return (sum(counted) / len(counted), len(counted)) if counted else None


def _describe_speed(trainer: Any, iterations: int) -> str:
    """``, 0.52 s/it over the last 96 iterations`` (the steps timed after warm-up), or "" when none were."""
    timed = _seconds_per_iteration(trainer) if iterations > 0 else None
    if not timed:
        return ""
    mean, count = timed
    counted = (
        f"the last {count} iteration{'s' if count > 1 else ''}"
        if count < iterations
        else f"{count} iterations"
    )
    return f", {mean:.2f} s/it over {counted}"


def _get_trackers(trainer: Any) -> list[Tracker]:
    return [hook for hook in getattr(trainer, "hooks", ()) if isinstance(hook, Tracker)]


def _has_evaluation(trainer: Any) -> bool:
    return bool(trainer.last_eval_results) or any(
        isinstance(h, EvalHook) for h in getattr(trainer, "hooks", ())
    )


def _format_done(trainer: Any, seconds: float) -> list[str]:
    """The first line (iterations, wall time, s/it) and the final evaluation's table, if there was one."""
    iterations = trainer.iter - trainer.start_iter
    speed = _describe_speed(trainer, iterations)
    done = f"Done: {iterations} iterations in {datetime.timedelta(seconds=round(seconds))}"
    if iterations == 0 and trainer.iter > 0:
        done = f"Done: no iteration left to train (resumed at {trainer.start_iter}); {datetime.timedelta(seconds=round(seconds))}"
    if not _has_evaluation(trainer):
        return [f"{done} (wall time){speed}; no evaluation (train.hooks has no eval hook)."]
    return [
        f"{done} (wall time, with evaluation){speed}. Final evaluation (AP x100):",
        *_format_metrics(trainer.last_eval_results or {}),
    ]


def _list_files(
    cfg: DictConfig, output_dir: str, trackers: list[Tracker], texts: dict[str, str] | None = None
) -> list[str]:
    """One line per file of the run directory worth knowing, with what it holds (`texts` replaces some)."""
    files = {**dict(_FILES), **_EMA_FILES} if (cfg.train.get("ema") or {}).get("enabled") else dict(_FILES)
    files.update(texts or {})
    present = [(name, text) for name, text in files.items() if os.path.isfile(os.path.join(output_dir, name))]
    periodic = sorted(glob.glob(os.path.join(output_dir, "model_[0-9]*.pth")))
    if periodic:  # after model_final.pth
        at = next((i + 1 for i, (name, _) in enumerate(present) if name == "model_final.pth"), len(present))
        names = os.path.basename(periodic[-1]) + (
            f" (and {len(periodic) - 1} older)" if len(periodic) > 1 else ""
        )
        present.insert(at, (names, "periodic checkpoint"))
    for tracker in trackers:
        present += tracker.get_local_files()
    width = max((len(name) for name, _ in present), default=0)
    return [f"  {name.ljust(width)}  {text}" for name, text in present]


def format_run_summary(cfg: DictConfig, trainer: Any, seconds: float) -> str:
    """The closing block: final metrics, wall time and s/it, what each experiment tracker holds, the files in
    the run directory, what next.

    Args:
        cfg: the run's config.
        trainer: the trainer after `train` (reads ``iter``, ``start_iter``, ``storage``, ``last_eval_results``
            and its hooks).
        seconds: wall time of training and its evaluations.
    """
    output_dir = str(cfg.train.output_dir)
    trackers = _get_trackers(trainer)
    lines = _format_done(trainer, seconds)
    if trackers:
        lines.append("Tracking:")
        width = max(len(type(tracker).__name__) for tracker in trackers)
        lines += [f"  {type(t).__name__.ljust(width)}  {t.describe_outcome()}" for t in trackers]
    texts = None if _has_evaluation(trainer) else _CURVES_WITHOUT_AP
    lines += [f"Files in {output_dir}:", *_list_files(cfg, output_dir, trackers, texts)]
    config = shlex.quote(os.path.join(output_dir, "config.yaml"))
    weights = shlex.quote(os.path.join(output_dir, "model_final.pth"))
    lines += [
        f"Resume:    {resume_command(output_dir)}",
        f"Evaluate:  python -m lazytrain {config} {_eval_run_dir(output_dir)} train.eval_only=true "
        f"train.init_checkpoint={weights}",
        f"Predict:   python -m lazytrain predict {shlex.quote(output_dir)} IMAGES... predict.draw=true",
    ]
    return "\n".join(lines)


def _eval_run_dir(output_dir: str) -> str:
    """The ``hydra.run.dir`` override of an evaluation of the run in `output_dir`: a sub-folder named by the
    time (Hydra's ``now`` resolver), so that its files never replace the training's own or an earlier
    evaluation's."""
    return shlex.quote(f"hydra.run.dir={os.path.join(output_dir, EVAL_FOLDER, EVAL_FOLDER_NAME)}")


def resume_command(output_dir: str) -> str:
    """The command that continues the run in `output_dir` from its last checkpoint, with its saved config."""
    config = shlex.quote(os.path.join(output_dir, "config.yaml"))
    return f"python -m lazytrain {config} hydra.run.dir={shlex.quote(output_dir)} train.resume=true"


def log_run_summary(cfg: DictConfig, trainer: Any, seconds: float) -> None:
    """Log `format_run_summary` on the main process."""
    if comm.is_main_process() and cfg.train.get("output_dir"):
        logger.info(format_run_summary(cfg, trainer, seconds))


# ------------------------------------------------------------------------------------- evaluation only

_EVAL_FILES = {"metrics.json": "the evaluation's metrics (one JSON line)"}


def _describe_weights(cfg: DictConfig) -> str:
    weights = str(cfg.train.get("init_checkpoint") or "")
    return weights or "randomly initialised (no train.init_checkpoint)"


def format_eval_header(cfg: DictConfig, model: torch.nn.Module) -> str:
    """The lines shown before an evaluation-only run (``train.eval_only``): command, output, processes, test
    data, model and the weights evaluated.

    Args:
        cfg: the run's config.
        model: the built model (its weights loaded or not).
    """
    world_size = comm.get_world_size()
    lines = [f"  command   {os.environ[COMMAND_ENV]}"] if os.environ.get(COMMAND_ENV) else []
    lines += [
        f"  output    {cfg.train.output_dir} (full config, environment and model in log.txt)",
        f"  world     {world_size} process{'es' if world_size > 1 else ''} on {cfg.train.get('device', 'cpu')}",
        f"  data      {', '.join(_get_dataset_names(cfg, 'test')) or 'test set'}",
        f"  model     {_describe_model(model)}",
        f"  weights   {_describe_weights(cfg)}",
    ]
    fixed = _describe_fixed_ap(cfg)
    if fixed:
        lines.append(f"  metrics   {fixed}")
    return "Evaluation:\n" + "\n".join(lines)


def _describe_fixed_ap(cfg: DictConfig) -> str:
    """AP-fixed / AP-pool, their K and the model's score threshold, when the evaluator computes them ("")."""
    evaluator = OmegaConf.select(cfg, "dataloader.evaluator", default=None)
    if not isinstance(evaluator, DictConfig):
        return ""
    names = [name for key, name in (("ap_fixed", "AP-fixed"), ("ap_pool", "AP-pool")) if evaluator.get(key)]
    if not names:
        return ""
    k = evaluator.get("max_dets_per_category") or 10_000  # LVISEvaluator's default
    score = OmegaConf.select(cfg, "model.roi_heads.score_thresh", default="?")
    per_image = OmegaConf.select(cfg, "model.roi_heads.detections_per_img", default="?")
    return (
        f"AP and {' and '.join(names)}: K={k} detections per category, model.roi_heads.score_thresh={score}, "
        f"detections_per_img={per_image}"
    )


def format_eval_summary(cfg: DictConfig, results: dict, seconds: float) -> str:
    """The closing block of an evaluation-only run: the evaluation's table (as training's closing block has
    it), its wall time and the files written.

    Args:
        cfg: the run's config.
        results: the evaluation's results, ``{task: {metric: float}}``.
        seconds: wall time of the evaluation.
    """
    output_dir = str(cfg.train.output_dir)
    done = f"Done: evaluation in {datetime.timedelta(seconds=round(seconds))} (wall time)"
    lines = [f"{done}. Evaluation of {_describe_weights(cfg)} (AP x100):", *_format_metrics(results)]
    files = _list_files(cfg, output_dir, [], _EVAL_FILES)
    return "\n".join([*lines, f"Files in {output_dir}:", *files])


def log_eval_header(cfg: DictConfig, model: torch.nn.Module) -> None:
    """Log `format_eval_header` on the main process."""
    if comm.is_main_process():
        logger.info(format_eval_header(cfg, model))


def log_eval_summary(cfg: DictConfig, results: dict, seconds: float) -> None:
    """Log `format_eval_summary` on the main process."""
    if comm.is_main_process() and cfg.train.get("output_dir"):
        logger.info(format_eval_summary(cfg, results, seconds))
