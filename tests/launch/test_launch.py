"""`launch` pieces that need no spawn: ranks from the environment, their GPU and threads, port checks."""

import socket

import pytest
from pytest import param

from lazytrain.launch import launch as launch_module
from lazytrain.launch import process_group
from lazytrain.launch.environment import get_env_rank_info
from lazytrain.launch.launch import launch
from lazytrain.launch.process_group import get_gpu_index
from tests.warm_command import start_warm

_LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
)


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name in _LAUNCHER_VARIABLES or name.startswith(("SLURM_", "SUBMITIT_")):
            monkeypatch.delenv(name)
    return monkeypatch


# Each documented way to start a job, as the environment its processes see (one representative rank each):
# (id, environment, GPUs that process sees, processes asked per machine (launch.num_gpus resolved),
#  expected: whether the process is a rank itself, rank, world size, local rank, processes on its node, node,
#  its GPU).
_TWO_NODES = dict(SLURM_JOB_NODELIST="gpu[07-08]", SLURM_JOB_ID="4242", SLURM_NNODES="2")
ENVIRONMENTS = [
    ("spawn, no launcher", {}, 8, 8, (False, None, None, 3, 8, 0, 3)),
    (
        "torchrun --nnodes=2 --nproc-per-node=8",
        dict(
            RANK="11", WORLD_SIZE="16", LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", GROUP_RANK="1", MASTER_ADDR="h"
        ),
        8,
        8,
        (True, 11, 16, 3, 8, 1, 3),
    ),
    (
        "torchrun without GROUP_RANK (older torch)",
        dict(RANK="11", WORLD_SIZE="16", LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", MASTER_ADDR="h"),
        8,
        8,
        (True, 11, 16, 3, 8, 1, 3),
    ),
    (
        "srun -N2 --ntasks-per-node=8",
        dict(
            SLURM_PROCID="9",
            SLURM_NTASKS="16",
            SLURM_LOCALID="1",
            SLURM_NODEID="1",
            SLURM_NTASKS_PER_NODE="8",
            SLURM_TASKS_PER_NODE="8(x2)",
            **_TWO_NODES,
        ),
        8,
        8,
        (True, 9, 16, 1, 8, 1, 1),
    ),
    (
        "srun -N2 -n16 (no --ntasks-per-node)",
        dict(
            SLURM_PROCID="9",
            SLURM_NTASKS="16",
            SLURM_LOCALID="1",
            SLURM_NODEID="1",
            SLURM_TASKS_PER_NODE="8(x2)",
            **_TWO_NODES,
        ),
        8,
        8,
        (True, 9, 16, 1, 8, 1, 1),
    ),
    (
        "srun -N2 -n12, uneven (7 + 5)",
        dict(
            SLURM_PROCID="10",
            SLURM_NTASKS="12",
            SLURM_LOCALID="3",
            SLURM_NODEID="1",
            SLURM_STEP_TASKS_PER_NODE="7,5",
            SLURM_TASKS_PER_NODE="8(x2)",
            **_TWO_NODES,
        ),
        8,
        8,
        (True, 10, 12, 3, 5, 1, 3),
    ),
    (
        "srun --gpus-per-task=1 (each task sees one GPU)",
        dict(
            SLURM_PROCID="13",
            SLURM_NTASKS="16",
            SLURM_LOCALID="5",
            SLURM_NODEID="1",
            SLURM_TASKS_PER_NODE="8(x2)",
            CUDA_VISIBLE_DEVICES="5",
            **_TWO_NODES,
        ),
        1,
        1,
        (True, 13, 16, 5, 8, 1, 0),
    ),
    (
        "srun -N2 -n4 --distribution=cyclic",
        dict(
            SLURM_PROCID="3",
            SLURM_NTASKS="4",
            SLURM_LOCALID="1",
            SLURM_NODEID="1",
            SLURM_TASKS_PER_NODE="2(x2)",
            SLURM_DISTRIBUTION="cyclic",
            **_TWO_NODES,
        ),
        2,
        2,
        (True, 3, 4, 1, 2, 1, 1),
    ),
    (
        "srun -N2 --ntasks-per-node=1: each task spawns 8",
        dict(
            SLURM_PROCID="1",
            SLURM_NTASKS="2",
            SLURM_LOCALID="0",
            SLURM_NODEID="1",
            SLURM_TASKS_PER_NODE="1(x2)",
            **_TWO_NODES,
        ),
        8,
        8,
        (False, None, 16, 3, 8, 1, 3),
    ),
    (
        "submitit (SLURM) tasks_per_node=8",
        dict(
            SLURM_PROCID="6",
            SLURM_NTASKS="8",
            SLURM_LOCALID="6",
            SLURM_NODEID="0",
            SLURM_TASKS_PER_NODE="8",
            SLURM_JOB_NODELIST="gpu07",
            SLURM_JOB_ID="7",
        ),
        8,
        8,
        (True, 6, 8, 6, 8, 0, 6),
    ),
    (
        "submitit (SLURM) tasks_per_node=1, gpus_per_node=8, one node",
        dict(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_ID="7"),
        8,
        8,
        (False, None, 8, 3, 8, 0, 3),
    ),
    (
        "submitit local, tasks_per_node=2",
        dict(SUBMITIT_LOCAL_NTASKS="2", SUBMITIT_LOCAL_GLOBALID="1", SUBMITIT_LOCAL_LOCALID="1"),
        2,
        2,
        (True, 1, 2, 1, 2, 0, 1),
    ),
]


@pytest.mark.parametrize(
    "environment, visible, per_machine, expected",
    [pytest.param(*case[1:], id=case[0]) for case in ENVIRONMENTS],
)
def test_every_start_up_way_picks_the_right_gpu(clean_env, environment, visible, per_machine, expected):
    is_rank, rank, world_size, local_rank, local_size, node, gpu = expected
    for name, value in environment.items():
        clean_env.setenv(name, value)
    info = get_env_rank_info()
    assert launch_module.is_rank_from_environment(info, per_machine) == is_rank
    if is_rank:
        assert (info["rank"], info["world_size"], info["local_rank"]) == (rank, world_size, local_rank)
        assert (info["local_size"], info["node_rank"]) == (local_size, node)
    elif info is not None:  # one task per node: it spawns `per_machine` ranks, node by node
        assert info["num_nodes"] * per_machine == world_size and info["node_rank"] == node
    # The GPU of (spawned or started) local rank `local_rank`: process_group.get_gpu_index under the mocked count.
    assert get_gpu_index(local_rank, local_size, visible) == gpu


@pytest.mark.parametrize(
    "environment, init_method, store",
    [
        param(
            dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="Head", MASTER_PORT="9"), "env://", None, id="torchrun"
        ),
        param(
            dict(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_NODELIST="gpu[07-08]", SLURM_JOB_ID="4242"),
            "tcp://gpu07:24242",
            ("gpu07", 24242),
            id="SLURM",
        ),
        param(
            dict(SUBMITIT_LOCAL_NTASKS="2", SUBMITIT_LOCAL_GLOBALID="1", MASTER_ADDR="::1", MASTER_PORT="7"),
            "tcp://[::1]:7",
            ("::1", 7),
            id="submitit local, IPv6",
        ),
    ],
)
def test_launched_ranks_meet_where_the_environment_says(environment, init_method, store):
    # torchrun's agent serves the store at its MASTER_ADDR:MASTER_PORT, which env:// reads as they are.
    assert process_group.get_rendezvous_url(get_env_rank_info(environment)) == init_method
    if store is not None:
        assert process_group._store_address(init_method) == store


@pytest.mark.parametrize(
    "local_rank, local_size, visible",
    [
        pytest.param(5, 8, 4, id="8 tasks, 4 GPUs each"),
        pytest.param(0, 2, 0, id="no GPU"),
    ],
)
def test_gpu_choice_that_cannot_work_says_why(local_rank, local_size, visible):
    with pytest.raises(ValueError, match=r"one GPU per process is needed.*--gpus-per-task=1"):
        get_gpu_index(local_rank, local_size, visible)


def test_two_ranks_on_one_gpu_are_named():
    identities = [("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a"), ("n1", "GPU-a")]
    assert "ranks 0, 3 all use GPU GPU-a on n1" in process_group.find_shared_gpus(identities)
    assert process_group.find_shared_gpus(identities[:3]) is None


def test_cpu_threads_follow_the_affinity_mask_not_the_core_count(clean_env, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert launch_module.get_cpu_threads(8) == 2
    assert launch_module.get_cpu_threads(1, cpus_per_process=6) == 6  # SLURM --cpus-per-task=6
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launch_module.get_cpu_threads(8) == 3


@pytest.mark.parametrize(
    "value, seconds",
    [(30, 1800), ("90s", 90), ("30m", 1800), ("4h", 14400), ("1.5h", 5400)],
)
def test_parse_timeout(value, seconds):
    assert launch_module.parse_timeout(value).total_seconds() == seconds


@pytest.mark.parametrize("value", ["soon", "-5m", 0, True])
def test_bad_timeout_is_refused(value):
    with pytest.raises(ValueError, match=r"launch.timeout=.*'90s', '30m', '4h'"):
        launch_module.parse_timeout(value)


def test_port_in_use_fails_before_spawning(clean_env, monkeypatch):
    def no_spawn(*args, **kwargs):
        raise AssertionError("spawned although the port is taken")

    monkeypatch.setattr("torch.multiprocessing.start_processes", no_spawn)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} is already in use.*launch.dist_url=auto"):
            launch(print, 2, dist_url=f"tcp://127.0.0.1:{port}", use_gpu=False)


def test_backend_choice():
    assert launch_module._choose_backend("auto", use_gpu=True) == "nccl"
    assert launch_module._choose_backend("auto", use_gpu=False) == "gloo"
    assert launch_module._choose_backend("gloo", use_gpu=True) == "gloo"


_SLURM_TASK_PROGRAM = """
import os
from lazytrain.launch.launch import launch
from lazytrain.utils import comm

ranks = launch(lambda: comm.all_gather(comm.get_rank()), 2, use_gpu=False)
print(ranks, [name for name in ("MASTER_ADDR", "MASTER_PORT") if name in os.environ])
"""


def test_slurm_tasks_meet_at_the_first_node_without_writing_it_into_the_environment(tmp_path):
    # Two SLURM tasks on one node (srun -n2), each a rank: they meet at the node list's first host.
    import os

    port = launch_module.find_free_port()
    base = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCHER_VARIABLES and not name.startswith(("SLURM_", "SUBMITIT_"))
    }
    slurm = dict(SLURM_NTASKS="2", SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2", SLURM_JOB_NODELIST="127.0.0.1")
    environments = [
        {**base, **slurm, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "MASTER_PORT": str(port)}
        for rank in range(2)
    ]
    with (
        start_warm(["-c", _SLURM_TASK_PROGRAM], tmp_path, environments[0]) as first,
        start_warm(["-c", _SLURM_TASK_PROGRAM], tmp_path, environments[1]) as second,
    ):
        codes = [first.wait(timeout=120), second.wait(timeout=120)]
        outputs = ["".join(task.read_output()) for task in (first, second)]
    assert codes == [0, 0], outputs
    assert [output.strip().splitlines()[-1] for output in outputs] == ["[0, 1] ['MASTER_PORT']"] * 2
