"""What a run tells its user: a short header before the first step, plots in the run directory, and a
closing summary (final metrics, time, the files written and the commands to resume or evaluate).

The console shows the header and the summary; the full config, the environment and the model's repr go to
``log.txt`` only (DEBUG level), and ``train.verbose=true`` prints them on the console too. `PlotWriter` (a
hook of the default recipe) writes ``curves.png`` and ``ap_by_frequency.png`` after each evaluation and at
the end of training; without matplotlib it logs one warning and writes nothing. Everything here logs on the
main process only.
"""

from __future__ import annotations

import datetime
import glob
import logging
import math
import os
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm, plots, run_dirs

__all__ = [
    "COMMAND_ENV",
    "PlotWriter",
    "RecordsSummary",
    "format_run_header",
    "format_run_summary",
    "summarize_records",
    "write_run_plots",
    "write_sweep_plots",
]

logger = logging.getLogger(__name__)

# The entrypoint puts the command line here, so that ranks (spawned or not) can show it in the header.
COMMAND_ENV = "LAZYTRAIN_COMMAND"
CURVES_FILE = "curves.png"
AP_BY_FREQUENCY_FILE = "ap_by_frequency.png"
_BUCKET_NAMES = {"r": "rare", "c": "common", "f": "frequent"}


@dataclass
class RecordsSummary:
    """Counts of a list of dataset records.

    Attributes:
        images: number of records.
        instances: number of annotations.
        image_counts: contiguous category id -> number of images containing it (categories seen only).
    """

    images: int
    instances: int
    image_counts: dict[int, int]


def summarize_records(records: Sequence[dict]) -> RecordsSummary:
    """Images, instances and images per category of `records` (one pass; a `DatasetFromList` works too)."""
    image_counts: Counter = Counter()
    instances = 0
    for index in range(len(records)):
        categories = [annotation["category_id"] for annotation in records[index].get("annotations", ())]
        instances += len(categories)
        image_counts.update(set(categories))
    return RecordsSummary(len(records), instances, dict(image_counts))


def _get_train_records(data_loader: Any) -> Sequence[dict] | None:
    """The records behind a train loader built by `build_detection_train_loader` (None for other loaders)."""
    records = getattr(getattr(data_loader, "dataset", None), "dataset", None)
    return records if hasattr(records, "__len__") and hasattr(records, "__getitem__") else None


# ------------------------------------------------------------------------------------------------- header


def _get_train_dataset_names(cfg: DictConfig) -> list[str]:
    """``dataloader.train.dataset.names`` as a list; a registering call (e.g. ``register_json_dataset``)
    gives its ``name`` argument."""
    names = OmegaConf.select(cfg, "dataloader.train.dataset.names", default=None)
    if OmegaConf.is_dict(names):
        names = names.get("name")
    if names is None:
        return []
    return [str(name) for name in names] if OmegaConf.is_list(names) else [str(names)]


def _describe_data(cfg: DictConfig, summary: RecordsSummary | None) -> str:
    from lazytrain.data.catalog import MetadataCatalog
    from lazytrain.data.datasets.lvis import frequency_of_image_count

    names = _get_train_dataset_names(cfg)
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
    size = getattr(sampler, "size", None)
    name = type(sampler).__name__ if sampler is not None else "unknown sampler"
    return (f"{name}: epoch {size} images" if size else name), size


def _describe_schedule(cfg: DictConfig, epoch: float | None) -> str:
    train = cfg.train
    batch = OmegaConf.select(cfg, "dataloader.train.total_batch_size", default=None)
    text = f"{train.max_iter} iterations"
    if batch:
        text += f" x {batch} images"
        if epoch:
            text += f" ({train.max_iter * batch / epoch:.2f} epochs)"
    optimizer = OmegaConf.select(cfg, "optimizer._target_", default="")
    lr = OmegaConf.select(cfg, "optimizer.lr", default=None)
    if optimizer:
        text += f"; {str(optimizer).rsplit('.', 1)[-1]} lr {lr}"
    multiplier = OmegaConf.select(cfg, "lr_multiplier._target_", default="")
    if multiplier:
        warmup = OmegaConf.select(cfg, "lr_multiplier.warmup_iters", default=None)
        text += f" x {str(multiplier).rsplit('.', 1)[-1]}" + (f" (warmup {warmup})" if warmup else "")
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
    parameters = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
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
        f"  data      {_describe_data(cfg, summary)}",
        f"  sampler   {sampler}",
        f"  model     {type(_unwrap(trainer.model)).__name__}: {parameters / 1e6:.1f}M parameters "
        f"({trainable / 1e6:.1f}M trainable)",
        f"  schedule  {_describe_schedule(cfg, epoch)}",
    ]
    return "Run:\n" + "\n".join(lines)


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def log_run_header(cfg: DictConfig, trainer: Any) -> None:
    """Log `format_run_header` on the main process, after one pass over the train records to count them
    (each record unpickled once: 8.5 s for 100k LVIS-like records with 1.2M annotations, measured on a busy
    2-core machine; negligible for the demo's 1000)."""
    if not comm.is_main_process():
        return
    records = _get_train_records(trainer.data_loader)
    summary = summarize_records(records) if records is not None else None
    logger.info(format_run_header(cfg, trainer, summary))


# ------------------------------------------------------------------------------------------------ summary

_FILES = (  # (file name, what it holds), in the order the summary lists them
    ("metrics.json", "losses, learning rate and evaluations, one JSON line per logged iteration"),
    ("lvis_per_category_ap.csv", "AP per category with its frequency bucket and train images (also .md)"),
    ("coco_per_category_ap.csv", "AP per category (also .md)"),
    ("model_final.pth", "final weights (last_checkpoint names the newest checkpoint)"),
    ("model_best.pth", "weights of the best evaluation"),
    ("config.yaml", "the full config; runs again as CONFIG"),
    (CURVES_FILE, "losses, learning rate and AP over iterations"),
    (AP_BY_FREQUENCY_FILE, "AP per category against its train images, rare/common/frequent"),
    ("log.txt", "the full log, with the config, environment and model"),
)


def _format_metrics(results: dict) -> list[str]:
    """A small aligned table: one row per task (mask first), AP then APr/APc/APf (or AP50/AP75)."""
    tasks = sorted((t for t in results if isinstance(results[t], dict)), key=lambda t: (t != "segm", t))
    if not tasks:
        return ["  no evaluation results"]
    names = run_dirs.DEFAULT_EVAL_METRICS if "APr" in results[tasks[0]] else ("AP", "AP50", "AP75")
    rows = [["", *names]]
    for task in tasks:
        label = {"segm": "mask", "bbox": "box"}.get(task, task)
        rows.append([label, *(_format_value(results[task].get(name)) for name in names)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(names) + 1)]
    return ["  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]


def _format_value(value: Any) -> str:
    if value is None:
        return "-"
    return "nan" if math.isnan(float(value)) else f"{float(value):.1f}"


def _seconds_per_iteration(trainer: Any) -> float | None:
    """Mean step time after the first 3 steps (the `IterationTimer` warm-up), from the event storage."""
    storage = getattr(trainer, "storage", None)
    if storage is None or "time" not in storage.histories():
        return None
    times = [value for value, _ in storage.history("time").values()]
    counted = times[3:] if len(times) > 3 else times
    return sum(counted) / len(counted) if counted else None


def format_run_summary(cfg: DictConfig, trainer: Any, seconds: float) -> str:
    """The closing block: final metrics, wall time and s/it, the files in the run directory, what next.

    Args:
        cfg: the run's config.
        trainer: the trainer after `train` (reads ``iter``, ``start_iter``, ``storage``, ``last_eval_results``).
        seconds: wall time of training and its evaluations.
    """
    output_dir = str(cfg.train.output_dir)
    per_iteration = _seconds_per_iteration(trainer)
    speed = f", {per_iteration:.2f} s/it" if per_iteration else ""
    steps = trainer.iter - trainer.start_iter
    lines = [
        f"Done: {steps} iterations in {datetime.timedelta(seconds=round(seconds))} (wall time, with "
        f"evaluation){speed}. Final evaluation (AP x100):",
        *_format_metrics(trainer.last_eval_results or {}),
        f"Files in {output_dir}:",
    ]
    present = [(name, text) for name, text in _FILES if os.path.isfile(os.path.join(output_dir, name))]
    periodic = sorted(glob.glob(os.path.join(output_dir, "model_[0-9]*.pth")))
    if periodic:  # after model_final.pth
        at = next((i + 1 for i, (name, _) in enumerate(present) if name == "model_final.pth"), len(present))
        names = os.path.basename(periodic[-1]) + (
            f" (and {len(periodic) - 1} older)" if len(periodic) > 1 else ""
        )
        present.insert(at, (names, "periodic checkpoint"))
    width = max((len(name) for name, _ in present), default=0)
    lines += [f"  {name.ljust(width)}  {text}" for name, text in present]
    config = shlex.quote(os.path.join(output_dir, "config.yaml"))
    weights = shlex.quote(os.path.join(output_dir, "model_final.pth"))
    lines += [
        f"Resume:    python -m lazytrain {config} hydra.run.dir={shlex.quote(output_dir)} train.resume=true",
        f"Evaluate:  python -m lazytrain {config} train.eval_only=true train.init_checkpoint={weights}",
    ]
    return "\n".join(lines)


def log_run_summary(cfg: DictConfig, trainer: Any, seconds: float) -> None:
    """Log `format_run_summary` on the main process."""
    if comm.is_main_process() and cfg.train.get("output_dir"):
        logger.info(format_run_summary(cfg, trainer, seconds))


# -------------------------------------------------------------------------------------------------- plots

_missing_matplotlib_warned = False


def _has_matplotlib() -> bool:
    """Whether matplotlib imports; logs one warning per process when it does not."""
    global _missing_matplotlib_warned
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if not _missing_matplotlib_warned:
            _missing_matplotlib_warned = True
            logger.warning(
                "matplotlib is not installed: no %s or %s in the run directory (pip install matplotlib).",
                CURVES_FILE,
                AP_BY_FREQUENCY_FILE,
            )
        return False
    return True


def _fill_train_counts(rows: list[dict], image_counts: dict[int, int] | None) -> None:
    """Give rows without a train image count (COCO-style json) the count from the train records, matching
    contiguous ids to the rows' sorted json ids (the evaluators' default mapping)."""
    if not image_counts or any(row["train_images"] is not None for row in rows):
        return
    for index, row in enumerate(sorted(rows, key=lambda r: r["id"])):
        row["train_images"] = image_counts.get(index)


def write_run_plots(run_dir: str, image_counts: dict[int, int] | None = None) -> list[str]:
    """Write ``curves.png`` (from ``metrics.json``) and ``ap_by_frequency.png`` (from the per-category AP
    file) into `run_dir`, each when its input exists. Never raises: a failure is logged as a warning.

    Args:
        run_dir: a run directory (old ones work too).
        image_counts: train images per contiguous category id, for per-category files without counts.

    Returns:
        The paths written.
    """
    if not _has_matplotlib():
        return []
    written = []
    try:
        records = (
            run_dirs.read_metrics(run_dir) if os.path.isfile(os.path.join(run_dir, "metrics.json")) else []
        )
        if any("loss" in key for record in records for key in record):
            label = os.path.basename(os.path.normpath(run_dir))
            written.append(plots.plot_metrics({label: records}, os.path.join(run_dir, CURVES_FILE)))
        rows = run_dirs.read_per_category_ap(run_dir)
        if rows:
            _fill_train_counts(rows, image_counts)
            label = os.path.basename(os.path.normpath(run_dir))
            path = os.path.join(run_dir, AP_BY_FREQUENCY_FILE)
            written.append(plots.plot_ap_by_frequency({label: rows}, path))
    except Exception as e:  # a plot must never end (or hide the error of) a training run
        logger.warning("Could not write the plots in %s: %s: %s", run_dir, type(e).__name__, e)
    return written


def write_sweep_plots(sweep_dir: str) -> str | None:
    """Overlay the per-category AP of a sweep's jobs (e.g. one colour per ``repeat_thresh``) in
    ``<sweep_dir>/ap_by_frequency.png``; needs two jobs or more with a per-category AP file.

    Returns:
        The path written, or None.
    """
    jobs = []
    for name in os.listdir(sweep_dir) if os.path.isdir(sweep_dir) else []:
        job_dir = os.path.join(sweep_dir, name)
        rows = run_dirs.read_per_category_ap(job_dir) if os.path.isdir(job_dir) else None
        if rows:
            jobs.append((job_dir, rows))
    if len(jobs) < 2 or not _has_matplotlib():
        return None
    jobs.sort(key=lambda job: (len(job[0]), job[0]))
    labels = run_dirs.get_run_labels([job_dir for job_dir, _ in jobs])
    try:
        path = plots.plot_ap_by_frequency(
            {label: rows for label, (_, rows) in zip(labels, jobs)},
            os.path.join(sweep_dir, AP_BY_FREQUENCY_FILE),
        )
    except Exception as e:
        logger.warning("Could not write the sweep's %s: %s: %s", AP_BY_FREQUENCY_FILE, type(e).__name__, e)
        return None
    logger.info("Per-category AP of the %d jobs: %s", len(jobs), path)
    return path


class PlotWriter(HookBase):
    """Write ``curves.png`` and ``ap_by_frequency.png`` into `output_dir` after each evaluation and at the end
    of training (main process; see `write_run_plots`). Place it after the writer hook, which fills
    ``metrics.json``; remove it with ``~train.hooks.plots``.

    Args:
        output_dir: the run directory (``${train.output_dir}``); empty writes nothing.
    """

    def __init__(self, output_dir: str = "") -> None:
        self.output_dir = output_dir
        self._image_counts: dict[int, int] | None = None

    def _write(self) -> None:
        if not self.output_dir or not comm.is_main_process():
            return
        rows = run_dirs.read_per_category_ap(self.output_dir)
        if rows and all(row["train_images"] is None for row in rows) and self._image_counts is None:
            records = _get_train_records(self.trainer.data_loader)
            self._image_counts = summarize_records(records).image_counts if records is not None else {}
        write_run_plots(self.output_dir, self._image_counts)

    def after_step(self) -> None:
        latest = self.trainer.storage.latest()
        evaluated = any(
            "/AP" in key and iteration == self.trainer.iter for key, (_, iteration) in latest.items()
        )
        if evaluated and self.trainer.iter + 1 < self.trainer.max_iter:
            self._write()

    def after_train(self) -> None:
        self._write()
