"""OmegaConf resolvers lazytrain configs may use, registered when `lazytrain.config` is imported.

``${lazytrain.frac:TOTAL,NUM,DEN}`` = ``int(TOTAL * NUM / DEN)``: lets recipes write values derived from
other keys (LR milestones at 2/3 and 8/9 of ``train.max_iter``) that follow command-line overrides.

The resolvers that read a data set's json (``lazytrain.json_num_classes``, ``lazytrain.json_repeat_thresh``)
belong to the data layer: `lazytrain.data.datasets.custom` registers them (``import lazytrain.data`` does).
"""

from collections.abc import Callable
from typing import Any

import omegaconf
from omegaconf import OmegaConf

__all__ = ["register_resolver", "register_resolvers"]

# OmegaConf 2.4 renamed register_new_resolver to register_resolver (the old name warns, to be removed); in 2.3
# register_resolver is the legacy API that hands a resolver its arguments as unparsed strings.
_OMEGACONF_2_4 = tuple(int(part) for part in omegaconf.__version__.split(".")[:2]) >= (2, 4)


# OmegaConf 2.4 checks a resolver's arguments against its annotations (a UserWarning on a mismatch): config
# values are ints as often as floats.
def _fraction(total: int | float, numerator: int | float, denominator: int | float) -> int:
    return int(total * numerator / denominator)


def register_resolver(name: str, resolver: Callable[..., Any]) -> None:
    """Register ``${name:...}`` on OmegaConf 2.3 and 2.4 alike, unless a resolver of that name exists."""
    if OmegaConf.has_resolver(name):
        return
    if _OMEGACONF_2_4:
        OmegaConf.register_resolver(name, resolver)
    else:
        OmegaConf.register_new_resolver(name, resolver)


def register_resolvers() -> None:
    """Register lazytrain's config resolvers (idempotent)."""
    register_resolver("lazytrain.frac", _fraction)


register_resolvers()
