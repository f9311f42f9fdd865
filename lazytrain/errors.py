"""The small family of lazytrain exceptions.

`LazytrainError` is the base; `ConfigError` is raised for problems found in a config (it carries the
config key path in its message). Callers that only care about "a lazytrain problem" catch the base.
"""


class LazytrainError(Exception):
    """Base class of errors raised by lazytrain."""


class ConfigError(LazytrainError, ValueError):
    """A config problem: bad key, bad value, bad target. The message names the config key path."""
