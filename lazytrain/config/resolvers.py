"""OmegaConf resolvers lazytrain configs may use, registered when `lazytrain.config` is imported.

``${lazytrain.frac:TOTAL,NUM,DEN}`` = ``int(TOTAL * NUM / DEN)``: lets recipes write values derived from
other keys (LR milestones at 2/3 and 8/9 of ``train.max_iter``) that follow command-line overrides.

The resolvers that read a data set's json (``lazytrain.json_num_classes``, ``lazytrain.json_repeat_thresh``)
belong to the data layer: `lazytrain.data.datasets.custom` registers them (``import lazytrain.data`` does).
"""

from omegaconf import OmegaConf

__all__ = ["register_resolvers"]


def _fraction(total: float, numerator: float, denominator: float) -> int:
    return int(total * numerator / denominator)


def register_resolvers() -> None:
    """Register lazytrain's config resolvers (idempotent)."""
    if not OmegaConf.has_resolver("lazytrain.frac"):
        OmegaConf.register_new_resolver("lazytrain.frac", _fraction)


register_resolvers()
