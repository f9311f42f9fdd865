"""Moved to `lazytrain.program.entrypoint`; this module keeps ``lazytrain.launch.entrypoint:main`` (console
scripts installed by earlier versions) working."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Imported on first use: the program layer sits above launch (docs/architecture.md, "Layers").
    if name == "main":
        from lazytrain.program.entrypoint import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
