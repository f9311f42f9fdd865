"""`launch`: run a function in one process per GPU (or CPU worker), on one or several machines.

World size 1 runs in-process. Otherwise processes are spawned with torch.multiprocessing (NCCL + one GPU
each, or gloo on CPU). Under torchrun or a SLURM/submitit multi-task job the process group is initialised
from the environment instead (no spawn). A rank that raises stops the others and the error, naming the
rank, is re-raised in the parent: never a silent hang.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lazytrain.utils.preemption import StopRequest, TrainingInterrupted, signal_name

__all__ = ["RankFailedError", "find_free_port", "first_slurm_host", "get_env_rank_info", "launch"]

logger = logging.getLogger(__name__)
DEFAULT_TIMEOUT = timedelta(minutes=30)


class RankFailedError(RuntimeError):
    """A spawned rank raised or died; the message names the rank and holds its traceback."""


def find_free_port() -> int:
    """A free TCP port on localhost (chosen per job so concurrent jobs never collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port_free(dist_url: str) -> None:
    if not dist_url.startswith("tcp://"):
        return
    host, port = dist_url[len("tcp://") :].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("" if host in ("127.0.0.1", "localhost", "0.0.0.0") else host, int(port)))
        except OSError as e:
            raise ValueError(
                f"launch.dist_url={dist_url}: port {port} is already in use ({e.strerror}). Choose another port or "
                "use launch.dist_url=auto (single machine)."
            ) from None


def get_env_rank_info() -> dict[str, int] | None:
    """This process's place in a job started by torchrun, SLURM or submitit's local executor.

    torchrun: ``RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT``. SLURM: ``SLURM_PROCID/SLURM_NTASKS/
    SLURM_LOCALID`` with more than one task (MASTER_ADDR defaults to the first node of the job, MASTER_PORT to a
    port derived from the job id). submitit local: ``SUBMITIT_LOCAL_GLOBALID/NTASKS/LOCALID``.

    Returns:
        ``rank``, ``world_size``, ``local_rank``, ``local_size``; None when no such launcher started the
        process (or it started a single task, which then spawns as usual).
    """
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        return {
            "rank": int(env["RANK"]),
            "world_size": int(env["WORLD_SIZE"]),
            "local_rank": int(env.get("LOCAL_RANK", 0)),
            "local_size": int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
        }
    for prefix, rank, tasks, local in (
        ("SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("SUBMITIT_LOCAL", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_LOCALID"),
    ):
        if int(env.get(tasks, "1")) > 1 and rank in env:
            if prefix == "SLURM":
                env.setdefault("MASTER_ADDR", first_slurm_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")))
                per_node = env.get("SLURM_NTASKS_PER_NODE", env[tasks]).split("(")[0]
            else:
                env.setdefault("MASTER_ADDR", "127.0.0.1")
                per_node = env[tasks]
            # Every task derives the same port from the job id; jobs running side by side get different ones.
            job_id = "".join(c for c in env.get(f"{prefix}_JOB_ID", "0") if c.isdigit()) or "0"
            env.setdefault("MASTER_PORT", str(20000 + int(job_id) % 20000))
            return {
                "rank": int(env[rank]),
                "world_size": int(env[tasks]),
                "local_rank": int(env.get(local, 0)),
                "local_size": int(per_node),
            }
    return None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``"gpu-node[03-05,9],other"`` -> ``"gpu-node03"``."""
    match = re.match(r"([^,\[]+)(?:\[([^\],\-]+))?", nodelist.strip())
    if match is None:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}; set MASTER_ADDR")
    return match.group(1) + (match.group(2) or "")


def _choose_backend(backend: str, use_gpu: bool | None) -> str:
    """The process-group backend: nccl for one GPU per process, gloo on CPU."""
    if backend != "auto":
        return backend
    if use_gpu is None:
        import torch

        use_gpu = torch.cuda.is_available()
    return "nccl" if use_gpu else "gloo"


def _run_in_group(
    main_func: Callable,
    args: tuple,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_size: int,
    init_method: str,
    backend: str,
    timeout: timedelta,
) -> Any:
    import torch
    import torch.distributed as dist

    from lazytrain.utils import comm

    use_gpu = backend == "nccl"
    if use_gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend=backend, init_method=init_method, world_size=world_size, rank=rank, timeout=timeout
    )
    try:
        comm.create_local_process_group(local_size)
        comm.synchronize()
        return main_func(*args)
    finally:
        # Multirun jobs run back to back in one process: leave no group behind for the next job.
        if dist.is_initialized():
            dist.destroy_process_group()
        comm.reset_process_groups()


def _spawned_worker(
    local_rank: int,
    main_func,
    args,
    world_size,
    num_per_machine,
    machine_rank,
    dist_url,
    backend,
    timeout,
    stopped_by_signal,
    result_path: str,
) -> None:
    import torch

    # Ctrl-C reaches every process of the terminal's group; only the parent reacts and forwards a SIGTERM,
    # so that each rank sees exactly one stop request (and its data-loader workers, forked later, none).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SLURM's --signal reaches every process of the job (the default action would kill a rank); the parent
    # handles it (under submitit) and forwards a SIGTERM.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // num_per_machine))
    os.environ["LOCAL_RANK"] = str(local_rank)
    rank = machine_rank * num_per_machine + local_rank
    try:
        result = _run_in_group(
            main_func,
            args,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_size=num_per_machine,
            init_method=dist_url,
            backend=backend,
            timeout=timeout,
        )
        if local_rank == 0:
            _save_result(result, result_path)
    except TrainingInterrupted as e:
        # A clean stop (checkpoint written): exit 0, so the parent does not stop the other ranks while they
        # finish theirs; the parent raises TrainingInterrupted itself.
        stopped_by_signal.value = e.signum
    except Exception as e:
        # A rank that fails only because a peer died (its collective broke) waits a moment, so that the parent
        # reports the rank that failed first, with its own traceback.
        if _is_peer_failure(e):
            time.sleep(5)
        raise


def _save_result(result: Any, path: str) -> None:
    """Local rank 0's return value, for the parent (a file: a pipe could block on a large value)."""
    import pickle

    try:
        data = pickle.dumps(result)
    except Exception as e:
        logger.warning("launch: the return value of local rank 0 cannot be pickled (%s); returning None.", e)
        return
    with open(path, "wb") as f:
        f.write(data)


def _load_result(path: str) -> Any:
    """What `_save_result` wrote (None if nothing), and remove the file."""
    import pickle

    try:
        with open(path, "rb") as f:
            data = f.read()
        os.remove(path)
        return pickle.loads(data) if data else None
    except Exception as e:
        logger.warning("launch: cannot read the return value of local rank 0 from %s: %s", path, e)
        return None


def _is_peer_failure(error: Exception) -> bool:
    import torch.distributed as dist

    text = str(error)
    return (
        isinstance(error, dist.DistError) or "Connection closed by peer" in text or "Connection reset" in text
    )


def launch(
    main_func: Callable,
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: tuple = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
    backend: str = "auto",
    *,
    use_gpu: bool | None = None,
) -> Any:
    """Run ``main_func(*args)`` in every process of the job.

    Args:
        main_func: a module-level (picklable) function.
        num_gpus_per_machine: processes per machine (GPUs, or CPU workers when `use_gpu` is False).
        num_machines: machines in the job.
        machine_rank: this machine's index.
        dist_url: ``tcp://host:port`` of machine 0, or "auto" (a free local port; one machine only).
        args: arguments of `main_func` (picklable).
        timeout: process-group timeout (how long a collective waits for a peer).
        backend: "auto" (nccl with one GPU per process when `use_gpu`, else gloo), or an explicit backend.
        use_gpu: one GPU per process (``cuda.set_device(local_rank)``); None: whether CUDA is available.

    Returns:
        `main_func`'s return value in this process (world size 1, torchrun/SLURM), or that of the machine's
        local rank 0 after a spawn.
    """
    import multiprocessing
    import tempfile

    env_info = get_env_rank_info()
    if env_info is not None:
        logger.info("Process group from the environment: %s", env_info)
        return _run_in_group(
            main_func,
            args,
            **env_info,
            init_method="env://",
            backend=_choose_backend(backend, use_gpu),
            timeout=timeout,
        )
    world_size = num_machines * num_gpus_per_machine
    if world_size <= 1:
        return main_func(*args)
    if dist_url in (None, "auto"):
        if num_machines > 1:
            raise ValueError(
                "launch: dist_url='auto' works on one machine only; give launch.dist_url=tcp://HOST:PORT of machine 0"
            )
        dist_url = f"tcp://127.0.0.1:{find_free_port()}"
    elif machine_rank == 0:
        _check_port_free(dist_url)
    multiprocessing.set_start_method("spawn", force=True)
    import torch.multiprocessing as mp

    stopped_by_signal = multiprocessing.get_context("spawn").Value("i", 0)
    handle, result_path = tempfile.mkstemp(prefix="lazytrain_result_", suffix=".pkl")
    os.close(handle)
    context = mp.start_processes(
        _spawned_worker,
        args=(
            main_func,
            args,
            world_size,
            num_gpus_per_machine,
            machine_rank,
            dist_url,
            _choose_backend(backend, use_gpu),
            timeout,
            stopped_by_signal,
            result_path,
        ),
        nprocs=num_gpus_per_machine,
        start_method="spawn",
        join=False,
    )
    forwarder = _ForwardStopSignals(context.processes)
    try:
        with forwarder:
            # join() with a timeout returns regularly, so a failed rank is noticed within a second; on
            # failure it terminates the other ranks (which would otherwise wait in a collective until
            # `timeout`).
            while not context.join(timeout=1.0):
                pass
    except mp.ProcessRaisedException as e:
        rank = machine_rank * num_gpus_per_machine + e.error_index
        raise RankFailedError(
            f"rank {rank} (process {e.error_index} on machine {machine_rank}) failed:\n{e}"
        ) from None
    except mp.ProcessExitedException as e:
        rank = machine_rank * num_gpus_per_machine + e.error_index
        raise RankFailedError(
            f"rank {rank} (process {e.error_index} on machine {machine_rank}) exited with code {e.exit_code}"
        ) from None
    except BaseException:
        _terminate(context.processes)  # e.g. a second Ctrl-C in the parent: leave no orphan rank behind
        raise
    finally:
        result = _load_result(result_path)
    if stopped_by_signal.value:
        # Ctrl-C in the parent reached the ranks as SIGTERM; report (and exit with) what the user sent.
        signum = forwarder.signum or stopped_by_signal.value
        raise TrainingInterrupted(
            signum,
            f"Training stopped by {signal_name(signum)}: all {world_size} ranks saved a checkpoint and stopped at "
            "the same iteration; run the same command with train.resume=true to continue.",
        )
    return result


class _ForwardStopSignals(StopRequest):
    """In the parent of spawned ranks: the first SIGTERM or SIGINT is passed on to every rank as SIGTERM
    (each finishes its step, they checkpoint together and exit); a second SIGINT raises KeyboardInterrupt,
    which terminates them."""

    def __init__(self, processes: list) -> None:
        super().__init__()
        self.processes = processes

    def _on_first_request(self, signum: int) -> None:
        logger.warning(
            "Received %s: asking %d rank(s) to finish their step, save a checkpoint and stop%s.",
            signal_name(signum),
            len(self.processes),
            " (Ctrl-C again stops them at once)" if signum == signal.SIGINT else "",
        )
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)


def _terminate(processes: list, grace_seconds: float = 5.0) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
