"""Pictures and plots users look at: instances drawn on images, image grids, training curves, sweeps and
per-category AP against how often the category occurs in training (the long-tail picture).

Drawing works on uint8 HWC RGB numpy arrays with PIL and numpy only. The plotting functions import
matplotlib (a default dependency; without it runs only lose their plots) when called and render with the
Agg backend, so they work on machines without a display. Runs write their plots through
`lazytrain.engine.run_report`; the scripts in ``scripts/visualize_*.py`` and ``scripts/plot_*.py`` are thin
wrappers.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "draw_instances",
    "draw_record",
    "draw_mapped_sample",
    "draw_coco_results",
    "make_grid",
    "save_image",
    "read_metrics",
    "read_overrides",
    "get_run_dirs",
    "get_run_labels",
    "get_override_value",
    "get_last_values",
    "plot_metrics",
    "build_metrics_figure",
    "get_swept_key",
    "get_sweep_points",
    "build_sweep_figure",
    "plot_sweep",
    "read_per_category_ap",
    "build_ap_by_frequency_figure",
    "plot_ap_by_frequency",
]

logger = logging.getLogger(__name__)

# Tableau-like palette: distinct, readable on photos and on the synthetic backgrounds.
_PALETTE = np.array(
    [
        (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
        (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
        (174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
    ],
    dtype=np.uint8,
)  # fmt: skip


def _get_color(index: int) -> tuple[int, int, int]:
    return tuple(int(c) for c in _PALETTE[index % len(_PALETTE)])


def draw_instances(
    image: np.ndarray,
    boxes: np.ndarray | None = None,
    *,
    masks: np.ndarray | None = None,
    labels: Sequence[str] | None = None,
    color_ids: Sequence[int] | None = None,
    mask_alpha: float = 0.45,
) -> np.ndarray:
    """Draw boxes, masks and labels of N instances on a copy of `image`.

    Args:
        image: uint8 [H, W, 3] RGB.
        boxes: [N, 4] XYXY in pixels, or None to draw masks only.
        masks: [N, H, W] binary, blended with `mask_alpha`.
        labels: N strings written at the top-left corner of each box (or mask).
        color_ids: N ints picking the palette colour (e.g. class ids, so a class keeps its colour);
            default: instance index.

    Returns:
        A new uint8 [H, W, 3] array.
    """
    canvas = np.asarray(image, dtype=np.uint8)[..., :3].copy()
    num = len(boxes) if boxes is not None else len(masks) if masks is not None else 0
    colors = [_get_color(i if color_ids is None else int(color_ids[i])) for i in range(num)]
    if masks is not None:
        for mask, color in zip(np.asarray(masks).astype(bool), colors):
            canvas[mask] = (canvas[mask] * (1 - mask_alpha) + np.array(color) * mask_alpha).astype(np.uint8)
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    for i, color in enumerate(colors):
        if boxes is not None:
            x0, y0, x1, y1 = (float(v) for v in boxes[i])
            draw.rectangle([x0, y0, x1, y1], outline=color, width=max(1, round(min(canvas.shape[:2]) / 200)))
        elif masks is not None and masks[i].any():
            ys, xs = np.nonzero(masks[i])
            x0, y0 = float(xs.min()), float(ys.min())
        else:
            continue
        if labels is not None:
            _draw_label(draw, labels[i], (x0, y0), color)
    return np.asarray(picture)


def _draw_label(draw: ImageDraw.ImageDraw, text: str, corner: tuple[float, float], color: tuple) -> None:
    left, top, right, bottom = draw.textbbox((0, 0), text)
    width, height = right - left + 2, bottom - top + 2
    x = max(0.0, min(corner[0], draw.im.size[0] - width))  # keep the label inside the image
    y = corner[1] - height if corner[1] >= height else corner[1]
    draw.rectangle([x, y, x + width, y + height], fill=color)
    draw.text((x + 1 - left, y + 1 - top), text, fill=(255, 255, 255))


def _decode_segmentation(segmentation: list | dict, height: int, width: int) -> np.ndarray:
    from pycocotools import mask as mask_util

    if isinstance(segmentation, list):  # polygons
        rles = mask_util.frPyObjects([list(map(float, p)) for p in segmentation], height, width)
        rle = mask_util.merge(rles)
    elif isinstance(segmentation["counts"], list):  # uncompressed RLE
        rle = mask_util.frPyObjects(segmentation, height, width)
    else:
        rle = dict(
            segmentation,
            counts=segmentation["counts"].encode()
            if isinstance(segmentation["counts"], str)
            else segmentation["counts"],
        )
    return mask_util.decode(rle).astype(np.uint8)


def _xywh_to_xyxy(boxes: Sequence[Sequence[float]]) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    return np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)


def _class_name(class_names: Sequence[str] | dict | None, index: int) -> str:
    if class_names is None:
        return str(index)
    try:
        return str(class_names[index])
    except (IndexError, KeyError):
        return str(index)


def draw_record(image: np.ndarray, record: dict, class_names: Sequence[str] | None = None) -> np.ndarray:
    """Draw a dataset record's annotations (XYWH boxes, polygon/RLE masks, contiguous category ids).

    Args:
        image: the record's image, uint8 [H, W, 3] RGB (e.g. from `lazytrain.data.mappers.read_image`).
        record: a dataset dict as in docs/architecture.md.
        class_names: ``MetadataCatalog.get(name).thing_classes``; ids are written when None.
    """
    annotations = record.get("annotations", [])
    height, width = image.shape[:2]
    boxes = _xywh_to_xyxy([a["bbox"] for a in annotations])
    masks = None
    if annotations and all("segmentation" in a for a in annotations):
        masks = np.stack([_decode_segmentation(a["segmentation"], height, width) for a in annotations])
    classes = [int(a["category_id"]) for a in annotations]
    labels = [_class_name(class_names, c) for c in classes]
    return draw_instances(image, boxes, masks=masks, labels=labels, color_ids=classes)


def draw_mapped_sample(
    sample: dict, class_names: Sequence[str] | None = None, *, bgr: bool = False
) -> np.ndarray:
    """Draw a mapper output (``image`` [3, H, W] tensor after augmentation, ``instances`` boxes/classes/masks).

    Args:
        class_names: ``MetadataCatalog.get(name).thing_classes``; ids are written when None.
        bgr: the mapper produced BGR images (``image_format="BGR"``).
    """
    image = sample["image"].permute(1, 2, 0).cpu().numpy()
    if bgr:
        image = image[..., ::-1]
    instances = sample.get("instances") or {}
    if "boxes" not in instances:
        return np.ascontiguousarray(image)
    classes = instances["classes"].tolist()
    masks = instances["masks"].cpu().numpy() if "masks" in instances else None
    labels = [_class_name(class_names, c) for c in classes]
    return draw_instances(
        image, instances["boxes"].cpu().numpy(), masks=masks, labels=labels, color_ids=classes
    )


def draw_coco_results(
    image: np.ndarray,
    results: Sequence[dict],
    class_names: dict[int, str] | None = None,
    score_thresh: float = 0.5,
) -> np.ndarray:
    """Draw COCO-format detections of one image (json category ids, XYWH boxes, optional RLE masks).

    Args:
        results: entries of ``coco_instances_results.json`` / ``lvis_instances_results.json`` for this image.
        class_names: json category id -> name; ids are written when None.
        score_thresh: drop detections scoring below it.
    """
    kept = sorted((r for r in results if r["score"] >= score_thresh), key=lambda r: -r["score"])
    height, width = image.shape[:2]
    boxes = _xywh_to_xyxy([r["bbox"] for r in kept])
    masks = None
    if kept and all("segmentation" in r for r in kept):
        masks = np.stack([_decode_segmentation(r["segmentation"], height, width) for r in kept])
    labels = [f"{_class_name(class_names, r['category_id'])} {r['score']:.2f}" for r in kept]
    color_ids = [int(r["category_id"]) for r in kept]
    return draw_instances(image, boxes, masks=masks, labels=labels, color_ids=color_ids)


def make_grid(
    images: Sequence[np.ndarray], columns: int | None = None, cell_size: int = 256, pad: int = 4
) -> np.ndarray:
    """Tile images into one, each scaled to fit a `cell_size` square (aspect kept) on a white background.

    Args:
        columns: default ceil(sqrt(len(images))).
    """
    if not images:
        raise ValueError("make_grid(images=) needs at least one image; got an empty list.")
    columns = columns or math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / columns)
    step = cell_size + pad
    grid = Image.new("RGB", (columns * step + pad, rows * step + pad), (255, 255, 255))
    for index, image in enumerate(images):
        tile = Image.fromarray(np.asarray(image, dtype=np.uint8))
        tile.thumbnail((cell_size, cell_size))
        row, column = divmod(index, columns)
        x = pad + column * step + (cell_size - tile.width) // 2
        y = pad + row * step + (cell_size - tile.height) // 2
        grid.paste(tile, (x, y))
    return np.asarray(grid)


def save_image(image: np.ndarray, path: str) -> None:
    """Write a uint8 HWC RGB array (PNG when `path` ends in .png), creating the directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(path)


# ----------------------------------------------------------------------------------------- run directories


def read_metrics(run_dir: str) -> list[dict]:
    """The JSON lines of ``<run_dir>/metrics.json``; a truncated last line (run still writing) is skipped."""
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
                records.append(json.loads(line))
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


# ------------------------------------------------------------------------------------------------- plots


def _get_pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_DEFAULT_EVAL_METRICS = ("AP", "APr", "APc", "APf")
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
    keys = {k for records in runs.values() for r in records for k in r}
    losses = sorted((k for k in keys if "loss" in k and "/" not in k), key=lambda k: (k != "total_loss", k))
    if eval_metrics is None:
        eval_metrics = sorted(
            (k for k in keys if "/" in k and k.rsplit("/", 1)[1] in _DEFAULT_EVAL_METRICS),
            key=lambda k: (k.rsplit("/", 1)[0], _DEFAULT_EVAL_METRICS.index(k.rsplit("/", 1)[1])),
        )
    tasks: dict[str, list[str]] = {}
    for key in (k for k in eval_metrics if k in keys):
        tasks.setdefault(key.rsplit("/", 1)[0], []).append(key)
    panels = losses + (["lr"] if "lr" in keys else []) + list(tasks)
    if not panels:
        raise ValueError(
            f"plot_metrics: no loss, lr or eval metric found in {list(runs)}; is metrics.json empty?"
        )
    plt = _get_pyplot()
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False, sharex=True)
    for axis, panel in zip(axes.flat, panels):
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
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    for axis in axes[-1]:
        axis.set_xlabel("iteration")
        axis.xaxis.set_tick_params(labelbottom=True)
    if len(runs) == 1:  # a single run needs no legend: its name is the title
        figure.suptitle(next(iter(runs)))
        figure.tight_layout()
        return figure
    handles, labels = axes.flat[0].get_legend_handles_labels()
    legend_rows = math.ceil(len(labels) / 3)
    figure.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize="small")
    figure.tight_layout(
        rect=(0, (0.1 + 0.3 * legend_rows) / figure.get_figheight(), 1, 1)
    )  # room for the legend
    return figure


def _save_figure(plt, figure, out: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


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


SWEEP_METRICS = tuple(f"{task}/{name}" for task in ("segm", "bbox") for name in _DEFAULT_EVAL_METRICS)
_TASK_TITLES = {"segm": "mask (segm)", "bbox": "box (bbox)"}
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
    numeric = [key for key in varying if all(_is_number(v) for v in values[key])]
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
    numeric = all(_is_number(x) for x in categories)
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


def _is_number(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------- per-category AP (long tail)

# Files the COCO/LVIS evaluators write after each evaluation (lazytrain.evaluation.coco_evaluation).
_PER_CATEGORY_FILES = ("lvis_per_category_ap.csv", "coco_per_category_ap.csv")
_BUCKETS = {"r": ("rare", "#d62728"), "c": ("common", "#ff7f0e"), "f": ("frequent", "#1f77b4")}
# LVIS frequency buckets by train image count: rare 1-10, common 11-100, frequent > 100.
_BUCKET_EDGES = {"r": (1, 10), "c": (11, 100), "f": (101, math.inf)}


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
