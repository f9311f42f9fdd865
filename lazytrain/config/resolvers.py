"""OmegaConf resolvers lazytrain configs may use, registered when `lazytrain.config` is imported.

``${lazytrain.frac:TOTAL,NUM,DEN}`` = ``int(TOTAL * NUM / DEN)``: lets recipes write values derived from
other keys (LR milestones at 2/3 and 8/9 of ``train.max_iter``) that follow command-line overrides.

``${lazytrain.json_num_classes:PATH}``: the number of categories of a COCO/LVIS json (``model.num_classes``
of a recipe trained on a user's json). ``${lazytrain.json_repeat_thresh:PATH}``: a Repeat Factor Sampling
threshold for that json's train set, ``100 / images with annotations`` (2 significant digits, at most 1):
categories in fewer than 100 train images are repeated, as LVIS's t=0.001 does for its ~100k images.
"""

from omegaconf import OmegaConf

__all__ = ["register_resolvers"]


def _fraction(total: float, numerator: float, denominator: float) -> int:
    return int(total * numerator / denominator)


def _json_summary(json_file: str):
    from lazytrain.data.datasets.json_summary import summarize_json
    from lazytrain.errors import ConfigError

    try:
        return summarize_json(str(json_file))
    except (OSError, ValueError) as e:
        raise ConfigError(f"reading {json_file} for a config value: {e}") from e


def _json_num_classes(json_file: str) -> int:
    return len(_json_summary(json_file).categories)


def _json_repeat_thresh(json_file: str) -> float:
    from lazytrain.data.datasets.custom import get_default_repeat_thresh

    return get_default_repeat_thresh(_json_summary(json_file).images_with_annotations)


def register_resolvers() -> None:
    """Register lazytrain's resolvers (idempotent)."""
    for name, function in (
        ("lazytrain.frac", _fraction),
        ("lazytrain.json_num_classes", _json_num_classes),
        ("lazytrain.json_repeat_thresh", _json_repeat_thresh),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


register_resolvers()
