"""The small family of lazytrain exceptions.

`LazytrainError` is the base; `ConfigError` is raised for problems found in a config (it carries the
config key path in its message); `CheckpointError` for a file that cannot be loaded as a checkpoint. Callers
that only care about "a lazytrain problem" catch the base; the command line reports these as one paragraph,
without a traceback (``HYDRA_FULL_ERROR=1`` shows it).
"""


class LazytrainError(Exception):
    """Base class of errors raised by lazytrain."""


class ConfigError(LazytrainError, ValueError):
    """A config problem: bad key, bad value, bad target. The message names the config key path."""


class CheckpointError(LazytrainError, ValueError):
    """A file that is not a loadable checkpoint (not a torch file, truncated, or refused as unsafe)."""


_AGREED_ATTRIBUTE = "lazytrain_all_ranks_agree"


def mark_agreed(error: BaseException) -> BaseException:
    """Mark `error` as raised by every rank of the job at the same point (e.g. a non-finite loss found by one
    rank and shared in the step's all-reduce); returns it. A rank watch does not stop the other ranks for it:
    each reports it itself."""
    setattr(error, _AGREED_ATTRIBUTE, True)
    return error


def is_agreed(error: BaseException) -> bool:
    """Whether `mark_agreed` marked `error`."""
    return bool(getattr(error, _AGREED_ATTRIBUTE, False))
