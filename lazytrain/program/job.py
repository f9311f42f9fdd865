"""One Hydra job: its config made ready and checked, one process per GPU or CPU worker started, each running
the per-rank program (``launch.main``, default `lazytrain.program.default.run`), and the job's value for
Hydra (the objective metric a search sweeper reads).

    run_hydra_job(cfg)              the Hydra task: errors become one paragraph, or a failed sweep job
      -> launch_job(cfg)            prepare, preflight, fetch weights, start the processes
           -> run_rank(container)   in every process: the config rebuilt, the program called
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import locate
from lazytrain.errors import LazytrainError
from lazytrain.launch.environment import get_env_rank_info
from lazytrain.launch.launch import RankFailedError, launch, parse_timeout
from lazytrain.launch.parent_watch import watch_sweep_parent
from lazytrain.modeling.weights import prefetch_init_weights
from lazytrain.program.default import INJECTED_ARGUMENTS
from lazytrain.program.job_config import prepare_job_config
from lazytrain.program.job_plan import get_processes_per_machine, resumes_from_checkpoint, uses_gpu
from lazytrain.program.objective import FailedJobValue, check_objective, get_job_value, worst_value
from lazytrain.program.preflight import preflight, raise_problems
from lazytrain.program.run_report import resume_command
from lazytrain.utils import comm
from lazytrain.utils.preemption import TrainingInterrupted, hand_over_requeue_signal

__all__ = ["launch_job", "run_hydra_job", "run_rank"]

logger = logging.getLogger(__name__)


def run_hydra_job(cfg: DictConfig) -> Any:
    """The Hydra task: run one job and return the config's objective metric (a float; the results when the
    config has no objective).

    A single run reports known errors as one paragraph (``HYDRA_FULL_ERROR=1`` shows the traceback); in a
    sweep, a failing job is logged, recorded as failed in the summary, and returns the worst objective value
    (`FailedJobValue`), so the sweep goes on. A job in a launcher's worker process stops cleanly if the sweep's
    main process goes away (`lazytrain.launch.parent_watch`).
    """
    objective = check_objective(cfg.objective) if cfg.get("objective") is not None else None
    with watch_sweep_parent():
        try:
            return get_job_value(launch_job(cfg), objective)
        except TrainingInterrupted as e:
            # Preemption or Ctrl-C: the checkpoint is written; stop (a sweep too) with status 128 + signal.
            print(f"lazytrain: {e}", file=sys.stderr)
            if HydraConfig.get().mode == RunMode.RUN:  # a sweep continues as the same sweep command
                print(f"lazytrain: to continue: {resume_command(str(cfg.train.output_dir))}", file=sys.stderr)
            hand_over_requeue_signal(e.signum)
            raise SystemExit(e.exit_code) from None
        except Exception as e:
            return _fail_job(e, objective)


def _fail_job(error: Exception, objective: dict | None) -> FailedJobValue:
    """A single run stops on `error`; a sweep job is logged as failed and scores the worst value."""
    known = isinstance(error, (LazytrainError, RankFailedError))
    if HydraConfig.get().mode == RunMode.RUN:
        if not known or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise error
        print(f"lazytrain: {error}", file=sys.stderr)
        raise SystemExit(1)
    number = HydraConfig.get().job.num
    if known:  # config, data and checkpoint problems read best as one paragraph
        logger.error("Job %s failed: %s", number, error)
    else:
        logger.exception("Job %s failed", number, exc_info=error)
    reason = str(error) if known else f"{type(error).__name__}: {error}"
    return FailedJobValue(worst_value(objective["direction"]) if objective else float("nan"), reason)


def launch_job(cfg: DictConfig) -> Any:
    """Resolve and check the job's config, fetch its initial weights, and run ``launch.main`` in one process
    per GPU or CPU worker (or in this process, for one). Returns rank 0's results."""
    prepare_job_config(cfg)
    raise_problems(preflight(cfg, INJECTED_ARGUMENTS))
    main_path = str(cfg.launch.main)  # importable: checked by preflight
    _fetch_init_weights(cfg)
    launch_cfg = cfg.launch
    return launch(
        run_rank,
        get_processes_per_machine(cfg),
        num_machines=int(launch_cfg.num_machines),
        machine_rank=int(launch_cfg.machine_rank),
        dist_url=launch_cfg.dist_url,
        # The one conversion to plain data: it pickles to spawned processes (node references stay references).
        args=(OmegaConf.to_container(cfg, resolve=False), main_path, get_env_rank_info() is not None),
        timeout=parse_timeout(launch_cfg.timeout),
        use_gpu=uses_gpu(cfg),
    )


def _fetch_init_weights(cfg: DictConfig) -> None:
    """Download a URL ``train.init_checkpoint`` once per machine, before any rank starts (the ranks then read
    the cached file); without internet, one line naming the URL, where to put the file, and the keys to use."""
    path = str((cfg.get("train") or {}).get("init_checkpoint") or "")
    if "://" in path and not resumes_from_checkpoint(cfg):
        prefetch_init_weights(path)


def run_rank(container: dict, main_path: str, use_rank0_config: bool = False) -> Any:
    """What every rank runs: rebuild the config and call the program; every rank returns rank 0's results."""
    if use_rank0_config:
        # Under torchrun/SLURM every rank ran the same command and resolved its own config; values such as a
        # timestamped run dir can differ by a second between ranks, so all ranks take rank 0's. (Machines
        # started by separate commands keep their own config: their differences are deliberate.)
        container = comm.all_gather(container)[0]
    results = locate(main_path)(OmegaConf.create(container))
    # Only rank 0 has the evaluation results; every rank returns them, so that each process running a Hydra
    # job (torchrun, SLURM, other machines) returns the same objective.
    return comm.all_gather(results)[0] if comm.get_world_size() > 1 else results
