"""The configs shipped in the package, by short name: ``python -m lazytrain lazytrain://NAME`` runs
``NAME.py`` of ``lazytrain.conf`` (the repository's ``conf/``, installed by a wheel or an editable install),
from any folder, and ``LazyConfig.load("lazytrain://NAME")`` loads it (detectron2's ``model_zoo.get_config``);
``python -m lazytrain --help`` lists them.

Imports nothing heavy (no torch): ``--help`` answers at once.
"""

from __future__ import annotations

import ast
import difflib
import os

from lazytrain.config.loading import get_shipped_config_dir
from lazytrain.errors import ConfigError

__all__ = ["SCHEME", "get_config_file", "get_module_docstring", "list_shipped_configs"]

SCHEME = "lazytrain://"
"""CONFIG ``lazytrain://NAME`` is the shipped config ``lazytrain.conf.NAME`` (``conf/NAME.py`` in a clone)."""


def get_config_file(config: str) -> str:
    """The file that CONFIG names: `config` itself, or for ``lazytrain://NAME`` (``.py`` optional) the shipped
    config's file.

    Raises:
        ConfigError: no shipped config of that name (the closest names and where the list is).
    """
    one_slash = config.startswith(SCHEME.rstrip("/") + "/") and not config.startswith(SCHEME)
    if one_slash and not os.path.exists(config):
        # pathlib.Path("lazytrain://NAME") is "lazytrain:/NAME": say so instead of "file not found".
        name = config.split("/", 1)[1]
        raise ConfigError(
            f"CONFIG {config}: a shipped config's short name has two slashes, and is a string, not a path "
            f"(pathlib.Path turns '//' into '/'): pass '{SCHEME}{name}'."
        )
    if not config.startswith(SCHEME):
        return config
    name = config[len(SCHEME) :].removesuffix(".py")
    names = [shipped for shipped, _ in list_shipped_configs()]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(SCHEME + c for c in close)}?" if close else ""
        raise ConfigError(
            f"CONFIG {config}: lazytrain ships no config '{name}'.{hint} "
            "python -m lazytrain --help lists the shipped configs."
        )
    return os.path.join(get_shipped_config_dir("lazytrain.conf"), name + ".py")


def list_shipped_configs() -> list[tuple[str, str]]:
    """``(name, its docstring's first paragraph on one line)`` of each shipped config, by name."""
    folder = get_shipped_config_dir("lazytrain.conf")
    configs = []
    for file in sorted(os.listdir(folder)):
        if file.endswith(".py") and not file.startswith("_"):
            doc = get_module_docstring(os.path.join(folder, file)) or ""
            configs.append((file[:-3], " ".join(doc.split("\n\n", 1)[0].split())))
    return configs


def get_module_docstring(path: str) -> str | None:
    """The docstring of the Python file `path`; None when it has none or cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return ast.get_docstring(ast.parse(f.read()))
    except (OSError, SyntaxError):
        return None
