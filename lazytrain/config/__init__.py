"""The config system: `LazyCall`/`L`, `LazyConfig` (load/save/to_py/apply_overrides), `instantiate`, `validate`.

Configs are plain data: targets are dotted-path strings, so configs save as YAML, reload, take Hydra
overrides and pickle to spawned processes. Importing this package does not import torch.
"""

from lazytrain.config.instantiate import InstantiationError, instantiate
from lazytrain.config.lazy import L, LazyCall, locate
from lazytrain.config.lazy_config import LazyConfig
from lazytrain.config.resolvers import register_resolvers
from lazytrain.config.validation import find_problems, validate
from lazytrain.errors import ConfigError

__all__ = [
    "ConfigError",
    "InstantiationError",
    "L",
    "LazyCall",
    "LazyConfig",
    "find_problems",
    "instantiate",
    "locate",
    "register_resolvers",
    "validate",
]
