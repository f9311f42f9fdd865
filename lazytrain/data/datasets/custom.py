"""A user's COCO- or LVIS-format export, registered from config data.

A config names the files, not a registration made in Python::

    dataset=L(get_detection_dataset_dicts)(
        names=L(register_json_dataset)(name="custom_train", json_file="${data.train.json}",
                                       image_root="${data.train.images}"))

`instantiate` calls `register_json_dataset` in whichever process builds the loader (every spawned rank, every
job of a sweep or a Hydra launcher), so the data set travels as config values, not as process state (a
``DatasetCatalog.register`` call in a config file would exist only in the process that loaded the file).

Records come from `load_cached_json` (the json's cache file, written by the first process that needs it) as
`load_lvis_json` gives them, which reads both formats (LVIS's ``coco_url``, ``neg_category_ids`` and
``frequency`` are used when present). The metadata adds what the long-tail evaluation needs: each category's
train image count and r/c/f bucket (`bin_categories`) and the evaluation protocol (``federated`` when the json
lists ``neg_category_ids``, else ``exhaustive``, COCO's).

Importing this module registers two OmegaConf resolvers for configs on such a json (`register_json_resolvers`;
``import lazytrain.data`` does it too, so a process that loads or launches a config has them):

- ``${lazytrain.json_num_classes:PATH}``: the number of categories of a COCO/LVIS json (``model.num_classes``
  of a recipe trained on a user's json);
- ``${lazytrain.json_repeat_thresh:PATH}``: a Repeat Factor Sampling threshold for that json's train set,
  `get_default_repeat_thresh` of its images with annotations.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence

from lazytrain.config import register_resolver
from lazytrain.data.datasets.cached_records import load_cached_json
from lazytrain.data.datasets.json_summary import JsonSummary, summarize_json
from lazytrain.errors import ConfigError

__all__ = [
    "DEFAULT_FREQUENCY_THRESHOLDS",
    "bin_categories",
    "get_default_repeat_thresh",
    "get_image_count_limits",
    "register_json_dataset",
    "register_json_resolvers",
]

logger = logging.getLogger(__name__)

DEFAULT_FREQUENCY_THRESHOLDS = (10, 100)
"""LVIS's buckets: rare in 1-10 train images, common in 11-100, frequent in more."""

_registered: dict[str, tuple] = {}


def get_default_repeat_thresh(num_train_images: int) -> float:
    """A Repeat Factor Sampling threshold for `num_train_images` annotated train images: ``100 / N`` (2
    significant digits, at most 1), so categories in fewer than 100 train images are repeated, as LVIS's
    t=0.001 does for its ~100k images (factor sqrt(100 / n) for a category in n images)."""
    return min(1.0, float(f"{100 / max(num_train_images, 1):.2g}"))


def get_image_count_limits(thresholds: Sequence[float], num_train_images: int) -> tuple[float, float]:
    """The largest train image counts of a rare and of a common category.

    Args:
        thresholds: ``(rare, common)``: image counts (``[10, 100]``, LVIS), or fractions of the train images
            with annotations when below 1 (``[0.01, 0.1]``: rare in at most 1 % of the images).
        num_train_images: train images with annotations.
    """
    if len(thresholds) != 2 or not 0 < thresholds[0] <= thresholds[1]:
        raise ValueError(
            f"frequency_thresholds must be [rare, common] with 0 < rare <= common (image counts, or fractions of "
            f"the train images below 1); got {list(thresholds)}. LVIS's are [10, 100]."
        )
    return tuple(t * num_train_images if t < 1 else t for t in thresholds)  # type: ignore[return-value]


def bin_categories(
    train: JsonSummary, thresholds: Sequence[float] = DEFAULT_FREQUENCY_THRESHOLDS
) -> tuple[list[dict], str]:
    """Each category's train image count and frequency bucket, and a sentence saying how they were binned.

    The json's own LVIS ``frequency`` fields win when every category has one; otherwise categories are binned
    by the number of train images they are annotated in (`get_image_count_limits`).

    Returns:
        ``[{"id", "image_count", "frequency"}]`` in category id order (the ``class_image_count`` metadata),
        and the rule used.
    """
    counts = train.class_image_count
    if train.json_frequency is not None:
        frequency = train.json_frequency
        rule = f"the 'frequency' field of {train.json_file}"
    else:
        rare, common = get_image_count_limits(thresholds, train.images_with_annotations)
        frequency = {
            c: "r" if counts[c] <= rare else "c" if counts[c] <= common else "f" for c, _ in train.categories
        }
        rule = (
            f"train image counts in {train.json_file}: r <= {rare:g}, c <= {common:g}, f > {common:g} images "
            f"(data.frequency_thresholds={list(thresholds)})"
        )
    entries = [{"id": c, "image_count": counts[c], "frequency": frequency[c]} for c, _ in train.categories]
    return entries, rule


def _set_metadata(name: str, spec: tuple) -> None:
    from lazytrain.data.catalog import MetadataCatalog

    json_file, image_root, train_json_file, thresholds = spec
    summary = summarize_json(json_file)
    class_image_count, rule = bin_categories(summarize_json(train_json_file or json_file), thresholds)
    federated = summary.has_negative_category_ids
    MetadataCatalog.get(name).set(
        thing_classes=[str(category_name) for _, category_name in summary.categories],
        thing_dataset_id_to_contiguous_id={c: i for i, (c, _) in enumerate(summary.categories)},
        json_file=json_file,
        image_root=image_root,
        evaluator_type="lvis" if federated else "coco",
        evaluation_protocol="federated" if federated else "exhaustive",
        class_image_count=class_image_count,
        class_frequency=[entry["frequency"] for entry in class_image_count],
        frequency_rule=rule,
    )


def _load(name: str, spec: tuple) -> Sequence[dict]:
    records = load_cached_json(spec[0], spec[1], name, lvis=True)
    _set_metadata(name, spec)  # the loader set frequencies from this file's own counts; train's decide
    return records


def register_json_dataset(
    name: str,
    json_file: str,
    image_root: str,
    *,
    train_json_file: str | None = None,
    frequency_thresholds: Sequence[float] = DEFAULT_FREQUENCY_THRESHOLDS,
) -> str:
    """Register a COCO- or LVIS-format json under `name` in this process and return `name`.

    Registering again with the same arguments does nothing; with other arguments it replaces the entry (the
    config is the authority, e.g. in the next job of a sweep). The metadata is set at once (class names,
    id mapping, json file, evaluation protocol, r/c/f buckets); loading the records happens on
    ``DatasetCatalog.get(name)``.

    Args:
        name: the data set name used by loaders and evaluators, e.g. ``"custom_train"``.
        json_file: the annotation file.
        image_root: the folder the images' ``file_name`` are relative to (absolute names are used as they are).
        train_json_file: for a val/test set, the train json whose image counts bin the categories into
            rare/common/frequent; None bins by this file's own counts (a train set).
        frequency_thresholds: ``[rare, common]`` limits, see `get_image_count_limits`.
    """
    from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog

    expand = os.path.expanduser
    spec = (
        expand(json_file),
        expand(image_root),
        expand(train_json_file) if train_json_file else None,
        tuple(frequency_thresholds),
    )
    if _registered.get(name) == spec and name in DatasetCatalog:
        return name
    DatasetCatalog.remove(name)
    MetadataCatalog.remove(name)
    DatasetCatalog.register(name, functools.partial(_load, name, spec))
    _set_metadata(name, spec)
    _registered[name] = spec
    return name


def _summarize_for_config(json_file: str) -> JsonSummary:
    try:
        return summarize_json(str(json_file))
    except (OSError, ValueError) as e:
        raise ConfigError(f"reading {json_file} for a config value: {e}") from e


def _json_num_classes(json_file: str) -> int:
    return len(_summarize_for_config(json_file).categories)


def _json_repeat_thresh(json_file: str) -> float:
    return get_default_repeat_thresh(_summarize_for_config(json_file).images_with_annotations)


def register_json_resolvers() -> None:
    """Register ``lazytrain.json_num_classes`` and ``lazytrain.json_repeat_thresh`` (idempotent; done when
    this module is imported)."""
    for name, function in (
        ("lazytrain.json_num_classes", _json_num_classes),
        ("lazytrain.json_repeat_thresh", _json_repeat_thresh),
    ):
        register_resolver(name, function)


register_json_resolvers()
