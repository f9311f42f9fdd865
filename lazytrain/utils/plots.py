"""Plots users look at: training curves, sweeps, and per-category AP against how often the category occurs in
training (the long-tail picture).

matplotlib is imported when a plot is made, not with this module, and renders with the Agg backend, so plots
work on machines without a display. Runs write their plots through `lazytrain.engine.plot_writer`;
``scripts/plot_*.py`` are thin wrappers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from lazytrain.utils.run_dirs import DEFAULT_EVAL_METRICS, is_number

__all__ = [
    "plot_metrics",
    "build_metrics_figure",
    "build_sweep_figure",
    "plot_sweep",
    "build_ap_by_frequency_figure",
    "plot_ap_by_frequency",
]


def _get_pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_TASK_LABELS = {"segm": "mask AP", "bbox": "box AP"}


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def _series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["iteration"], r[key]) for r in records if key in r and "iteration" in r]
    return [p[0] for p in points], [p[1] for p in points]


def plot_metrics(runs: dict[str, list[dict]], out: str, eval_metrics: Sequence[str] | None = None) -> str:
    """Write `build_metrics_figure` to `out` (PNG); returns `out`."""
    return _save_figure(_get_pyplot(), build_metrics_figure(runs, eval_metrics), out)


def build_metrics_figure(runs: dict[str, list[dict]], eval_metrics: Sequence[str] | None = None):
    """One panel per loss, one for the learning rate and one per eval task; one colour per run.

    Eval metrics of a task (``segm/AP``, ``segm/APr``, ...) share the task's panel, one marker per metric,
    on the same iteration axis as the losses.

    Args:
        runs: legend label -> records from `read_metrics` (losses there are windowed medians: smoothed).
        eval_metrics: eval keys to plot (e.g. ``["segm/AP", "segm/APr"]``); default: the AP, APr, APc and
            APf of every task, without the size/IoU breakdowns.

    Returns:
        The matplotlib Figure.
    """
    panels, tasks = _metric_panels(runs, eval_metrics)
    plt = _get_pyplot()
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False, sharex=True)
    for axis, panel in zip(axes.flat, panels):
        _draw_metric_panel(axis, panel, runs, tasks)
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    for axis in axes[-1]:
        axis.set_xlabel("iteration")
        axis.xaxis.set_tick_params(labelbottom=True)
    _lay_out_metrics_figure(figure, axes, runs)
    return figure


def _metric_panels(
    runs: dict[str, list[dict]], eval_metrics: Sequence[str] | None
) -> tuple[list[str], dict[str, list[str]]]:
    """The panel names (losses, total_loss first; ``lr``; eval tasks) and each eval task's metric keys."""
    keys = {k for records in runs.values() for r in records for k in r}
    losses = sorted((k for k in keys if "loss" in k and "/" not in k), key=lambda k: (k != "total_loss", k))
    if eval_metrics is None:
        eval_metrics = sorted(
            (k for k in keys if "/" in k and k.rsplit("/", 1)[1] in DEFAULT_EVAL_METRICS),
            key=lambda k: (k.rsplit("/", 1)[0], DEFAULT_EVAL_METRICS.index(k.rsplit("/", 1)[1])),
        )
    tasks: dict[str, list[str]] = {}
    for key in (k for k in eval_metrics if k in keys):
        tasks.setdefault(key.rsplit("/", 1)[0], []).append(key)
    panels = losses + (["lr"] if "lr" in keys else []) + list(tasks)
    if not panels:
        raise ValueError(
            f"plot_metrics: no loss, lr or eval metric found in {list(runs)}; is metrics.json empty?"
        )
    return panels, tasks


def _draw_metric_panel(axis, panel: str, runs: dict[str, list[dict]], tasks: dict[str, list[str]]) -> None:
    """One line per run: a curve for a loss or the lr; for an eval task, one marker per metric."""
    for index, (label, records) in enumerate(runs.items()):
        if panel not in tasks:
            axis.plot(*_series(records, panel), "-", color=f"C{index % 10}", label=label)
            continue
        for number, key in enumerate(tasks[panel]):  # eval metrics have a few points only: markers
            marker = _MARKERS[number % len(_MARKERS)]
            axis.plot(*_series(records, key), marker + "-", color=f"C{index % 10}", markersize=5)
    if panel in tasks:
        for number, key in enumerate(tasks[panel]):
            axis.plot([], [], _MARKERS[number % len(_MARKERS)], color="0.3", label=key.rsplit("/", 1)[1])
        axis.legend(fontsize="x-small", ncol=2)
    axis.set_title(_TASK_LABELS.get(panel, panel))
    axis.grid(alpha=0.3)


def _lay_out_metrics_figure(figure, axes: np.ndarray, runs: dict[str, list[dict]]) -> None:
    """Title a single run's figure with its name; several runs get one legend of run names below the panels."""
    if len(runs) == 1:  # a single run needs no legend: its name is the title
        figure.suptitle(next(iter(runs)))
        figure.tight_layout()
        return
    handles, labels = axes.flat[0].get_legend_handles_labels()
    legend_rows = math.ceil(len(labels) / 3)
    figure.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize="small")
    figure.tight_layout(
        rect=(0, (0.1 + 0.3 * legend_rows) / figure.get_figheight(), 1, 1)
    )  # room for the legend


def _save_figure(plt, figure, out: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


_TASK_TITLES = {"segm": "mask (segm)", "bbox": "box (bbox)"}


def build_sweep_figure(points: dict[str, list[tuple[str, float]]], x_label: str):
    """The sweep figure: one panel per task (mask, box), one line per metric through the mean over the runs
    at each swept value, min-max error bars where several runs (seeds) share a value.

    Args:
        points: metric -> [(swept value as in the override, metric value), ...] (see `get_sweep_points`).
            Numeric swept values are placed on a numeric axis (symlog when they span decades, e.g. 0,
            0.001, 0.01, 0.1); otherwise the values are categories in first-seen order.
        x_label: the swept config key.

    Returns:
        A matplotlib Figure (close it with ``matplotlib.pyplot.close``).
    """
    if not any(points.values()):
        raise ValueError(f"plot_sweep: no job has any of the metrics {list(points)}; did the jobs evaluate?")
    categories = list(dict.fromkeys(x for pairs in points.values() for x, _ in pairs))
    numeric = all(is_number(x) for x in categories)
    panels: dict[str, list[str]] = {}
    for key, pairs in points.items():
        if pairs:
            panels.setdefault(key.split("/", 1)[0] if "/" in key else "", []).append(key)
    plt = _get_pyplot()
    figure, axes = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels) + 1.2, 4.4), squeeze=False, sharey=True
    )
    repeated = any(
        len(g) > 1 for pairs in points.values() for g in _group_by_x(pairs, numeric, categories)[1]
    )
    for axis, (task, keys) in zip(axes[0], panels.items()):
        for index, key in enumerate(keys):
            _plot_series(axis, points[key], numeric, categories, key, index)
        _format_sweep_axis(axis, numeric, categories, x_label)
        axis.set_title(_TASK_TITLES.get(task, task or "metrics"))
    axes[0][0].set_ylabel("final AP (x100)")
    spread = " (mean; bars: min-max over runs with the same value)" if repeated else ""
    figure.suptitle(f"Final metrics against {x_label}{spread}", fontsize="medium")
    # One legend under the panels (the metrics are the same in each), so that it never hides a point.
    handles, labels = max((axis.get_legend_handles_labels() for axis in axes[0]), key=lambda h: len(h[1]))
    columns = min(4, len(labels))
    figure.legend(handles, labels, loc="lower center", ncol=columns, fontsize="small", frameon=False)
    legend_rows = math.ceil(len(labels) / columns)
    figure.tight_layout(rect=(0, (0.15 + 0.22 * legend_rows) / figure.get_figheight(), 1, 1))
    return figure


def _group_by_x(pairs, numeric: bool, categories: list[str]) -> tuple[list[float], list[list[float]]]:
    groups: dict[float, list[float]] = {}
    for x, y in pairs:
        groups.setdefault(float(x) if numeric else float(categories.index(x)), []).append(y)
    positions = sorted(groups)
    return positions, [groups[p] for p in positions]


def _plot_series(axis, pairs, numeric: bool, categories: list[str], label: str, index: int) -> None:
    from matplotlib.transforms import offset_copy

    positions, groups = _group_by_x(pairs, numeric, categories)
    means = [sum(g) / len(g) for g in groups]
    name = label.split("/", 1)[1] if "/" in label else label
    style = dict(color=f"C{index % 10}", label=name, markersize=5)
    # Error bars of several metrics at one x value would hide each other: shift each series a few points
    # sideways on screen (the data, and a log axis, are unchanged).
    style["transform"] = offset_copy(
        axis.transData, fig=axis.figure, x=3.0 * (index % 4 - 1.5), units="points"
    )
    # Artists drawn with a transform other than transData do not extend the axis limits: extend them here.
    axis.update_datalim([(p, y) for p, g in zip(positions, groups) for y in (min(g), max(g))])
    marker = _MARKERS[index % len(_MARKERS)]
    if any(len(g) > 1 for g in groups):
        errors = [[m - min(g) for m, g in zip(means, groups)], [max(g) - m for m, g in zip(means, groups)]]
        axis.errorbar(positions, means, yerr=errors, fmt=marker + "-", capsize=3, **style)
    else:
        axis.plot(positions, means, marker + "-", **style)


_MAX_LABELLED_VALUES = 8  # a grid sweep's few values get a tick each; a search's many values do not


def _format_sweep_axis(axis, numeric: bool, categories: list[str], x_label: str) -> None:
    axis.margins(x=0.06)
    if numeric:
        values = sorted({float(x) for x in categories})
        positive = [v for v in values if v > 0]
        if len(positive) >= 2 and positive[-1] / positive[0] >= 100 and min(values) >= 0:
            # Thresholds like 0, 0.001, 0.01, 0.1: log spacing, with 0 on the linear part near the axis.
            axis.set_xscale("symlog", linthresh=positive[0])
        axis.autoscale_view()
        if len(values) <= _MAX_LABELLED_VALUES:
            axis.set_xticks(values, [f"{v:.3g}" for v in values])
    else:
        axis.autoscale_view()
        axis.set_xticks(range(len(categories)), categories, rotation=20)
    axis.set_xlabel(x_label)
    axis.grid(alpha=0.3)


def plot_sweep(points: dict[str, list[tuple[str, float]]], x_label: str, out: str) -> str:
    """Draw `build_sweep_figure` to `out` (PNG).

    Returns:
        `out`.
    """
    figure = build_sweep_figure(points, x_label)
    return _save_figure(_get_pyplot(), figure, out)


_BUCKETS = {"r": ("rare", "#d62728"), "c": ("common", "#ff7f0e"), "f": ("frequent", "#1f77b4")}


# LVIS frequency buckets by train image count: rare 1-10, common 11-100, frequent > 100.
_BUCKET_EDGES = {"r": (1, 10), "c": (11, 100), "f": (101, math.inf)}


def _bucket_of(row: dict) -> str | None:
    if row.get("frequency") in _BUCKETS:
        return row["frequency"]
    count = row.get("train_images")
    if count is None or count < 1:
        return None
    return "r" if count <= 10 else "c" if count <= 100 else "f"


def _plottable(rows: Sequence[dict], key: str) -> list[tuple[int, float, str]]:
    """(train images, AP, bucket) of the rows that can be placed: a count >= 1 (log axis) and a finite AP."""
    points = []
    for row in rows:
        count, value, bucket = row.get("train_images"), row.get(key, math.nan), _bucket_of(row)
        if count is not None and count >= 1 and not math.isnan(value) and bucket is not None:
            points.append((count, value, bucket))
    return points


def _get_tasks(rows_per_run: Sequence[Sequence[dict]]) -> list[str]:
    keys = {key for rows in rows_per_run for row in rows for key in row if key.endswith("_AP")}
    return sorted((k[: -len("_AP")] for k in keys), key=lambda task: (task != "segm", task))


def _bucket_span(bucket: str, member_counts: Sequence[int]) -> tuple[float, float]:
    """The x extent of a bucket's mean line: its members' counts, kept between the bucket edges (10.5, 100.5)
    unless the members lie outside them (a json whose frequency field disagrees with the counts)."""
    low, high = min(member_counts) * 0.85, max(member_counts) * 1.15
    edge_low, edge_high = _BUCKET_EDGES[bucket]
    clipped = max(low, edge_low - 0.5), min(high, edge_high + 0.5)
    return clipped if clipped[0] < clipped[1] else (low, high)


def _draw_bucket_edges(axis, counts: Sequence[int]) -> None:
    for edge in (10.5, 100.5):
        if min(counts) < edge < max(counts):
            axis.axvline(edge, color="0.6", linestyle=":", linewidth=1)


def _draw_ap_by_frequency(axis, points: list[tuple[int, float, str]]) -> None:
    """One run: points coloured by bucket, each bucket's mean as a dashed line over its count range."""
    counts = [p[0] for p in points]
    for bucket, (name, color) in _BUCKETS.items():
        members = [p for p in points if p[2] == bucket]
        if not members:
            continue
        mean = float(np.mean([p[1] for p in members]))
        axis.scatter(
            [p[0] for p in members], [p[1] for p in members], s=30, color=color, alpha=0.85,
            edgecolors="white", linewidths=0.5, zorder=3,
            label=f"{name}: {len(members)} categories, mean {mean:.1f}",
        )  # fmt: skip
        span = _bucket_span(bucket, [p[0] for p in members])
        axis.hlines(mean, *span, colors=color, linestyles="--", linewidth=2, zorder=2)
    _draw_bucket_edges(axis, counts)


def _shorten_overrides(label: str) -> str:
    """``dataloader.train.sampler.repeat_thresh=0.1`` -> ``repeat_thresh=0.1``, for each override in `label`."""
    parts = []
    for part in label.split():
        key, sep, value = part.partition("=")
        parts.append(key.rsplit(".", 1)[-1] + sep + value if sep else part)
    return " ".join(parts)


def _draw_ap_by_frequency_runs(axis, points_per_run: dict[str, list[tuple[int, float, str]]]) -> None:
    """Several runs: one colour and marker per run, its bucket means as a dashed step over the buckets."""
    counts = [p[0] for points in points_per_run.values() for p in points]
    for index, (label, points) in enumerate(points_per_run.items()):
        color, marker = f"C{index % 10}", _MARKERS[index % len(_MARKERS)]
        means = []
        for bucket in _BUCKETS:
            members = [p for p in points if p[2] == bucket]
            values = [p[1] for p in members]
            if values:
                low, high = _bucket_span(bucket, [p[0] for p in members])
                mean = float(np.mean(values))
                axis.hlines(mean, low, high, colors=color, linestyles="--", linewidth=2, zorder=2)
                means.append(f"{bucket} {mean:.1f}")
        legend = f"{_shorten_overrides(label)} (mean {', '.join(means)})"
        axis.scatter(
            [p[0] for p in points], [p[1] for p in points], s=22, color=color, marker=marker, alpha=0.7,
            edgecolors="white", linewidths=0.4, zorder=3, label=legend,
        )  # fmt: skip
    _draw_bucket_edges(axis, counts)


def build_ap_by_frequency_figure(runs: dict[str, Sequence[dict]]):
    """Per-category AP (one panel per task: mask, box) against the category's train image count (log x).

    With one run, points are coloured by LVIS frequency bucket (rare/common/frequent) and each bucket's mean
    is a dashed line over the bucket's count range; with several runs (a sweep), each run has its own colour
    and marker and its bucket means. Categories without a train image count or with a NaN AP (no ground
    truth in the evaluated images) are left out.

    Args:
        runs: legend label -> rows from `read_per_category_ap`.

    Returns:
        The matplotlib Figure (close it with ``matplotlib.pyplot.close``).
    """
    tasks = _get_tasks(list(runs.values()))
    points = {task: {label: _plottable(rows, f"{task}_AP") for label, rows in runs.items()} for task in tasks}
    if not tasks or not any(p for per_run in points.values() for p in per_run.values()):
        raise ValueError(
            "build_ap_by_frequency_figure: no category has both a train image count and a finite AP; the "
            "per-category file needs 'train_images' and '<task>_AP' columns (LVIS json 'image_count')."
        )
    plt = _get_pyplot()
    figure, axes = plt.subplots(1, len(tasks), figsize=(6.2 * len(tasks), 4.6), squeeze=False, sharey=True)
    for axis, task in zip(axes[0], tasks):
        per_run = {label: p for label, p in points[task].items() if p}
        if len(runs) == 1:
            _draw_ap_by_frequency(axis, next(iter(per_run.values())))
        else:
            _draw_ap_by_frequency_runs(axis, per_run)
        axis.set_xscale("log")
        axis.set_xlabel("train images with the category (log scale)")
        axis.set_ylabel(f"{_TASK_LABELS.get(task, task)} per category")
        axis.set_title(f"{_TASK_LABELS.get(task, task)} by category frequency")
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize="small", loc="upper left")
    top = max((p[1] for per_run in points.values() for ps in per_run.values() for p in ps), default=1.0)
    axes[0, 0].set_ylim(-0.03 * max(top, 1.0), max(top, 1.0) * 1.35)  # headroom for the legend
    figure.tight_layout()
    return figure


def plot_ap_by_frequency(runs: dict[str, Sequence[dict]], out: str) -> str:
    """Write `build_ap_by_frequency_figure` to `out` (PNG); returns `out`."""
    return _save_figure(_get_pyplot(), build_ap_by_frequency_figure(runs), out)
