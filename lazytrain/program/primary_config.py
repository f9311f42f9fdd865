"""The CONFIG file of ``python -m lazytrain CONFIG`` as Hydra's primary config: the file's keys, the launch
defaults, the run directory as ``train.output_dir``, and the Hydra settings lazytrain needs (job name, no
chdir, the sweep summary callback, ``--help`` text)."""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig, OmegaConf

import lazytrain.data  # noqa: F401  (registers the lazytrain.json_* resolvers a config may use)
from lazytrain.config import LazyConfig
from lazytrain.config.shipped_configs import get_config_file, get_module_docstring

__all__ = ["DEFAULT_MAIN", "LAUNCH_DEFAULTS", "add_hydra_settings", "load_primary_config"]

DEFAULT_MAIN = "lazytrain.program.default.run"
LAUNCH_DEFAULTS = {
    "num_gpus": 0,
    "num_processes": 1,
    "num_machines": 1,
    "machine_rank": 0,
    "dist_url": "auto",
    "timeout": "4h",  # how long a collective waits for a peer (lazytrain.launch.launch.DEFAULT_TIMEOUT)
    "main": DEFAULT_MAIN,
}
_UNSET_OUTPUT_DIRS = (None, "", "./output")


def load_primary_config(config_path: str) -> DictConfig:
    """Load `config_path` (a file, or ``lazytrain://NAME``: `get_config_file`) and fill in what a run needs: the
    ``launch`` defaults under the file's own launch values, and ``train.output_dir`` = the Hydra run directory
    when the file leaves it unset or ``./output``."""
    cfg = LazyConfig.load(get_config_file(config_path))
    cfg.launch = OmegaConf.merge(LAUNCH_DEFAULTS, cfg.get("launch") or {})
    train = cfg.get("train")
    if isinstance(train, DictConfig) and _is_unset_output_dir(train):
        train.output_dir = "${hydra:runtime.output_dir}"
    return cfg


def _is_unset_output_dir(train: DictConfig) -> bool:
    if "output_dir" not in train:  # absent or ??? (a missing value is not "in" a DictConfig)
        return True
    return not OmegaConf.is_interpolation(train, "output_dir") and train.output_dir in _UNSET_OUTPUT_DIRS


def add_hydra_settings(cfg: DictConfig, config_path: str, result_file: str) -> None:
    """Add the ``hydra`` node: job name from the file, no chdir, the sweep summary callback (writing the count
    of failed jobs to `result_file`) and the ``--help`` text."""
    stem = os.path.splitext(os.path.basename(get_config_file(config_path)))[0]
    callback = {
        "_target_": "lazytrain.program.sweep_summary.SweepSummaryCallback",
        "result_file": result_file,
    }
    cfg.hydra = {
        "job": {"name": stem, "chdir": False},
        "callbacks": {"lazytrain_sweep_summary": callback},
        "help": {"template": _help_template(cfg, config_path)},
    }


def _help_template(cfg: DictConfig, config_path: str) -> str:
    """``--help``: the config's docstring, its top-level keys, how to override, then Hydra's config view."""
    lines = []
    config_file = get_config_file(config_path)
    doc = get_module_docstring(config_file) if config_file.endswith(".py") else None
    if doc:
        lines += [doc, ""]
    lines += [f"usage: python -m lazytrain {config_path} [-m] [key=value ...] [Hydra flags]", ""]
    lines += ["== Top-level keys =="]
    lines += [f"  {key}: {_describe_value(value)}" for key, value in cfg.items_ex(resolve=False)]
    lines += [
        "",
        "Override any value with key.sub=value; +key=value adds a key, ++key=value adds or overrides,",
        "~key deletes. Sweep with -m key=a,b,c (or range(...), choice(...)); several swept keys run the",
        "Cartesian product. Search: -m hydra/sweeper=optuna 'key=interval(a,b)' optimises objective.metric.",
        "Processes: launch.num_gpus, launch.num_processes (CPU), launch.num_machines,",
        "launch.machine_rank, launch.dist_url (auto = a free local port), launch.timeout (e.g. 4h).",
        "",
        "Useful flags: --cfg job (print the config, add --resolve to resolve it, -p KEY for one node),",
        "--info, -m/--multirun, hydra.run.dir=DIR / hydra.sweep.dir=DIR, hydra/launcher=joblib.",
        "train.verbose=true prints the full config, environment and model on the console (always in log.txt).",
        "",
    ]
    # OmegaConf would read "${" in the docstring as an interpolation.
    text = "\n".join(lines).replace("${", "\\${")
    return text + "== Config ==\n$CONFIG\n\n${hydra.help.footer}"


def _describe_value(value: object) -> str:
    if isinstance(value, DictConfig) and "_target_" in value:
        return f"builds {value._target_}"
    if isinstance(value, DictConfig):
        names = list(value)
        return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return "list" if isinstance(value, ListConfig) else type(value).__name__
