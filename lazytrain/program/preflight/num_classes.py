"""``model.num_classes`` against the train data's categories, before any data set is loaded where their count
is known without loading it: ``synthetic_lt_*`` (its generator's fixed category list) and the json data sets
the config registers (their summary, which `json_data`'s checks parse anyway). Other data sets (the built-in
COCO and LVIS, a user's own registration) are checked once loaded, before the first step
(`lazytrain.program.default.check_num_classes`); that check also warns about classes no data set has."""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.data.datasets.json_summary import summarize_json
from lazytrain.data.datasets.synthetic import CATEGORY_NAMES
from lazytrain.program.preflight.json_data import is_registering_node, read_node_value

__all__ = ["describe_too_few_classes", "find_num_classes_problems"]

_NAMES_KEY = "dataloader.train.dataset.names"


def describe_too_few_classes(num_classes: int, name: str, count: int) -> str:
    """The problem of a model with fewer classes than train data set `name`'s `count` categories."""
    return (
        f"model.num_classes={num_classes} is fewer than the {count} categories of the train data set '{name}' "
        f"({_NAMES_KEY}): set model.num_classes={count}."
    )


def _known_category_counts(cfg: DictConfig) -> dict[str, int]:
    """{train data set name: category count} of the train data sets whose count is known unloaded."""
    names = OmegaConf.select(cfg, _NAMES_KEY, default=None)
    entries = list(names) if isinstance(names, ListConfig) else [names]
    counts = {}
    for index, entry in enumerate(entries):
        if isinstance(entry, str) and entry.startswith("synthetic_lt_"):
            counts[entry] = len(CATEGORY_NAMES)
        elif isinstance(entry, DictConfig) and is_registering_node(entry):
            path = f"{_NAMES_KEY}[{index}]" if isinstance(names, ListConfig) else _NAMES_KEY
            json_file, _ = read_node_value(entry, "json_file", path)
            name, _ = read_node_value(entry, "name", path)
            if json_file and name and os.path.isfile(json_file):  # a missing file is json_data's problem
                counts[name] = len(summarize_json(json_file).categories)
    return counts


def find_num_classes_problems(cfg: DictConfig) -> list[str]:
    """The problem of a ``model.num_classes`` below a train data set's category count, when known unloaded."""
    try:
        num_classes = OmegaConf.select(cfg, "model.num_classes", default=None)
    except (
        Exception
    ):  # a resolver that reads a json (the custom recipe's): that file's problem is json_data's
        return []
    if not isinstance(num_classes, int) or isinstance(num_classes, bool):
        return []
    counts = _known_category_counts(cfg)
    if not counts:
        return []
    largest = max(counts, key=counts.get)
    if num_classes >= counts[largest]:
        return []
    return [describe_too_few_classes(num_classes, largest, counts[largest])]
