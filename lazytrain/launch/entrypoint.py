"""``python -m lazytrain CONFIG [Hydra flags and overrides]``: a LazyConfig file run as a Hydra app.

How it works: CONFIG (a ``.py`` LazyConfig or a saved ``.yaml``, anywhere in argv) is taken out of argv and
loaded once into plain data, which is registered as Hydra's primary config in the ConfigStore; the rest of
argv goes to a ``hydra.main`` app, so every Hydra habit works (overrides, ``-m`` sweeps, ``--cfg job``,
``hydra.run.dir``, launchers, sweepers, callbacks). Each job resolves its config, validates it (all
problems at once, with key paths), checks the data sets are on disk, and then launches the per-rank program
(``launch.main``, default `lazytrain.engine.defaults.run`) in one process per GPU or CPU worker.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import Any

__all__ = ["CONFIG_NAME", "main", "run_job"]

CONFIG_NAME = "lazytrain_config"
DEFAULT_MAIN = "lazytrain.engine.defaults.run"
LAUNCH_DEFAULTS = {
    "num_gpus": 0,
    "num_processes": 1,
    "num_machines": 1,
    "machine_rank": 0,
    "dist_url": "auto",
    "timeout": "4h",  # how long a collective waits for a peer (lazytrain.launch.launch.DEFAULT_TIMEOUT)
    "main": DEFAULT_MAIN,
}
_USAGE = "usage: python -m lazytrain CONFIG.py|CONFIG.yaml [-m] [key=value ...] [Hydra flags]"

logger = logging.getLogger("lazytrain.launch")


def _split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    for index, arg in enumerate(argv):
        if not arg.startswith("-") and "=" not in arg and arg.endswith((".py", ".yaml", ".yml")):
            return arg, argv[:index] + argv[index + 1 :]
    return None, argv


def _fail(message: str) -> None:
    print(f"lazytrain: {message}", file=sys.stderr)
    raise SystemExit(1)


def _precheck_overrides(cfg, overrides: list[str]):
    """Report unknown keys with did-you-mean suggestions before Hydra starts (Hydra's message has none).
    Returns a copy of `cfg` with the plain (non-sweep) overrides applied."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lazytrain.config import LazyConfig
    from lazytrain.config.overrides import suggest_keys

    parser = OverridesParser.create()
    plain = []
    for line in overrides:
        if line.startswith("-") or "=" not in line and not line.startswith("~"):
            continue
        override = parser.parse_override(line)
        key = override.key_or_group
        if key.startswith("hydra") or "/" in key:
            continue
        if override.is_sweep_override():
            if not (override.is_add() or override.is_force_add()) and _select(cfg, key) is _MISSING:
                suggestions = suggest_keys(cfg, key)
                hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
                raise _config_error(f"override '{line}': key '{key}' is not in the config.{hint}")
            continue
        plain.append(line)
    return LazyConfig.apply_overrides(cfg.copy(), plain)


_MISSING = object()


def _select(cfg, key: str) -> Any:
    from omegaconf import DictConfig, OmegaConf

    value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False)
    if value is _MISSING:  # a mandatory value (???) is a key too: -m data.train.json=a.json,b.json
        parent, _, last = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
        if isinstance(node, DictConfig) and last in node.keys():
            return None
    return value


def _config_error(message: str):
    from lazytrain.errors import ConfigError

    return ConfigError(message)


def _primary_config(cfg, config_path: str) -> dict:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=False)
    launch = {**LAUNCH_DEFAULTS, **data.get("launch", {})}
    data["launch"] = launch
    if isinstance(data.get("train"), dict) and data["train"].get("output_dir") in (
        None,
        "",
        "???",
        "./output",
    ):
        data["train"]["output_dir"] = "${hydra:runtime.output_dir}"
    stem = os.path.splitext(os.path.basename(config_path))[0]
    data["hydra"] = {
        "job": {"name": stem, "chdir": False},
        "callbacks": {
            "lazytrain_sweep_summary": {"_target_": "lazytrain.launch.summary.SweepSummaryCallback"}
        },
        "help": {"template": _help_template(data, config_path)},
    }
    return data


def _help_template(data: dict, config_path: str) -> str:
    """``--help``: the config's docstring, its top-level keys, how to override, then Hydra's config view."""
    lines = []
    if config_path.endswith(".py"):
        doc = _module_docstring(config_path)
        if doc:
            lines += [doc, ""]
    lines += [f"usage: python -m lazytrain {config_path} [-m] [key=value ...] [Hydra flags]", ""]
    lines += ["== Top-level keys =="]
    for key, value in data.items():
        if isinstance(value, dict) and "_target_" in value:
            kind = f"builds {value['_target_']}"
        elif isinstance(value, dict):
            names = list(value)
            kind = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        else:
            kind = type(value).__name__
        lines.append(f"  {key}: {kind}")
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


def _module_docstring(path: str) -> str | None:
    import ast

    try:
        with open(path) as f:
            return ast.get_docstring(ast.parse(f.read()))
    except (OSError, SyntaxError):
        return None


def main(argv: list[str] | None = None) -> None:
    """The command-line entrypoint (also the ``lazytrain`` console script)."""
    # Busy-waiting OpenMP threads make CPU training up to 10x slower when the cores are shared (measured:
    # 8.5 s vs 0.7 s per Mask R-CNN step); must be set before torch is imported. Spawned ranks inherit it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Shown in the run header (lazytrain.engine.run_report.COMMAND_ENV); spawned ranks inherit it.
    os.environ["LAZYTRAIN_COMMAND"] = shlex.join(["python", "-m", "lazytrain", *argv])
    config_path, rest = _split_config(argv)
    if config_path is None:
        if any(a in ("-h", "--help") for a in argv):
            print(_USAGE)
            return
        _fail(f"no CONFIG file given.\n{_USAGE}")
    from omegaconf import OmegaConf

    from lazytrain.config import LazyConfig
    from lazytrain.errors import ConfigError
    from lazytrain.launch import checks
    from lazytrain.launch.objective import check_search
    from lazytrain.launch.parent_watch import mark_sweep_process

    try:
        primary = _primary_config(LazyConfig.load(config_path), config_path)
        overridden = _precheck_overrides(
            OmegaConf.create({k: v for k, v in primary.items() if k != "hydra"}), rest
        )
        # A search sweeper (hydra/sweeper=optuna, ...) needs the objective: check it now, pass its direction.
        rest = rest + check_search(overridden, rest, DEFAULT_MAIN)
        checks.check_output_dirs(rest)
        if not _INFO_FLAGS.intersection(rest):  # before Hydra creates the output directory
            _check_json_datasets(overridden, skip_unset=bool({"-m", "--multirun"}.intersection(rest)))
    except ConfigError as e:
        _fail(str(e))
    import hydra
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=CONFIG_NAME, node=primary)
    logging.getLogger("alembic").setLevel(
        logging.WARNING
    )  # optuna's import logs alembic's plugin setup at INFO
    sys.argv = [sys.argv[0], *_quiet_non_main_rank(rest)]
    mark_sweep_process()
    hydra.main(version_base="1.3", config_path=None, config_name=CONFIG_NAME)(_hydra_task)()
    from lazytrain.launch import summary

    if summary.failed_jobs_of_last_sweep:
        _fail(f"{summary.failed_jobs_of_last_sweep} job(s) of the sweep failed; see the summary above.")


def _hydra_task(cfg) -> Any:
    """One Hydra job; returns the config's objective metric (a float, what search sweepers read).

    A single run reports known errors as one paragraph; in a sweep, a failing job is logged, recorded as
    failed in the summary, and returns the worst objective value (`FailedJobValue`), so the sweep goes on.
    A job in a launcher's worker process stops cleanly if the sweep's main process goes away (`ParentWatch`).
    """
    from lazytrain.launch.parent_watch import watch_sweep_parent

    with watch_sweep_parent():
        return _run_hydra_job(cfg)


def _run_hydra_job(cfg) -> Any:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from lazytrain.errors import LazytrainError
    from lazytrain.launch.launch import RankFailedError
    from lazytrain.launch.objective import FailedJobValue, check_objective, worst_value
    from lazytrain.utils.preemption import TrainingInterrupted, hand_over_requeue_signal

    single_run = HydraConfig.get().mode == RunMode.RUN
    objective = check_objective(cfg.objective) if cfg.get("objective") is not None else None
    worst = worst_value(objective["direction"]) if objective else float("nan")
    try:
        return _get_job_value(run_job(cfg), objective)
    except TrainingInterrupted as e:
        # Preemption or Ctrl-C: the checkpoint is written; stop (a sweep too) with status 128 + signal.
        print(f"lazytrain: {e}", file=sys.stderr)
        hand_over_requeue_signal(e.signum)
        raise SystemExit(e.exit_code) from None
    except (LazytrainError, RankFailedError) as e:
        # Known problems (config, data, checkpoint files) read best as one paragraph; HYDRA_FULL_ERROR=1 shows
        # the traceback, as for Hydra's own errors.
        if single_run and os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if single_run:
            _fail(str(e))
        logger.error("Job %s failed: %s", HydraConfig.get().job.num, e)
        return FailedJobValue(worst, str(e))
    except Exception as e:
        if single_run:
            raise
        logger.exception("Job %s failed", HydraConfig.get().job.num)
        return FailedJobValue(worst, f"{type(e).__name__}: {e}")


def _get_job_value(results: Any, objective: dict | None) -> Any:
    """The objective metric of a finished job's results (its worst value, with a warning, when the results
    lack it); the results themselves when the config has no objective."""
    from lazytrain.launch.objective import get_objective_value, list_metrics, worst_value

    if objective is None:
        return results
    value = get_objective_value(results, objective["metric"])
    if value is None:
        logger.warning(
            "objective.metric=%s is not in the job's final results (it has: %s); the job returns %s.",
            objective["metric"],
            ", ".join(list_metrics(results)) or "none, was there an evaluation?",
            worst_value(objective["direction"]),
        )
        return worst_value(objective["direction"])
    return value


def _check_datasets(cfg) -> None:
    """Fail before spawning when a data set the config names is not on disk."""
    from lazytrain.data.datasets.builtin import find_missing_data

    problems = find_missing_data(cfg)
    if problems:
        raise _config_error("\n".join(problems))


_INFO_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion"}


def _check_json_datasets(cfg, skip_unset: bool = False) -> None:
    """Fail before spawning (and before Hydra writes anything) when a json data set the config registers
    has a problem (lazytrain.data.datasets.preflight)."""
    from lazytrain.data.datasets.preflight import find_json_dataset_problems

    problems = find_json_dataset_problems(cfg, skip_unset=skip_unset)
    if problems:
        raise _config_error("the data set files have problems:\n  " + "\n  ".join(problems))


def _check_init_checkpoint(cfg) -> None:
    """Fail before spawning when ``train.init_checkpoint`` names a local file that does not exist or is not a
    checkpoint (and a resumed run would not make it unused), or when the checkpoint to resume from is not one."""
    from lazytrain.engine.checkpoint import get_non_checkpoint_reason

    train = cfg.get("train") or {}
    path = train.get("init_checkpoint")
    output_dir = train.get("output_dir")
    resumed = (
        train.get("resume") and output_dir and os.path.exists(os.path.join(output_dir, "last_checkpoint"))
    )
    if resumed:
        with open(os.path.join(output_dir, "last_checkpoint")) as f:
            last = os.path.join(output_dir, f.read().strip())
        reason = get_non_checkpoint_reason(last) if os.path.isfile(last) else None
        if reason:
            raise _config_error(
                f"train.resume=true: {last} (named in last_checkpoint) is not a checkpoint: {reason}. Delete it "
                "and write the name of an earlier checkpoint into last_checkpoint, or start afresh."
            )
    if path and "://" in str(path) and not resumed:
        from lazytrain.modeling.weights import prefetch_init_weights

        # Downloaded once per machine here, before any rank starts (the ranks then read the cached file); no
        # internet: one line naming the URL, where to put the file, and the keys to use instead.
        prefetch_init_weights(str(path))
        return
    if path and "://" not in str(path) and os.path.isfile(str(path)) and not resumed:
        reason = get_non_checkpoint_reason(str(path))
        if reason:
            raise _config_error(
                f"train.init_checkpoint={path}: not a checkpoint: {reason}. Give a lazytrain .pth, torchvision "
                "detection or ImageNet ResNet weights, or train.init_checkpoint=null."
            )
    if not path or "://" in str(path) or os.path.exists(str(path)) or resumed:
        return
    raise _config_error(
        f"train.init_checkpoint={path}: no such file. Give the path of a checkpoint (a lazytrain .pth, "
        "torchvision detection or ImageNet ResNet weights), or train.init_checkpoint=null to start from random "
        "weights."
    )


def run_job(cfg) -> Any:
    """One Hydra job: resolve, validate, check data, launch the per-rank program."""
    import multiprocessing

    from omegaconf import OmegaConf

    from lazytrain.config import locate, validate
    from lazytrain.engine.defaults import INJECTED_ARGUMENTS
    from lazytrain.launch import checks

    multiprocessing.set_start_method("spawn", force=True)
    _check_json_datasets(cfg)  # before resolving: values derived from the json need it readable
    checks.resolve_values(cfg)
    checks.resume_if_requeued(cfg)
    launch_cfg = cfg.launch
    validate(cfg, INJECTED_ARGUMENTS)
    checks.check_launch_values(launch_cfg)
    _check_datasets(cfg)
    _check_init_checkpoint(cfg)
    from lazytrain.launch.launch import get_env_rank_info, launch, parse_timeout

    num_gpus = launch_cfg.num_gpus
    use_gpu = str(cfg.get("train", {}).get("device", "cpu")).startswith("cuda")
    env_info = get_env_rank_info()
    if use_gpu and env_info is not None and env_info["local_size"] > 1:
        num_gpus = 1  # the launcher started one process per GPU (launch.get_gpu_index picks its GPU)
    elif use_gpu:
        num_gpus = _resolve_num_gpus(num_gpus)
    elif num_gpus not in (0, None, "auto"):
        raise _config_error(
            f"launch.num_gpus={num_gpus} but train.device is not cuda; set train.device=cuda, or use "
            "launch.num_processes=N for N CPU processes."
        )
    per_machine = num_gpus if use_gpu else int(launch_cfg.num_processes)
    main_path = str(launch_cfg.main)
    locate(main_path)  # fail here, not in every rank
    container = OmegaConf.to_container(cfg, resolve=False)  # node references stay references
    return launch(
        _run_rank,
        per_machine,
        num_machines=int(launch_cfg.num_machines),
        machine_rank=int(launch_cfg.machine_rank),
        dist_url=launch_cfg.dist_url,
        args=(container, main_path, env_info is not None),
        timeout=parse_timeout(launch_cfg.get("timeout", LAUNCH_DEFAULTS["timeout"])),
        use_gpu=use_gpu,
    )


def _resolve_num_gpus(requested) -> int:
    import torch

    visible = torch.cuda.device_count()
    if visible == 0:
        raise _config_error(
            "train.device=cuda but no GPU is visible (torch.cuda.device_count() is 0); use train.device=cpu "
            "(and launch.num_processes=N for N CPU processes)."
        )
    if requested == "auto" or requested is None:
        return visible
    requested = int(requested)
    if requested > visible:
        raise _config_error(
            f"launch.num_gpus={requested} but only {visible} GPU(s) are visible; lower launch.num_gpus or use "
            "train.device=cpu with launch.num_processes."
        )
    return max(requested, 1)


def _run_rank(container: dict, main_path: str, use_rank0_config: bool = False) -> Any:
    """What every rank runs: rebuild the config and call the program."""
    from omegaconf import OmegaConf

    from lazytrain.config import locate
    from lazytrain.utils import comm

    if use_rank0_config:
        # Under torchrun/SLURM every rank ran the same command and resolved its own config; values such as a
        # timestamped run dir can differ by a second between ranks, so all ranks take rank 0's. (Machines
        # started by separate commands keep their own config: their differences are deliberate.)
        container = comm.all_gather(container)[0]
    results = locate(main_path)(OmegaConf.create(container))
    # Only rank 0 has the evaluation results; every rank returns them, so that each process running a Hydra
    # job (torchrun, SLURM, other machines) returns the same objective.
    return comm.all_gather(results)[0] if comm.get_world_size() > 1 else results


def _quiet_non_main_rank(overrides: list[str]) -> list[str]:
    """Under torchrun/SLURM every rank runs the Hydra app: only rank 0 writes ``.hydra/`` and Hydra's log."""
    from lazytrain.launch.launch import get_env_rank_info

    info = get_env_rank_info()
    if info is None or info["rank"] == 0:
        return overrides
    extra = {"hydra.output_subdir": "hydra.output_subdir=null", "hydra/job_logging": "hydra/job_logging=none"}
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    return overrides + [override for key, override in extra.items() if key not in given]
