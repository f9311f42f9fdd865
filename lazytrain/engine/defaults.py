"""Moved to `lazytrain.program.default` (the default program reads the whole config, so it lives in the
program layer). This module keeps ``launch.main=lazytrain.engine.defaults.run`` (in configs saved by earlier
versions) and ``from lazytrain.engine.defaults import do_train`` working; new code imports
`lazytrain.program`."""

from __future__ import annotations

from typing import Any

_MOVED = ("INJECTED_ARGUMENTS", "build_model", "default_setup", "do_test", "do_train", "get_resume_file")
_MOVED += ("load_init_checkpoint", "run", "seed_all_rng")


def __getattr__(name: str) -> Any:
    # Imported on first use: the program layer sits above the engine (docs/architecture.md, "Layers").
    if name in _MOVED:
        from lazytrain.program import default

        return getattr(default, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
