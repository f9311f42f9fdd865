"""The config system: `LazyCall`/`L`, `LazyConfig` (load/save/to_py/apply_overrides), `instantiate`, `validate`.

Configs are plain data: targets are dotted-path strings, so configs save as YAML, reload, take Hydra
overrides and pickle to spawned processes. Importing this package does not import torch.

Choices worth knowing (details in each module):

- Values that are not plain data become nodes that build back to them (`lazy.to_config_value`): a dataclass
  instance -> a lazy call of its class; a class, function or ``torch.dtype`` -> a
  ``lazytrain.config.lazy.locate`` node. Anything else is rejected naming the argument.
- `instantiate` gives callees plain ``dict``/``list`` for containers without ``_target_`` (``_convert_``
  defaults to ``"all"``, not Hydra's ``"none"``); a node shared through interpolation is built once per call.
- Saved YAML starts with the comment ``# lazytrain-config-version: N``; the version is never a config key.
  Older files get renamed keys moved on load, with a warning (`versioning.RENAMES`), and a warning for each
  argument they set whose meaning changed since (`versioning.MEANING_CHANGES`).
"""

from lazytrain.config.instantiate import InstantiationError, instantiate
from lazytrain.config.lazy import L, LazyCall, locate
from lazytrain.config.lazy_config import LazyConfig
from lazytrain.config.resolvers import register_resolver, register_resolvers
from lazytrain.config.validation import find_problems, validate
from lazytrain.config.versioning import CONFIG_VERSION
from lazytrain.errors import ConfigError

__all__ = [
    "CONFIG_VERSION",
    "ConfigError",
    "InstantiationError",
    "L",
    "LazyCall",
    "LazyConfig",
    "find_problems",
    "instantiate",
    "locate",
    "register_resolver",
    "register_resolvers",
    "validate",
]
