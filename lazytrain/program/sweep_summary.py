"""The multirun summary: a Hydra callback writing ``summary.csv`` and ``summary.md`` at the sweep root.

One row per job: the overrides that differ between jobs, status (ok/failed), wall time and the final metrics (every
``*/AP*`` key of the last evaluation in the job's ``metrics.json``; mask before box, and AP, APr, APc, APf first);
``summary.csv`` ends with each failed job's reason, and summary.md lists the failed jobs with theirs under the table.
When the sweep varies ``train.seed``, a second table (in summary.md, and ``summary_seeds.csv``) has one row per
setting of the other overrides: the number of seeds and each metric's mean, min, max and standard deviation.
``summary.png`` plots the final AP, APr, APc, APf (mask and box) against the swept numeric key, seeds as error
bars. Registered automatically by the entrypoint.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from typing import Any

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from lazytrain.engine.plot_writer import write_sweep_plots
from lazytrain.program.objective import FailedJobValue
from lazytrain.utils.events import parse_metrics_line
from lazytrain.utils.plots import plot_sweep
from lazytrain.utils.run_dirs import get_sweep_points, get_swept_key

__all__ = [
    "SweepSummaryCallback",
    "aggregate_seeds",
    "collect_sweep",
    "list_failures",
    "read_final_metrics",
    "write_summary",
    "write_summary_plot",
]

logger = logging.getLogger(__name__)
_STATUS_FILE = "lazytrain_job.json"
_NO_RECORD = "no record of the job's end (the process was killed, or the job is still running)"
_REASON_CHARACTERS = 300


def read_final_metrics(output_dir: str) -> dict[str, float]:
    """The newest value of every evaluation metric (keys containing ``/AP``) in ``metrics.json``."""
    path = os.path.join(output_dir, "metrics.json")
    metrics: dict[str, float] = {}
    if not os.path.exists(path):
        return metrics
    with open(path) as f:
        for line in f:
            try:
                record = parse_metrics_line(line)  # null (a non-finite value) as NaN
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
        status = {"status": "failed", "seconds": float("nan"), "reason": _NO_RECORD}
        if os.path.exists(os.path.join(job_dir, _STATUS_FILE)):
            with open(os.path.join(job_dir, _STATUS_FILE)) as f:
                status = json.load(f)
        row = {"job": job, "overrides": overrides, "reason": "", **status, **read_final_metrics(job_dir)}
        rows.append(row)
    # Overrides shared by every job (e.g. hydra/launcher=..., launch.num_processes=1) are noise in a table
    # that compares jobs: show only those that vary.
    shared = set.intersection(*(set(r["overrides"]) for r in rows)) if len(rows) > 1 else set()
    for row in rows:
        row["override_list"] = [o for o in row["overrides"] if o not in shared]
        row["overrides"] = " ".join(row["override_list"])
    return rows


SEED_KEY = "train.seed"


def _is_seed_override(override: str) -> bool:
    return override.lstrip("+~").split("=", 1)[0] == SEED_KEY


def aggregate_seeds(rows: list[dict[str, Any]], metric_keys: list[str]) -> list[dict[str, Any]]:
    """One row per setting of the overrides other than ``train.seed``: mean, min, max and standard deviation
    (sample, n-1) of every metric over that setting's successful jobs.

    Args:
        rows: from `collect_sweep`.
        metric_keys: the metrics to aggregate.

    Returns:
        ``[]`` when no job overrides ``train.seed``; else dicts with ``overrides`` (without the seed),
        ``seeds`` (successful jobs), ``failed`` and, per metric, ``<metric>`` (the mean) and
        ``<metric> min`` / ``<metric> max`` / ``<metric> std``, in first-seen order of the settings.
    """
    if not any(_is_seed_override(o) for row in rows for o in row["override_list"]):
        return []
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        setting = " ".join(o for o in row["override_list"] if not _is_seed_override(o))
        groups.setdefault(setting, []).append(row)
    aggregated = []
    for setting, jobs in groups.items():
        ok = [job for job in jobs if job["status"] == "ok"]
        summary: dict[str, Any] = {"overrides": setting, "seeds": len(ok), "failed": len(jobs) - len(ok)}
        for key in metric_keys:
            values = [float(job[key]) for job in ok if key in job]
            if values:
                summary.update(_describe(key, values))
        aggregated.append(summary)
    return aggregated


def _describe(key: str, values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    spread = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return {key: mean, f"{key} min": min(values), f"{key} max": max(values), f"{key} std": spread**0.5}


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
        writer = csv.DictWriter(f, fieldnames=[*columns, "reason"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    table = _markdown_table(columns, [[_format(r.get(c, "")) for c in columns] for r in rows])
    failures = list_failures(rows)
    if failures:
        table += "\nFailed jobs:\n" + "".join(f"- {line}\n" for line in failures)
    seeds = aggregate_seeds(rows, metric_keys)
    if seeds:
        table += "\n" + _write_seeds_table(sweep_dir, seeds, metric_keys)
    with open(os.path.join(sweep_dir, "summary.md"), "w") as f:
        f.write(table)
    return table, rows


def list_failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per failed job: ``job N (its overrides): reason``, the reason on one line and shortened."""
    lines = []
    for row in rows:
        if row["status"] == "ok":
            continue
        reason = " ".join(str(row.get("reason") or "no reason recorded").split())
        if len(reason) > _REASON_CHARACTERS:
            reason = reason[: _REASON_CHARACTERS - 3] + "..."
        overrides = f" ({row['overrides']})" if row["overrides"] else ""
        lines.append(f"job {row['job']}{overrides}: {reason}")
    return lines


def _markdown_table(columns: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def _write_seeds_table(sweep_dir: str, seeds: list[dict[str, Any]], metric_keys: list[str]) -> str:
    """summary_seeds.csv (mean, min, max, std columns per metric); returns the markdown table: mean (min-max)."""
    stats = [f"{key}{suffix}" for key in metric_keys for suffix in ("", " min", " max", " std")]
    with open(os.path.join(sweep_dir, "summary_seeds.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["overrides", "seeds", "failed", *stats], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(seeds)
    columns = ["overrides", "seeds", "failed", *metric_keys]
    cells = [
        [row["overrides"], str(row["seeds"]), str(row["failed"])]
        + [_format_spread(row, key) for key in metric_keys]
        for row in seeds
    ]
    title = f"Mean (min-max) over {SEED_KEY}, per setting of the other overrides (summary_seeds.csv):\n\n"
    return title + _markdown_table(columns, cells)


def _format_spread(row: dict[str, Any], key: str) -> str:
    if key not in row:
        return ""
    return f"{row[key]:.2f} ({row[key + ' min']:.2f}-{row[key + ' max']:.2f})"


def write_summary_plot(sweep_dir: str, rows: list[dict[str, Any]]) -> str | None:
    """summary.png: the final AP, APr, APc, APf (mask and box) of the successful jobs against the swept
    numeric key, seeds as min-max error bars (`lazytrain.utils.plots.build_sweep_figure`).

    Returns:
        The image path, or None (logged) when there is nothing to draw.
    """
    run_dirs = [os.path.join(sweep_dir, row["job"]) for row in rows if row["status"] == "ok"]
    x_key = get_swept_key([row["override_list"] for row in rows])
    points = get_sweep_points(run_dirs, x_key) if x_key else {}
    if not any(points.values()):
        logger.info("No summary.png: no swept key other than train.seed, or no job with final AP metrics.")
        return None
    return plot_sweep(points, x_key, os.path.join(sweep_dir, "summary.png"))


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
    """Records each sweep job's status and wall time; at the end of a multirun writes and prints the summary.

    Args:
        result_file: where to write ``{"failed_jobs": N, "failures": [line per failed job]}`` at the end of a
            multirun, for the process that started Hydra (the entrypoint exits non-zero on failed jobs and
            names them); "" writes none.
    """

    def __init__(self, result_file: str = "") -> None:
        self.result_file = result_file

    def on_job_start(self, config, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        # Only a sweep's summary reads the record. A single run leaves its folder as it was: Hydra 1.4 also
        # ends a run that stopped in preflight (SystemExit) here, which would overwrite a trained run's record.
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        output_dir = config.hydra.runtime.output_dir
        failed = job_return.status != JobStatus.COMPLETED or isinstance(
            job_return.return_value, FailedJobValue
        )
        seconds = time.perf_counter() - getattr(self, "_start", time.perf_counter())
        status = {"status": "failed" if failed else "ok", "seconds": round(seconds, 1)}
        if failed:
            status["reason"] = _failure_reason(job_return)
        with open(os.path.join(output_dir, _STATUS_FILE), "w") as f:
            json.dump(status, f)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        if os.path.isdir(sweep_dir):
            table, rows = write_summary(sweep_dir)
            print(f"\nSweep summary ({sweep_dir}/summary.md):\n{table}")
            try:
                write_summary_plot(sweep_dir, rows)
            except Exception as e:  # a picture must not fail a sweep whose jobs and tables are done
                logger.warning("No summary.png: plotting failed: %s: %s", type(e).__name__, e)
            failed_jobs = _count_failures(config, rows)
            self._write_result(failed_jobs, list_failures(rows) if failed_jobs else [])
            write_sweep_plots(sweep_dir)  # per-category AP of every job in one ap_by_frequency.png

    def _write_result(self, failed_jobs: int, failures: list[str]) -> None:
        if self.result_file:
            with open(self.result_file, "w") as f:
                json.dump({"failed_jobs": failed_jobs, "failures": failures}, f)


def _failure_reason(job_return) -> str:
    """Why a job failed: the reason its `FailedJobValue` carries, or the exception Hydra caught from it."""
    if job_return.status == JobStatus.COMPLETED:
        return job_return.return_value.reason
    error = job_return._return_value  # the `return_value` property raises it
    return f"{type(error).__name__}: {error}"
