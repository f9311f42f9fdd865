"""The multirun summary: a Hydra callback writing ``summary.csv`` and ``summary.md`` at the sweep root.

One row per job: the overrides that differ between jobs, status (ok/failed), wall time and the final metrics (every
``*/AP*`` key of the last evaluation in the job's ``metrics.json``; mask before box, and AP, APr, APc, APf first).
Registered automatically by the entrypoint.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from typing import Any

from hydra.experimental.callback import Callback

__all__ = ["SweepSummaryCallback", "collect_sweep", "read_final_metrics"]

logger = logging.getLogger(__name__)
_STATUS_FILE = "lazytrain_job.json"
# Set at the end of each multirun (in the process that ran the sweep); the entrypoint exits non-zero on it.
failed_jobs_of_last_sweep = 0


def read_final_metrics(output_dir: str) -> dict[str, float]:
    """The newest value of every evaluation metric (keys containing ``/AP``) in ``metrics.json``."""
    path = os.path.join(output_dir, "metrics.json")
    metrics: dict[str, float] = {}
    if not os.path.exists(path):
        return metrics
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            metrics.update({k: v for k, v in record.items() if "/AP" in k})
    return metrics


def collect_sweep(sweep_dir: str) -> list[dict[str, Any]]:
    """Rows of the sweep's jobs, in job-number order.

    Args:
        sweep_dir: the sweep root (``hydra.sweep.dir``).

    Returns:
        One dict per job: ``job``, ``overrides`` (those that differ between jobs), ``status``, ``seconds``
        and the job's final ``*/AP*`` metrics.
    """
    import yaml

    rows = []
    jobs = [
        d
        for d in os.listdir(sweep_dir)
        if os.path.isfile(os.path.join(sweep_dir, d, ".hydra", "overrides.yaml"))
    ]
    for job in sorted(jobs, key=lambda d: (len(d), d)):
        job_dir = os.path.join(sweep_dir, job)
        with open(os.path.join(job_dir, ".hydra", "overrides.yaml")) as f:
            overrides = yaml.safe_load(f) or []
        status = {"status": "failed", "seconds": float("nan")}
        if os.path.exists(os.path.join(job_dir, _STATUS_FILE)):
            with open(os.path.join(job_dir, _STATUS_FILE)) as f:
                status = json.load(f)
        rows.append({"job": job, "overrides": overrides, **status, **read_final_metrics(job_dir)})
    # Overrides shared by every job (e.g. hydra/launcher=..., launch.num_processes=1) are noise in a table
    # that compares jobs: show only those that vary.
    shared = set.intersection(*(set(r["overrides"]) for r in rows)) if len(rows) > 1 else set()
    for row in rows:
        row["overrides"] = " ".join(o for o in row["overrides"] if o not in shared)
    return rows


# The long-tail question first: AP and the frequency buckets, then the COCO breakdowns.
_METRIC_ORDER = ("AP", "APr", "APc", "APf", "AP50", "AP75", "APs", "APm", "APl")


def _metric_order(key: str) -> tuple:
    """Mask metrics before box metrics; within a task AP, APr, APc, APf, then the rest."""
    task, _, name = key.partition("/")
    rank = _METRIC_ORDER.index(name) if name in _METRIC_ORDER else len(_METRIC_ORDER)
    return (task != "segm", task, rank, name)


def _format(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def write_summary(sweep_dir: str) -> tuple[str, list[dict[str, Any]]]:
    """Write summary.csv/summary.md for `sweep_dir`.

    Args:
        sweep_dir: the sweep root (``hydra.sweep.dir``), holding one directory per job.

    Returns:
        The markdown table and the rows (one dict per job).
    """
    rows = collect_sweep(sweep_dir)
    metric_keys = sorted({k for r in rows for k in r if "/AP" in k}, key=_metric_order)
    columns = ["job", "overrides", "status", "seconds", *metric_keys]
    with open(os.path.join(sweep_dir, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_format(r.get(c, "")) for c in columns) + " |" for r in rows]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(sweep_dir, "summary.md"), "w") as f:
        f.write(table)
    return table, rows


def _count_failures(config, rows: list[dict[str, Any]]) -> int:
    """Failed jobs that make the command fail: any in a grid sweep; in a search (Optuna, ...) only when every
    trial failed, since a failed trial was told to the sweeper as the worst objective value."""
    failed = sum(row["status"] != "ok" for row in rows)
    is_grid = str(config.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper")
    if failed and not is_grid and failed < len(rows):
        logger.warning(
            "%d of %d trials failed; the sweeper scored them with the worst objective value and searched on.",
            failed,
            len(rows),
        )
        return 0
    return failed


class SweepSummaryCallback(Callback):
    """Records each job's status and wall time; at the end of a multirun writes and prints the summary."""

    def on_job_start(self, config, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        from lazytrain.launch.objective import FailedJobValue

        output_dir = config.hydra.runtime.output_dir
        failed = job_return.status != JobStatus.COMPLETED or isinstance(
            job_return.return_value, FailedJobValue
        )
        status = "failed" if failed else "ok"
        seconds = time.perf_counter() - getattr(self, "_start", time.perf_counter())
        with open(os.path.join(output_dir, _STATUS_FILE), "w") as f:
            json.dump({"status": status, "seconds": round(seconds, 1)}, f)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        global failed_jobs_of_last_sweep
        sweep_dir = config.hydra.sweep.dir
        if os.path.isdir(sweep_dir):
            table, rows = write_summary(sweep_dir)
            print(f"\nSweep summary ({sweep_dir}/summary.md):\n{table}")
            failed_jobs_of_last_sweep = _count_failures(config, rows)
