"""Where this process stands in a job that a launcher started, read from the environment variables of torchrun,
SLURM (``srun``, submitit) and submitit's local executor.

Every function here reads a mapping (``os.environ`` unless one is given, so tests pass a plain dict) and
returns values; nothing here writes the environment. `lazytrain.launch.launch` decides from them whether this
process is a rank or spawns the ranks of its machine, and where the ranks meet.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TypedDict

__all__ = [
    "RankInfo",
    "expand_slurm_counts",
    "first_slurm_host",
    "get_env_rank_info",
    "get_slurm_cpus_per_task",
]


class RankInfo(TypedDict):
    """This process's place in a launched job (`get_env_rank_info`).

    ``launcher``: "torchrun", "slurm" or "submitit-local". ``local_size``: processes on this node;
    ``node_rank`` and ``num_nodes``: this node's index and the job's nodes. ``master_addr`` and
    ``master_port``: where the ranks meet (the job's TCP store): MASTER_ADDR and MASTER_PORT when set, else,
    under SLURM, the job's first node and a port derived from the job id (127.0.0.1 under submitit local).
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: str


def get_env_rank_info(env: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's place in a job started by torchrun, SLURM (``srun``, submitit) or submitit's local executor.

    torchrun: ``RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK``. SLURM: ``SLURM_PROCID/SLURM_NTASKS/
    SLURM_LOCALID/SLURM_NODEID`` with more than one task; the tasks on this node come from
    ``SLURM_STEP_TASKS_PER_NODE`` (or ``SLURM_TASKS_PER_NODE``, e.g. ``"4(x2),3"``), which srun sets with and
    without ``--ntasks-per-node`` and for block and cyclic distributions. submitit local:
    ``SUBMITIT_LOCAL_GLOBALID/NTASKS/LOCALID``.

    Args:
        env: the environment variables; None: ``os.environ``.

    Returns:
        The process's `RankInfo`; None when no such launcher started the process (or it started a single
        task, which then spawns as usual).

    Raises:
        ValueError: SLURM variables that contradict each other or cannot be read.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        return _get_torchrun_rank_info(env)
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return _get_slurm_rank_info(env)
    if int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1 and "SUBMITIT_LOCAL_GLOBALID" in env:
        return _get_submitit_local_rank_info(env)
    return None


def get_slurm_cpus_per_task(env: Mapping[str, str] | None = None) -> int | None:
    """A SLURM task's CPUs (``--cpus-per-task``, ``SLURM_CPUS_PER_TASK``); None outside a SLURM task or when
    unset.

    Args:
        env: the environment variables; None: ``os.environ``.
    """
    env = os.environ if env is None else env
    cpus = env.get("SLURM_CPUS_PER_TASK", "") if "SLURM_PROCID" in env else ""
    return int(cpus) if cpus.isdigit() else None


def _get_torchrun_rank_info(env: Mapping[str, str]) -> RankInfo:
    world_size = int(env["WORLD_SIZE"])
    local_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
    rank = int(env["RANK"])
    return RankInfo(
        launcher="torchrun",
        rank=rank,
        world_size=world_size,
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_size=local_size,
        node_rank=int(env.get("GROUP_RANK", rank // max(local_size, 1))),
        num_nodes=int(env.get("GROUP_WORLD_SIZE", max(world_size // max(local_size, 1), 1))),
        master_addr=env["MASTER_ADDR"],
        master_port=env.get("MASTER_PORT", ""),
    )


def _get_slurm_rank_info(env: Mapping[str, str]) -> RankInfo:
    world_size = int(env["SLURM_NTASKS"])
    node_rank = int(env.get("SLURM_NODEID", 0))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node:
        tasks_per_node = expand_slurm_counts(per_node)
    elif env.get("SLURM_NTASKS_PER_NODE"):
        tasks_per_node = [int(env["SLURM_NTASKS_PER_NODE"].split("(")[0])] * (node_rank + 1)
    else:
        tasks_per_node = [world_size]
    if node_rank >= len(tasks_per_node):
        raise ValueError(
            f"launch: SLURM_NODEID={node_rank} but the tasks per node {per_node!r} list {len(tasks_per_node)} "
            "node(s); start the job with srun (which sets both consistently)."
        )
    # The node list is read only when MASTER_ADDR is unset: setting it is the way around an unreadable list.
    if "MASTER_ADDR" in env:
        master_addr = env["MASTER_ADDR"]
    else:
        master_addr = first_slurm_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1"))
    return RankInfo(
        launcher="slurm",
        rank=int(env["SLURM_PROCID"]),
        world_size=world_size,
        local_rank=int(env.get("SLURM_LOCALID", 0)),
        local_size=tasks_per_node[node_rank],
        node_rank=node_rank,
        num_nodes=int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or len(tasks_per_node)),
        master_addr=master_addr,
        master_port=env.get("MASTER_PORT", _port_from_job_id(env.get("SLURM_JOB_ID", "0"))),
    )


def _get_submitit_local_rank_info(env: Mapping[str, str]) -> RankInfo:
    tasks = int(env["SUBMITIT_LOCAL_NTASKS"])
    return RankInfo(
        launcher="submitit-local",
        rank=int(env["SUBMITIT_LOCAL_GLOBALID"]),
        world_size=tasks,
        local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", 0)),
        local_size=tasks,
        node_rank=0,
        num_nodes=1,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=env.get("MASTER_PORT", _port_from_job_id(env.get("SUBMITIT_LOCAL_JOB_ID", "0"))),
    )


def _port_from_job_id(job_id: str) -> str:
    # Every task derives the same port from the job id; jobs running side by side get different ones.
    digits = "".join(c for c in job_id if c.isdigit()) or "0"
    return str(20000 + int(digits) % 20000)


def expand_slurm_counts(text: str) -> list[int]:
    """SLURM's compressed per-node counts: ``"4(x2),3"`` -> ``[4, 4, 3]``.

    Args:
        text: a value such as ``SLURM_TASKS_PER_NODE``'s.

    Raises:
        ValueError: `text` is not in that form.
    """
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(
                f"launch: cannot read the SLURM per-node counts {text!r} (expected e.g. '4(x2),3')"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``"gpu-node[03-05,9],other"`` -> ``"gpu-node03"``.

    Args:
        nodelist: a value such as ``SLURM_JOB_NODELIST``'s.

    Raises:
        ValueError: `nodelist` cannot be read (then set MASTER_ADDR).
    """
    match = re.match(r"([^,\[]+)(?:\[([^\],\-]+))?", nodelist.strip())
    if match is None:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}; set MASTER_ADDR")
    return match.group(1) + (match.group(2) or "")


def get_attempt_prefix(env: Mapping[str, str] | None = None) -> str:
    """Under torchrun, a store-key prefix naming this attempt of the worker group (``""`` elsewhere).

    torchrun's agent serves one TCP store for the whole job (``TORCHELASTIC_USE_AGENT_STORE=True``) and keeps
    it when it restarts a failed worker group, so a restarted group would read the failed one's keys (its
    ranks' addresses, a recorded failure). Keys under a prefix of their own start each attempt afresh.
    """
    env = os.environ if env is None else env
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "")
    if attempt and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return f"lazytrain/attempt_{attempt}/"
    return ""


# The variables a launcher sets when it runs the same command again after a failure or a requeue.
RESTART_COUNT_VARIABLES = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


def get_restart_count(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(variable, count)`` when this process belongs to a job its launcher started again (a requeued SLURM
    job, a worker group restarted by ``torchrun --max-restarts=N``), else None.

    Args:
        env: the environment to read (default ``os.environ``).
    """
    env = os.environ if env is None else env
    for variable in RESTART_COUNT_VARIABLES:
        count = env.get(variable, "")
        if count not in ("", "0"):
            return variable, count
    return None
