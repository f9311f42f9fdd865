"""Reading what runs and sweeps wrote: metrics, overrides, per-category AP; finding a sweep's runs and the key
it varies. Used by the end-of-run report, the sweep summary and the ``scripts/plot_*.py`` tools.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from lazytrain.utils.events import parse_metrics_line

__all__ = [
    "DEFAULT_EVAL_METRICS",
    "SWEEP_METRICS",
    "HydraJob",
    "read_hydra_job",
    "read_metrics",
    "read_overrides",
    "get_run_dirs",
    "get_run_labels",
    "get_override_value",
    "get_last_values",
    "get_swept_key",
    "get_sweep_points",
    "is_number",
    "read_per_category_ap",
]

logger = logging.getLogger(__name__)


def read_metrics(run_dir: str) -> list[dict]:
    """The JSON lines of ``<run_dir>/metrics.json`` (``null`` values as NaN: `parse_metrics_line`); a truncated
    last line (run still writing) is skipped."""
    path = os.path.join(run_dir, "metrics.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"no metrics.json in run directory {run_dir}; pass a training output directory."
        )
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(parse_metrics_line(line))
            except json.JSONDecodeError:
                logger.warning("Skipping unreadable line %d of %s", number, path)
    return records


def read_overrides(run_dir: str) -> list[str]:
    """The Hydra overrides of a run (``.hydra/overrides.yaml``), or [] when it has none."""
    import yaml

    path = os.path.join(run_dir, ".hydra", "overrides.yaml")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [str(o) for o in (yaml.safe_load(f) or [])]


@dataclass
class HydraJob:
    """What Hydra recorded about the job that wrote a run directory.

    Attributes:
        name: the job's name (lazytrain names it after the config file: ``rfs_maskrcnn_demo``).
        sweep_dir: the sweep's directory when the job is one of a sweep (``-m``), else None.
    """

    name: str
    sweep_dir: str | None


def read_hydra_job(run_dir: str) -> HydraJob | None:
    """The Hydra job of `run_dir`, read from ``.hydra/hydra.yaml``; None when Hydra wrote none (a run started
    without Hydra, ``hydra.output_subdir=null``) or it cannot be read.

    Spawned ranks have no Hydra of their own: this file is how they learn what the Hydra process knew. A sweep
    job's directory is ``hydra.sweep.dir/hydra.sweep.subdir``; the sweep directory is what remains of it
    without the subdirectory (the parent when the subdirectory cannot be worked out).
    """
    from omegaconf import OmegaConf

    path = os.path.join(run_dir, ".hydra", "hydra.yaml")
    try:
        hydra = OmegaConf.load(path).hydra
        name, mode = str(hydra.job.name), str(hydra.mode)
    except Exception:  # absent, unreadable, or not written by a Hydra we know
        return None
    if mode != "MULTIRUN":
        return HydraJob(name, None)
    job_dir = os.path.normpath(os.path.abspath(run_dir))
    try:
        subdir = os.path.normpath(str(hydra.sweep.subdir))  # ``${hydra.job.num}`` resolves within the file
    except Exception:
        subdir = os.path.basename(job_dir)
    if job_dir.endswith(os.sep + subdir):
        return HydraJob(name, job_dir[: -len(subdir) - 1])
    return HydraJob(name, os.path.dirname(job_dir))


def get_run_dirs(paths: Sequence[str]) -> list[str]:
    """Expand run or sweep directories into run directories (a sweep's job subdirectories in job order).

    A directory with ``metrics.json`` is a run; otherwise its subdirectories holding one are its jobs.
    """
    runs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "metrics.json")):
            runs.append(path)
            continue
        jobs = (
            [d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, "metrics.json"))]
            if os.path.isdir(path)
            else []
        )
        if not jobs:
            raise FileNotFoundError(
                f"{path} is neither a run directory (metrics.json) nor a sweep directory (<job>/metrics.json)."
            )
        jobs.sort(key=lambda d: (0, int(d), d) if d.isdigit() else (1, 0, d))
        runs.extend(os.path.join(path, d) for d in jobs)
    return runs


def get_run_labels(run_dirs: Sequence[str]) -> list[str]:
    """Legend labels: the overrides that differ between runs, else the directory names."""
    overrides = [read_overrides(d) for d in run_dirs]
    common = set.intersection(*(set(o) for o in overrides)) if len(overrides) > 1 else set()
    labels = []
    for run_dir, own in zip(run_dirs, overrides):
        distinct = [o for o in own if o not in common]
        labels.append(" ".join(distinct) or os.path.basename(os.path.normpath(run_dir)))
    return labels


DEFAULT_EVAL_METRICS = ("AP", "APr", "APc", "APf")


def get_override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value given to `key` in ``key=value`` override strings (also ``+key=``/``++key=``), or None."""
    for override in overrides:
        name, sep, value = override.partition("=")
        if sep and name.lstrip("+~") == key:
            return value
    return None


def get_last_values(records: Sequence[dict], keys: Sequence[str]) -> dict[str, float]:
    """The last logged value of each key present in `records`."""
    values = {}
    for record in records:
        values.update({k: record[k] for k in keys if k in record})
    return values


SWEEP_METRICS = tuple(f"{task}/{name}" for task in ("segm", "bbox") for name in DEFAULT_EVAL_METRICS)


_SEED_KEY = "train.seed"


def get_swept_key(overrides: Sequence[Sequence[str]]) -> str | None:
    """The config key a sweep varies (other than ``train.seed``): the first whose values are all numbers,
    else the first that varies; None when only the seed (or nothing) varies.

    Args:
        overrides: each run's override strings (`read_overrides`).
    """
    values: dict[str, set[str]] = {}
    for run in overrides:
        for override in run:
            key, sep, value = override.lstrip("+~").partition("=")
            if sep and key != _SEED_KEY:
                values.setdefault(key, set()).add(value)
    varying = [key for key, seen in values.items() if len(seen) > 1]
    numeric = [key for key in varying if all(is_number(v) for v in values[key])]
    return (numeric or varying or [None])[0]


def get_sweep_points(
    run_dirs: Sequence[str], x_key: str, metrics: Sequence[str] = SWEEP_METRICS
) -> dict[str, list[tuple[str, float]]]:
    """`plot_sweep`'s input from run directories: metric -> [(value of `x_key`, final metric value), ...].

    Runs with the same `x_key` value (e.g. different ``train.seed``) give several points at that value. When
    other keys vary too, each of their settings is its own series, named ``metric (key=value ...)``.
    Runs without the override or a metric contribute nothing to it.
    """
    overrides = [read_overrides(d) for d in run_dirs]
    shared = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    points: dict[str, list[tuple[str, float]]] = {}
    for run_dir, own in zip(run_dirs, overrides):
        x = get_override_value(own, x_key)
        if x is None:
            continue
        others = " ".join(
            o for o in own if o not in shared and o.lstrip("+~").split("=", 1)[0] not in (x_key, _SEED_KEY)
        )
        for key, value in get_last_values(read_metrics(run_dir), metrics).items():
            points.setdefault(f"{key} ({others})" if others else key, []).append((x, float(value)))
    return points


def is_number(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


# Files the COCO/LVIS evaluators write after each evaluation (lazytrain.evaluation.coco_evaluation).
_PER_CATEGORY_FILES = ("lvis_per_category_ap.csv", "coco_per_category_ap.csv")


def read_per_category_ap(run_dir: str) -> list[dict] | None:
    """Rows of the run's ``lvis_per_category_ap.csv`` (else ``coco_per_category_ap.csv``), or None if absent.

    Returns:
        One dict per category: ``id`` (json id), ``name``, ``frequency`` (``"r"/"c"/"f"`` or ``""``),
        ``train_images`` (int, or None when the file has no count) and ``<task>_AP`` floats (NaN when the
        category has no ground truth in the evaluated images), e.g. ``segm_AP``, ``bbox_AP``.
    """
    import csv

    for name in _PER_CATEGORY_FILES:
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            with open(path, newline="") as f:
                return [_parse_per_category_row(row) for row in csv.DictReader(f)]
    return None


def _parse_per_category_row(row: dict[str, str]) -> dict:
    parsed: dict = {"id": int(row["id"]), "name": row.get("name", ""), "frequency": row.get("frequency", "")}
    count = row.get("train_images", "")
    parsed["train_images"] = int(float(count)) if count not in ("", None) else None
    parsed.update({key: float(value) for key, value in row.items() if key.endswith("_AP")})
    return parsed
