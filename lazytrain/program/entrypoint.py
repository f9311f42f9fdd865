"""``python -m lazytrain CONFIG [Hydra flags and overrides]``: a LazyConfig file run as a Hydra app.

CONFIG (a ``.py`` LazyConfig or a saved ``.yaml``, anywhere in argv) is taken out of argv and loaded once
(`lazytrain.program.primary_config`); the command line is checked against it before Hydra starts
(`lazytrain.program.preflight.check_command_line`); the config is then registered as Hydra's primary config
and the rest of argv goes to a ``hydra.main`` app, so every Hydra habit works (overrides, ``-m`` sweeps,
``--cfg job``, ``hydra.run.dir``, launchers, sweepers, callbacks). Each Hydra job is
`lazytrain.program.job.run_hydra_job`.

    main(argv)
      -> load_primary_config(CONFIG); check_command_line(cfg, overrides); get_search_overrides
      -> _run_hydra(cfg, overrides)      Hydra runs run_hydra_job once per job
      -> exit status 1 when a job of a sweep failed
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import tempfile
import textwrap

from lazytrain.config.shipped_configs import SCHEME

__all__ = ["CONFIG_NAME", "SUBCOMMANDS", "main"]

CONFIG_NAME = "lazytrain_config"
SUBCOMMANDS = ("predict", "export", "cache", "convert-detectron2")
_USAGE = (
    "usage: python -m lazytrain CONFIG.py|CONFIG.yaml|lazytrain://NAME [-m] [key=value ...] [Hydra flags]\n"
    "       python -m lazytrain predict RUN_DIR IMAGE... [key=value ...]   (--help for more)\n"
    "       python -m lazytrain export RUN_DIR [key=value ...]              (--help for more)\n"
    "       python -m lazytrain cache [DATASET|JSON ...] [--clear]           (--help for more)\n"
    "       python -m lazytrain convert-detectron2 FILE OUT.pth [--force]      (--help for more)"
)


def split_config_path(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the CONFIG named in `argv`: a file or a shipped config's ``lazytrain://NAME``, the other arguments);
    None when no CONFIG is named."""
    for index, arg in enumerate(argv):
        if arg.startswith(SCHEME) or (
            not arg.startswith("-") and "=" not in arg and arg.endswith((".py", ".yaml", ".yml"))
        ):
            return arg, argv[:index] + argv[index + 1 :]
    return None, argv


def _fail(message: str) -> None:
    print(f"lazytrain: {message}", file=sys.stderr)
    raise SystemExit(1)


def _run_subcommand(name: str, argv: list[str]) -> None:
    """``python -m lazytrain predict|export ...``: what to do with a trained run; ``cache``: the annotation
    cache files; ``convert-detectron2``: a detectron2 checkpoint as a lazytrain one."""
    if name == "predict":
        from lazytrain.program import predict_command

        predict_command.main(argv)
    elif name == "export":
        from lazytrain.program import export_command

        export_command.main(argv)
    elif name == "convert-detectron2":
        from lazytrain.program import convert_command

        convert_command.main(argv)
    else:
        from lazytrain.program import cache_command

        cache_command.main(argv)


def main(argv: list[str] | None = None) -> None:
    """The command-line entrypoint (also the ``lazytrain`` console script)."""
    # Busy-waiting OpenMP threads make CPU training many times slower when the cores are shared (see
    # docs/benchmarks.md); must be set before torch is imported. Spawned ranks inherit it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _run_subcommand(argv[0], argv[1:])
    # Shown in the run header (lazytrain.program.run_report.COMMAND_ENV); spawned ranks inherit it.
    os.environ["LAZYTRAIN_COMMAND"] = shlex.join(["python", "-m", "lazytrain", *argv])
    config_path, overrides = split_config_path(argv)
    if config_path is None:
        if any(a in ("-h", "--help") for a in argv):
            print(f"{_USAGE}\n\n{_describe_shipped_configs()}")
            return
        _fail(f"no CONFIG file given.\n{_USAGE}")
    from lazytrain.config.shipped_configs import get_config_file
    from lazytrain.errors import ConfigError
    from lazytrain.program.default import INJECTED_ARGUMENTS
    from lazytrain.program.objective import get_search_overrides
    from lazytrain.program.preflight import check_command_line
    from lazytrain.program.preflight.command_line import apply_plain_overrides
    from lazytrain.program.primary_config import DEFAULT_MAIN, load_primary_config

    try:
        cfg = load_primary_config(config_path)
        check_command_line(cfg, overrides, DEFAULT_MAIN, INJECTED_ARGUMENTS, get_config_file(config_path))
        # A search sweeper (hydra/sweeper=optuna, ...) is told the objective's direction.
        overrides = overrides + get_search_overrides(apply_plain_overrides(cfg, overrides), overrides)
    except ConfigError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _fail(str(e))
    failed_jobs, failures = _run_hydra(cfg, config_path, overrides)
    if failed_jobs:
        _fail(
            f"{failed_jobs} job(s) of the sweep failed (summary above):\n"
            + "\n".join(f"  {f}" for f in failures)
        )


def _describe_shipped_configs() -> str:
    """``--help``'s list of the configs in the package, by the name that runs them."""
    from lazytrain.config.shipped_configs import list_shipped_configs
    from lazytrain.errors import ConfigError

    try:
        configs = list_shipped_configs()
    except ConfigError as e:  # a clone run without an install, an editable install older than the configs
        return f"Shipped configs: none found ({e})"
    width = max(len(name) for name, _ in configs)
    lines = [f"Shipped configs (python -m lazytrain {SCHEME}NAME; in a clone also conf/NAME.py):"]
    for name, summary in configs:
        lines += textwrap.wrap(
            summary, 110, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4)
        )
    return "\n".join(lines)


def _delete_before_sweep(cfg, overrides: list[str]) -> list[str]:
    """Hydra 1.4's sweepers hand each job a valueless ``~key`` as ``~key=null``, which its config loader then
    refuses unless the key holds null (1.3 deleted it whatever it held): in a sweep, those deletions are made on
    the stored config instead, the same for every job since a deletion is not swept."""
    from lazytrain.config.overrides import apply_overrides

    if "-m" not in overrides and "--multirun" not in overrides:
        return overrides
    deletions = [line for line in overrides if line.startswith("~") and "=" not in line]
    apply_overrides(cfg, deletions)
    return [line for line in overrides if line not in deletions]


def _run_hydra(cfg, config_path: str, overrides: list[str]) -> tuple[int, list[str]]:
    """Run the Hydra app on `cfg` with `overrides`; return the number of failed jobs of a sweep and a line
    naming each with its reason."""
    import hydra
    from hydra.core.config_store import ConfigStore

    from lazytrain.launch.parent_watch import mark_sweep_process
    from lazytrain.program.job import run_hydra_job
    from lazytrain.program.primary_config import add_hydra_settings

    with tempfile.TemporaryDirectory(prefix="lazytrain-") as directory:
        result_file = os.path.join(directory, "sweep_result.json")
        add_hydra_settings(cfg, config_path, result_file)
        if hydra.__version__.startswith("1.3."):
            # Without version_base, Hydra 1.3 keeps 1.1's behaviour (and warns).
            ConfigStore.instance().store(name=CONFIG_NAME, node=cfg)
            hydra_main = hydra.main(version_base="1.3", config_path=None, config_name=CONFIG_NAME)
        else:
            # Hydra 1.4 warns on any version_base (deprecated, gone in 1.5) and on a name stored again without
            # replace=True (a second main() in one process), which 1.3's store() does not take. Its
            # instantiate, which builds only hydra.callbacks here, warns without an execution allow-list (1.5
            # refuses): lazytrain's own instantiate builds whatever a config names (a config is code), so an
            # allow-list would protect nothing and would refuse a user's own callbacks (docs/hydra_versions.md).
            from hydra.utils import UNSAFE_DISABLE_EXECUTION_CHECKS

            overrides = _delete_before_sweep(cfg, overrides)
            ConfigStore.instance().store(name=CONFIG_NAME, node=cfg, replace=True)
            hydra_main = hydra.main(
                config_path=None, config_name=CONFIG_NAME, execution_whitelist=UNSAFE_DISABLE_EXECUTION_CHECKS
            )
        logging.getLogger("alembic").setLevel(logging.WARNING)  # optuna's import logs its plugin setup
        sys.argv = [sys.argv[0], *_quiet_non_main_rank(overrides)]
        mark_sweep_process()
        hydra_main(run_hydra_job)()
        if not os.path.exists(result_file):  # a single run (its failure already exited), or no sweep
            return 0, []
        with open(result_file) as f:
            result = json.load(f)
        return int(result["failed_jobs"]), list(result["failures"])


def _quiet_non_main_rank(overrides: list[str]) -> list[str]:
    """Under torchrun/SLURM every rank runs the Hydra app: only rank 0 writes ``.hydra/`` and Hydra's log."""
    from lazytrain.launch.environment import get_env_rank_info

    info = get_env_rank_info()
    if info is None or info["rank"] == 0:
        return overrides
    extra = {"hydra.output_subdir": "hydra.output_subdir=null", "hydra/job_logging": "hydra/job_logging=none"}
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    return overrides + [override for key, override in extra.items() if key not in given]
