"""The arguments a call accepts, for validation: a target's signature, where a class's ``**kwargs`` (and
``*args``) are followed into the base-class ``__init__`` that receives them.

A subclass that adds one argument and passes the rest on (``def __init__(self, *args, extra=0, **kwargs):
super().__init__(*args, **kwargs)``) accepts exactly its own arguments and its base's. Its signature alone
says "anything", which would let a misspelled base argument through to a ``TypeError`` at build time. So for a
class whose ``__init__`` takes ``**kwargs``, the source of that ``__init__`` is read (`ast`): when it calls
``super().__init__(...)`` (or ``Base.__init__(self, ...)``) with ``**kwargs``, the accepted arguments are its
own and those of the next ``__init__`` in the class's method resolution order, followed the same way; an
argument the call itself passes (by name or position) is no longer accepted. Anything else (a function, an
``__init__`` without readable source, ``**kwargs`` used otherwise) keeps its signature as it is.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any

__all__ = ["get_parameters"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def get_parameters(target: Any) -> list[inspect.Parameter] | None:
    """The parameters a call of `target` accepts (``**kwargs`` of a class followed as the module docstring
    says); None when the target has no signature (some builtins)."""
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if not inspect.isclass(target) or not _takes_var_keyword(parameters):
        return parameters
    followed = _init_parameters(target, 0)
    # None: the signature is not an __init__'s (a metaclass's __call__, a __new__) or cannot be read.
    return parameters if followed is None else list(followed)


def _takes_var_keyword(parameters: list[inspect.Parameter]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


@functools.cache
def _init_parameters(cls: type, start: int) -> tuple[inspect.Parameter, ...] | None:
    """The parameters of the first ``__init__`` at or after `start` in `cls`'s MRO, its ``**kwargs`` followed;
    None when they cannot be read, or (at `start` 0) when they are not what ``inspect.signature(cls)`` shows."""
    mro = cls.__mro__
    index = next(i for i in range(start, len(mro)) if "__init__" in vars(mro[i]))
    owner = mro[index]
    if owner is object:  # reached from an __init__ that overrides it: object.__init__ then takes no arguments
        return None if start == 0 else ()
    init = vars(owner)["__init__"]
    try:
        parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return None
    if start == 0 and parameters != list(inspect.signature(cls).parameters.values()):
        return None
    if not _takes_var_keyword(parameters):
        return tuple(parameters)
    call = _find_base_init_call(init, parameters, mro, index)
    base = _init_parameters(cls, call[1]) if call else None
    if base is None:  # **kwargs go elsewhere, or the base cannot be read: anything is accepted
        return tuple(parameters)
    return tuple(_merge(parameters, call[0], list(base)))


def _find_base_init_call(
    init: Any, parameters: list[inspect.Parameter], mro: tuple[type, ...], index: int
) -> tuple[ast.Call, int] | None:
    """The call in `init`'s source passing its ``**kwargs`` to a base ``__init__``, and where that base's
    ``__init__`` is searched from in the MRO; None when there is none (or no source)."""
    try:
        source = textwrap.dedent(inspect.getsource(init))
        function = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(function, ast.FunctionDef) or function.name != "__init__":
        return None  # decorated or generated: the source is not this function's
    var_keyword = next(p.name for p in parameters if p.kind is p.VAR_KEYWORD)
    for node in ast.walk(function):
        if not isinstance(node, ast.Call) or not _passes_name(node, var_keyword):
            continue
        start = _base_position(node.func, mro, index)
        if start is not None:
            return node, start
    return None


def _passes_name(call: ast.Call, name: str) -> bool:
    """The call passes ``**name``."""
    return any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == name for k in call.keywords)


def _base_position(func: ast.expr, mro: tuple[type, ...], index: int) -> int | None:
    """Where the called base ``__init__`` is looked up from: after `index` for ``super().__init__``, at the named
    class for ``Base.__init__``; None for any other call."""
    if not (isinstance(func, ast.Attribute) and func.attr == "__init__"):
        return None
    value = func.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
        return index + 1
    if isinstance(value, ast.Name):
        return next((i for i in range(index + 1, len(mro)) if mro[i].__name__ == value.id), None)
    return None


def _merge(
    own: list[inspect.Parameter], call: ast.Call, base: list[inspect.Parameter]
) -> list[inspect.Parameter]:
    """`own` parameters (without what goes on to the base) and the base's, less those the call fills itself."""
    var_positional = next((p.name for p in own if p.kind is p.VAR_POSITIONAL), None)
    args = list(call.args)
    if not (isinstance(call.func.value, ast.Call)):  # Base.__init__(self, ...): self is not an argument
        args = args[1:]
    forwards_args = any(
        isinstance(a, ast.Starred) and isinstance(a.value, ast.Name) and a.value.id == var_positional
        for a in args
    )
    filled = len(list(_leading_plain(args)))
    base_positional = [p for p in base if p.kind in _POSITIONAL]
    taken = {p.name for p in base_positional[:filled]} | {k.arg for k in call.keywords if k.arg}
    kept = [
        p for p in own if p.kind is not p.VAR_KEYWORD and not (forwards_args and p.kind is p.VAR_POSITIONAL)
    ]
    names = {p.name for p in kept}
    for parameter in base:
        if parameter.name in taken or parameter.name in names:
            continue
        if not forwards_args and parameter.kind in _POSITIONAL:
            if parameter.kind is parameter.POSITIONAL_ONLY:
                continue  # **kwargs cannot reach it
            parameter = parameter.replace(kind=parameter.KEYWORD_ONLY)
        elif not forwards_args and parameter.kind is parameter.VAR_POSITIONAL:
            continue
        kept.append(parameter)
    return kept


def _leading_plain(args: list[ast.expr]) -> Any:
    for arg in args:
        if isinstance(arg, ast.Starred):
            return
        yield arg
