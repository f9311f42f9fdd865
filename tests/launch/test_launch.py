"""`launch` pieces that need no spawn: environment detection, port checks, SLURM node lists."""

import socket

import pytest

from lazytrain.launch import launch as launch_module
from lazytrain.launch.launch import first_slurm_host, get_env_rank_info, launch

_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name in _LAUNCHER_VARIABLES or name.startswith(("SLURM_", "SUBMITIT_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_no_launcher_means_spawn(clean_env):
    assert get_env_rank_info() is None
    clean_env.setenv("SLURM_NTASKS", "1")  # one SLURM task per node spawns its ranks itself
    clean_env.setenv("SLURM_PROCID", "0")
    assert get_env_rank_info() is None


def test_torchrun_environment(clean_env):
    for name, value in dict(
        RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h"
    ).items():
        clean_env.setenv(name, value)
    assert get_env_rank_info() == {"rank": 3, "world_size": 4, "local_rank": 1, "local_size": 2}


def test_slurm_environment(clean_env):
    import os

    env = dict(
        SLURM_PROCID="5",
        SLURM_NTASKS="8",
        SLURM_LOCALID="1",
        SLURM_NTASKS_PER_NODE="4(x2)",
        SLURM_JOB_NODELIST="gpu-node[07-08]",
        SLURM_JOB_ID="123456",
    )
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert get_env_rank_info() == {"rank": 5, "world_size": 8, "local_rank": 1, "local_size": 4}
    assert os.environ["MASTER_ADDR"] == "gpu-node07" and os.environ["MASTER_PORT"] == str(
        20000 + 123456 % 20000
    )


def test_submitit_local_environment(clean_env):
    import os

    env = dict(SUBMITIT_LOCAL_NTASKS="2", SUBMITIT_LOCAL_GLOBALID="1", SUBMITIT_LOCAL_LOCALID="1")
    for name, value in {**env, "SUBMITIT_LOCAL_JOB_ID": "4242"}.items():
        clean_env.setenv(name, value)
    assert get_env_rank_info() == {"rank": 1, "world_size": 2, "local_rank": 1, "local_size": 2}
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] == "24242"


@pytest.mark.parametrize(
    "nodelist, host",
    [
        pytest.param("node7", "node7", id="single"),
        pytest.param("a1,b2", "a1", id="list"),
        pytest.param("gpu-node[03-05,9],cpu[1]", "gpu-node03", id="ranges"),
    ],
)
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


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
