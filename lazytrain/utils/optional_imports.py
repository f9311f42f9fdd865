"""Optional dependencies: the packages of lazytrain's extras (timm, export, mlflow, wandb), imported where a
feature needs them, with one error that names the feature and the extra that installs them."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["check_optional", "import_optional"]


def _missing_message(component: str, missing: list[str], extra: str) -> str:
    packages = ", ".join(f"'{name}'" for name in missing)
    verb = "is" if len(missing) == 1 else "are"
    return f'{component} needs {packages}, which {verb} not installed. Install it with: pip install "lazytrain[{extra}]"'


def check_optional(component: str, modules: tuple[str, ...], extra: str) -> None:
    """Raise `ModuleNotFoundError` naming `component` and the extra to install when one of `modules` is
    missing; imports nothing (`importlib.util.find_spec`), so it is cheap to call before a run starts."""
    missing = [name for name in modules if importlib.util.find_spec(name.split(".")[0]) is None]
    if missing:
        raise ModuleNotFoundError(_missing_message(component, missing, extra))


def import_optional(name: str, *, component: str, extra: str) -> ModuleType:
    """Import module `name` of the `extra` extra for `component` (e.g. ``"TimmBackbone"``), or raise
    `ModuleNotFoundError` with the install command."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ModuleNotFoundError(f"{_missing_message(component, [name], extra)} ({error})") from error
