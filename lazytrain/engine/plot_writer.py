"""Plots in a run directory: ``curves.png`` (losses, learning rate and AP over iterations) and
``ap_by_frequency.png`` (AP per category against its train images), written by the `PlotWriter` hook after each
evaluation and at the end of training, and the sweep overlay `write_sweep_plots`. Everything here writes on
the main process only.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lazytrain.data.common import DatasetFromList
from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.engine.train_loop import HookBase
from lazytrain.utils import comm, plots, run_dirs

__all__ = [
    "AP_BY_FREQUENCY_FILE",
    "CURVES_FILE",
    "PlotWriter",
    "RecordsSummary",
    "get_train_records",
    "summarize_records",
    "write_run_plots",
    "write_sweep_plots",
]

logger = logging.getLogger(__name__)

CURVES_FILE = "curves.png"
AP_BY_FREQUENCY_FILE = "ap_by_frequency.png"


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
    """Images, instances and images per category of `records` (one pass; a `DatasetFromList` works too).
    Records in a json's cache file are counted from its arrays, without decoding a record."""
    cached = records.cached_records if isinstance(records, DatasetFromList) else records
    if isinstance(cached, CachedRecords):
        _, categories, instances = cached.get_category_csr()
        counts = np.bincount(categories)
        return RecordsSummary(
            len(cached), int(instances.sum()), {int(c): int(n) for c, n in enumerate(counts) if n}
        )
    image_counts: Counter = Counter()
    instances = 0
    for index in range(len(records)):
        categories = [annotation["category_id"] for annotation in records[index].get("annotations", ())]
        instances += len(categories)
        image_counts.update(set(categories))
    return RecordsSummary(len(records), instances, dict(image_counts))


def get_train_records(data_loader: Any) -> Sequence[dict] | None:
    """The records behind a train loader built by `build_detection_train_loader` (None for other loaders)."""
    records = getattr(getattr(data_loader, "dataset", None), "dataset", None)
    return records if hasattr(records, "__len__") and hasattr(records, "__getitem__") else None


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
    if len(jobs) < 2:
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
            records = get_train_records(self.trainer.data_loader)
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
