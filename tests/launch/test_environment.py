"""`lazytrain.launch.environment`: a launched process's place in its job, read from simulated environments
(plain dicts); nothing is written to the environment."""

import os

import pytest
from pytest import param

from lazytrain.launch.environment import (
    expand_slurm_counts,
    first_slurm_host,
    get_attempt_prefix,
    get_env_rank_info,
    get_restart_count,
    get_slurm_cpus_per_task,
)

SLURM_TWO_NODES = dict(
    SLURM_PROCID="9",
    SLURM_NTASKS="16",
    SLURM_LOCALID="1",
    SLURM_NODEID="1",
    SLURM_TASKS_PER_NODE="8(x2)",
    SLURM_JOB_NODELIST="gpu-node[07-08]",
    SLURM_JOB_ID="123456",
    SLURM_NNODES="2",
)


@pytest.mark.parametrize(
    "env",
    [
        param({}, id="nothing"),
        param(dict(SLURM_NTASKS="1", SLURM_PROCID="0"), id="one SLURM task per node spawns its ranks itself"),
        param(dict(SUBMITIT_LOCAL_NTASKS="1", SUBMITIT_LOCAL_GLOBALID="0"), id="one submitit local task"),
        param(dict(RANK="0", WORLD_SIZE="2"), id="torchrun variables without MASTER_ADDR"),
    ],
)
def test_no_launcher_means_none(env):
    assert get_env_rank_info(env) is None


def test_torchrun():
    env = dict(
        RANK="11",
        WORLD_SIZE="16",
        LOCAL_RANK="3",
        LOCAL_WORLD_SIZE="8",
        GROUP_RANK="1",
        MASTER_ADDR="h",
        MASTER_PORT="29500",
    )
    assert get_env_rank_info(env) == dict(
        launcher="torchrun",
        rank=11,
        world_size=16,
        local_rank=3,
        local_size=8,
        node_rank=1,
        num_nodes=2,
        master_addr="h",
        master_port="29500",
    )


def test_slurm_meets_at_the_first_node_on_a_port_from_the_job_id():
    info = get_env_rank_info(SLURM_TWO_NODES)
    assert info == dict(
        launcher="slurm",
        rank=9,
        world_size=16,
        local_rank=1,
        local_size=8,
        node_rank=1,
        num_nodes=2,
        master_addr="gpu-node07",
        master_port=str(20000 + 123456 % 20000),
    )


def test_slurm_keeps_a_given_address_and_port_and_then_needs_no_node_list():
    env = {
        **SLURM_TWO_NODES,
        "SLURM_JOB_NODELIST": "[unreadable",
        "MASTER_ADDR": "head",
        "MASTER_PORT": "1234",
    }
    info = get_env_rank_info(env)
    assert (info["master_addr"], info["master_port"]) == ("head", "1234")


@pytest.mark.parametrize(
    "tasks, local_size",
    [
        param(
            dict(SLURM_STEP_TASKS_PER_NODE="7,5", SLURM_TASKS_PER_NODE="8(x2)"),
            5,
            id="the step's counts first",
        ),
        param(dict(SLURM_NTASKS_PER_NODE="8"), 8, id="--ntasks-per-node only"),
        param({}, 16, id="no counts: one node"),
    ],
)
def test_slurm_tasks_on_this_node(tasks, local_size):
    env = {key: value for key, value in SLURM_TWO_NODES.items() if key != "SLURM_TASKS_PER_NODE"}
    env = {**env, **tasks}
    if not tasks:
        env["SLURM_NODEID"] = "0"
    assert get_env_rank_info(env)["local_size"] == local_size


def test_slurm_node_beyond_the_counts_says_how_to_start():
    env = {**SLURM_TWO_NODES, "SLURM_NODEID": "2"}
    with pytest.raises(ValueError, match=r"SLURM_NODEID=2 but the tasks per node '8\(x2\)' list 2.*srun"):
        get_env_rank_info(env)


def test_submitit_local_meets_on_localhost():
    env = dict(
        SUBMITIT_LOCAL_NTASKS="2",
        SUBMITIT_LOCAL_GLOBALID="1",
        SUBMITIT_LOCAL_LOCALID="1",
        SUBMITIT_LOCAL_JOB_ID="4242",
    )
    assert get_env_rank_info(env) == dict(
        launcher="submitit-local",
        rank=1,
        world_size=2,
        local_rank=1,
        local_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port="24242",
    )


def test_reads_os_environ_by_default_and_writes_nothing(monkeypatch):
    for name in list(os.environ):
        if name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") or name.startswith(
            ("SLURM_", "SUBMITIT_")
        ):
            monkeypatch.delenv(name)
    for name, value in SLURM_TWO_NODES.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    assert get_env_rank_info()["master_addr"] == "gpu-node07"
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    "env, cpus",
    [
        param(dict(SLURM_PROCID="0", SLURM_CPUS_PER_TASK="6"), 6, id="a SLURM task"),
        param(dict(SLURM_PROCID="0"), None, id="unset"),
        param(dict(SLURM_CPUS_PER_TASK="6"), None, id="not a SLURM task"),
    ],
)
def test_slurm_cpus_per_task(env, cpus):
    assert get_slurm_cpus_per_task(env) == cpus


@pytest.mark.parametrize(
    "text, counts",
    [("8", [8]), ("4(x2),3", [4, 4, 3]), ("2,1(x3)", [2, 1, 1, 1])],
)
def test_expand_slurm_counts(text, counts):
    assert expand_slurm_counts(text) == counts


def test_unreadable_slurm_counts_are_refused():
    with pytest.raises(ValueError, match=r"cannot read the SLURM per-node counts '4x2' \(expected e.g."):
        expand_slurm_counts("4x2")


@pytest.mark.parametrize(
    "nodelist, host",
    [
        param("node7", "node7", id="single"),
        param("a1,b2", "a1", id="list"),
        param("gpu-node[03-05,9],cpu[1]", "gpu-node03", id="ranges"),
    ],
)
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


def test_attempt_prefix_names_the_torchrun_attempt_only_on_the_agents_store():
    agent = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert get_attempt_prefix({**agent, "TORCHELASTIC_RESTART_COUNT": "0"}) == "lazytrain/attempt_0/"
    assert get_attempt_prefix({**agent, "TORCHELASTIC_RESTART_COUNT": "2"}) == "lazytrain/attempt_2/"
    assert get_attempt_prefix({"TORCHELASTIC_RESTART_COUNT": "1"}) == ""  # a store of its own per attempt
    assert get_attempt_prefix({"SLURM_RESTART_COUNT": "1"}) == ""


def test_restart_count_names_the_launchers_variable():
    assert get_restart_count({}) is None
    assert get_restart_count({"SLURM_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": ""}) is None
    assert get_restart_count({"SLURM_RESTART_COUNT": "2"}) == ("SLURM_RESTART_COUNT", "2")
    assert get_restart_count({"TORCHELASTIC_RESTART_COUNT": "1"}) == ("TORCHELASTIC_RESTART_COUNT", "1")
