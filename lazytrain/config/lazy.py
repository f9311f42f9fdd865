"""`LazyCall`: turn a call into a config node, and `locate`: turn a dotted path back into the object.

A lazy call stores its target as an importable dotted string, so a config is plain data: it can be saved
as YAML, reloaded, diffed, overridden from the command line and pickled to spawned processes.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.errors import ConfigError

__all__ = ["LazyCall", "L", "locate", "get_dotted_path", "RESERVED_KEYS"]

RESERVED_KEYS = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_")
_SCALARS = (str, int, float, bool, type(None))


def locate(path: str) -> Any:
    """Import the object named by a dotted path, e.g. ``"torch.optim.SGD"`` or ``"pkg.mod.Class.method"``.

    The longest importable module prefix is imported and the rest is resolved with ``getattr``.

    Raises:
        ImportError: naming the path and the part that could not be found.
    """
    if not isinstance(path, str) or not path or path.startswith(".") or ".." in path:
        raise ImportError(f"locate(path=) expects a dotted path like 'package.module.Name'; got {path!r}")
    parts = path.split(".")
    module, first_attr, import_error = None, len(parts), None
    for end in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as e:
            # Only swallow "this prefix is not a module"; a missing dependency inside the module must surface.
            if e.name is None or not ".".join(parts[:end]).startswith(e.name):
                raise
            import_error = e
            continue
        first_attr = end
        break
    if module is None:
        raise ImportError(
            f"cannot import '{path}': no module named '{parts[0]}'. Run from the folder that holds your modules "
            "(python -m puts the current folder on the import path) or add it to PYTHONPATH."
        ) from import_error
    obj = module
    for index in range(first_attr, len(parts)):
        try:
            obj = getattr(obj, parts[index])
        except AttributeError:
            owner = ".".join(parts[:index])
            raise ImportError(
                f"cannot import '{path}': '{owner}' has no attribute '{parts[index]}'"
            ) from None
    return obj


def get_dotted_path(obj: Any) -> str:
    """The importable dotted path of a class or function, checked to locate back to the same object.

    Raises:
        ConfigError: for lambdas, local functions, objects defined in a config file or ``__main__``, and
            anything whose path does not import back to the same object.
    """
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    owner = getattr(obj, "__self__", None)
    if module is None and isinstance(owner, type):  # classmethods of builtin types have no __module__
        module = owner.__module__
    if not callable(obj) or module is None or qualname is None:
        raise ConfigError(
            f"LazyCall target must be an importable class or function; got {obj!r} of type "
            f"{type(obj).__name__}. Pass a class/function defined at module level, or its dotted path as a string."
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ConfigError(
            f"LazyCall target {module}.{qualname} is a lambda or local function and cannot be stored in a "
            "config (configs hold importable dotted paths). Define it at module level in an importable module."
        )
    path = f"{module}.{qualname}"
    try:
        located = locate(path)
    except ImportError as e:
        raise ConfigError(
            f"LazyCall target {qualname} (module '{module}') is not importable by its dotted path '{path}': {e}. "
            "Objects defined inside a config file or __main__ cannot be targets; move them to a module."
        ) from None
    if located is not obj and located != obj:
        raise ConfigError(f"LazyCall target {obj!r}: its dotted path '{path}' imports a different object.")
    return path


def _locate_node(path: str) -> dict:
    """A node that instantiates back to the object at `path` (used for classes/dtypes passed as values)."""
    return {"_target_": "lazytrain.config.lazy.locate", "_args_": [path]}


def _is_torch_dtype(value: Any) -> bool:
    # Checked by type name so that converting values never imports torch.
    return type(value).__name__ == "dtype" and type(value).__module__ == "torch"


def to_config_value(value: Any, *, name: str = "value") -> Any:
    """Convert a Python value into something an omegaconf node can hold and YAML can save.

    - dicts, lists, tuples (become lists) and scalars pass through, recursively;
    - a dataclass instance becomes a lazy call of its class with its init fields, an enum member a lazy call
      of its enum class: `instantiate` rebuilds an equal object;
    - a class, function or ``torch.dtype`` becomes a ``lazytrain.config.lazy.locate`` node that
      `instantiate` turns back into the very same object (``torch.float16`` stays ``torch.float16``).

    Args:
        value: the value to convert.
        name: its argument name or key path, used in error messages.

    Raises:
        ConfigError: naming `name`, for anything else (built objects, bytes, sets, lambdas, ...).
    """
    if isinstance(value, (DictConfig, ListConfig, *_SCALARS)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_config_value(v, name=f"{name}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_config_value(v, name=f"{name}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        return LazyCall(type(value))(**{k: to_config_value(v, name=f"{name}.{k}") for k, v in fields.items()})
    if isinstance(value, enum.Enum):
        return LazyCall(type(value))(value.value)
    if _is_torch_dtype(value):
        return _locate_node(str(value))  # str(torch.float32) == "torch.float32"
    if inspect.isclass(value) or inspect.isroutine(value):
        try:
            return _locate_node(get_dotted_path(value))
        except ConfigError as e:
            raise ConfigError(f"{name}: {e}") from None
    raise ConfigError(
        f"{name}: a config cannot hold {value!r} (type {type(value).__name__}); configs hold plain data. "
        "Describe the object with LazyCall(Class)(...) so it is built at instantiation time."
    )


class LazyCall:
    """Record a call as a config node instead of making it.

    ``LazyCall(torch.optim.SGD)(lr=0.02)`` returns the DictConfig ``{_target_: "torch.optim.sgd.SGD",
    lr: 0.02}``; `instantiate` makes the call later. Positional arguments go to ``_args_``. The target may
    be a class, a function, a dotted-path string, or another lazy-call node (whose result is then called).
    Argument values go through `to_config_value`: nested lazy calls, dicts and lists nest; a dataclass
    instance, a class or a ``torch.dtype`` becomes a node that instantiates back to it.

    Args:
        target: what to call.

    Raises:
        ConfigError: at once, for a lambda, a local function, a non-callable, a target whose dotted path does
            not import back to it, or an argument value a config cannot hold (naming the argument).
    """

    def __init__(self, target: Callable | str | DictConfig | Mapping) -> None:
        if isinstance(target, str):
            self._target: Any = target
        elif isinstance(target, (DictConfig, Mapping)):
            if "_target_" not in target:
                raise ConfigError(f"LazyCall(target=) got a dict without '_target_': {target!r}")
            self._target = target
        else:
            self._target = get_dotted_path(target)

    def __call__(self, *args: Any, **kwargs: Any) -> DictConfig:
        node: dict[str, Any] = {"_target_": to_config_value(self._target, name="_target_")}
        if args:
            node["_args_"] = [to_config_value(a, name=f"_args_[{i}]") for i, a in enumerate(args)]
        for key, value in kwargs.items():
            node[key] = to_config_value(value, name=key)
        return OmegaConf.create(node)


L = LazyCall
