"""What the commands on a trained run (``python -m lazytrain predict|export``) share: reading the run
(`load_run`, also behind `lazytrain.Predictor.from_run`), splitting and checking their command line, and
writing without overwriting.

A command line is ``RUN_DIR (or CONFIG) [IMAGE...] [key=value ...]``; the keys use Hydra's override grammar
and may name any key of the run's config or of the command's own section (``predict.*``, ``export.*``).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.config.shipped_configs import get_config_file
from lazytrain.utils.file_io import atomic_write

__all__ = [
    "IMAGE_EXTENSIONS",
    "CommandLineError",
    "find_images",
    "get_checkpoint_path",
    "load_run",
    "refuse_existing",
    "run_command",
    "split_arguments",
    "without_initial_weights",
    "write_json",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
_OVERRIDE = re.compile(r"^[~+]{0,2}[A-Za-z_][\w.\[\]]*=|^~[A-Za-z_][\w.]*$")


class CommandLineError(Exception):
    """A problem with a ``predict`` or ``export`` command line, said in one line."""


def run_command(name: str, argv: list[str], body: Callable[[list[str]], None], help_text: str) -> None:
    """Run a subcommand's `body` on `argv`: ``--help`` prints `help_text`; an error the user can fix ends the
    command with its one-line message and exit status 1."""
    if any(a in ("-h", "--help") for a in argv):
        print(help_text)
        return
    try:
        body(argv)
    except (CommandLineError, FileNotFoundError, ValueError, OSError, ImportError) as e:
        print(f"lazytrain {name}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def split_arguments(argv: list[str], *, images_required: bool = True) -> tuple[str, list[str], list[str]]:
    """(RUN_DIR or CONFIG, image arguments, key=value overrides)."""
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    positional = [a for a in argv if not _OVERRIDE.match(a)]
    if len(positional) < (2 if images_required else 1):
        wanted = " (or config) and at least one image, folder or glob" if images_required else ""
        raise CommandLineError(f"give a run directory{wanted} (--help shows how)")
    return positional[0], positional[1:], overrides


def find_images(arguments: list[str]) -> list[str]:
    """Image files named by `arguments` (files, folders, globs), in order, without repeats.

    Raises:
        CommandLineError: a path that does not exist, a folder or glob with no images, or no images at all.
    """
    found: list[str] = []
    for argument in arguments:
        if os.path.isdir(argument):
            files = sorted(os.path.join(argument, n) for n in os.listdir(argument) if _is_image_file(n))
            if not files:
                raise CommandLineError(
                    f"no images in folder {argument} (looked for {', '.join(IMAGE_EXTENSIONS)})"
                )
        elif glob.has_magic(argument):
            files = sorted(f for f in glob.glob(argument, recursive=True) if os.path.isfile(f))
            if not files:
                raise CommandLineError(f"no files match {argument}")
        elif os.path.isfile(argument):
            files = [argument]
        else:
            raise CommandLineError(f"image {argument} does not exist")
        found.extend(files)
    return list(dict.fromkeys(found))


def _is_image_file(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def load_run(
    source: str,
    overrides: Sequence[str] = (),
    *,
    checkpoint: str | None = None,
    checkpoint_key: str | None = None,
    set_defaults: Callable[[DictConfig, str], None] | None = None,
) -> tuple[DictConfig, str]:
    """A trained run's config with `overrides` applied, and the weights file to use.

    Args:
        source: a run directory (its ``config.yaml``), or a config file or shipped config
            (``lazytrain://NAME``, `get_config_file`), whose weights must then be named.
        overrides: key=value overrides in Hydra's grammar; unknown keys are an error.
        checkpoint: the weights: a path, or a file name inside the run directory (``model_0000299.pth``);
            default: the run's newest checkpoint (``last_checkpoint``), else ``model_final.pth``.
        checkpoint_key: a key of the config that names the weights instead of `checkpoint`, read after the
            overrides (a command's ``predict.checkpoint``, which `set_defaults` adds).
        set_defaults: ``set_defaults(cfg, directory)`` runs before the overrides, so they win over what it
            sets: a command adds its own keys there. `directory` is the run directory (``.`` for a config).

    Raises:
        FileNotFoundError: no config at `source`, or no weights (each message says what to give instead).
        ConfigError: an override names an unknown key or a wrong value.
    """
    directory = source if os.path.isdir(source) else "."
    config_file = os.path.join(source, "config.yaml") if os.path.isdir(source) else get_config_file(source)
    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"{config_file} not found: give a training run's directory (it holds config.yaml) or a config file"
        )
    cfg = LazyConfig.load(config_file)
    if set_defaults is not None:
        set_defaults(cfg, directory)
    LazyConfig.apply_overrides(cfg, list(overrides))
    if checkpoint_key is not None:
        checkpoint = OmegaConf.select(cfg, checkpoint_key)
    key = checkpoint_key or "checkpoint"
    if not os.path.isdir(source) and not checkpoint:
        raise FileNotFoundError(f"{source} is a config: name its weights with {key}=PATH")
    return cfg, get_checkpoint_path(directory, checkpoint, key=key)


def get_checkpoint_path(run_dir: str, checkpoint: str | None = None, *, key: str = "checkpoint") -> str:
    """The weights file to use: `checkpoint` (a path, or a file name inside `run_dir`), else the run's newest
    checkpoint (``last_checkpoint``), else ``model_final.pth``. `key` is what names the file in messages (the
    argument, or a command's key such as ``predict.checkpoint``).

    Raises:
        FileNotFoundError: naming the run directory or file, and the fix.
    """
    from lazytrain.engine.checkpoint import get_last_checkpoint  # torch: only once a run is read

    if checkpoint:
        inside = os.path.join(run_dir, checkpoint)
        path = inside if not os.path.isabs(checkpoint) and os.path.isfile(inside) else checkpoint
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{key}={checkpoint}: no such file (nor in {run_dir}).")
        return path
    newest = get_last_checkpoint(run_dir)
    if newest and os.path.isfile(newest):
        return newest
    final = os.path.join(run_dir, "model_final.pth")
    if os.path.isfile(final):
        return final
    raise FileNotFoundError(
        f"run directory {run_dir} has no weights (no last_checkpoint, no model_final.pth): the run saves them "
        f"at train.checkpointer.period and at its end. Let it train, or name a file with {key}=PATH."
    )


# How a model's config asks for initial weights while it is built: timm's (and many libraries') `pretrained`
# (True, a path or a URL), torchvision builders' `weights` and `weights_backbone`. (`train.init_checkpoint` is
# read by training only.)
_PRETRAINED_KEY = "pretrained"
_TORCHVISION_WEIGHT_KEYS = ("weights", "weights_backbone")


def without_initial_weights(cfg: DictConfig) -> DictConfig:
    """A copy of `cfg` whose ``model`` builds without initial weights: every ``pretrained`` key of a node with a
    ``_target_`` set to False, and the ``weights``/``weights_backbone`` of torchvision's builders to None.

    A trained run's checkpoint holds every weight of its model, so loading a run (predict, export,
    `Predictor.from_run`) must neither download nor read the weights its training started from: offline, or
    with the file moved, building the model would fail before the checkpoint is read.
    """
    cfg = copy.deepcopy(cfg)
    model = cfg.get("model")
    if isinstance(model, (DictConfig, ListConfig)):
        _turn_off_initial_weights(model)
    return cfg


def _turn_off_initial_weights(node: DictConfig | ListConfig) -> None:
    if isinstance(node, ListConfig):
        children = [node._get_node(i) for i in range(len(node))]
    else:
        target = "" if OmegaConf.is_interpolation(node, "_target_") else str(node.get("_target_", ""))
        if target and node.get(_PRETRAINED_KEY) not in (None, False):
            node[_PRETRAINED_KEY] = False
        if target.startswith("torchvision.models."):
            for key in _TORCHVISION_WEIGHT_KEYS:
                if key in node:
                    node[key] = None
        children = [node._get_node(key) for key in node.keys()]
    for child in children:
        if isinstance(child, (DictConfig, ListConfig)):
            _turn_off_initial_weights(child)


def refuse_existing(paths: list[str], key: str) -> None:
    """Raise naming the first of `paths` that exists: a command never overwrites what is there."""
    for path in paths:
        if os.path.exists(path):
            raise CommandLineError(
                f"{path} exists; nothing is overwritten. Choose another {key}=DIR or remove it."
            )


def write_json(path: str, data: Any) -> None:
    """Write `data` as json to `path` atomically (a reader never sees half a file)."""
    atomic_write(path, lambda f: f.write(json.dumps(data).encode()))
