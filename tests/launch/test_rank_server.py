"""Ranks forked from the rank server behave as spawned ones: their own job's environment, stop signals that act
on them, a server that survives the signals sent to a whole job, and a server that never touched CUDA."""

import json
import os
import signal
import subprocess
import sys

from lazytrain.utils import comm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_JOB_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}


def _run_script(script: str, **env: str) -> subprocess.CompletedProcess:
    """``python -c script`` in a new interpreter that imports this repository."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def rank_facts() -> list[dict]:
    """Every rank's process, parent, job mark and blocked signals, gathered."""
    facts = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "mark": os.environ.get("LAZYTRAIN_TEST_JOB"),
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    }
    return comm.all_gather(facts)


# Two jobs launched one after another by one process, as a sweep's jobs under Hydra's basic launcher, with
# the signals a scheduler sends to every process of a job sent to the server in between.
TWO_JOBS = """
import json, os, signal, sys, time
from multiprocessing import forkserver
from lazytrain.launch.launch import launch
from tests.launch.test_rank_server import rank_facts

os.environ["LAZYTRAIN_TEST_JOB"] = "first"
first = launch(rank_facts, 2, use_gpu=False)
server = forkserver._forkserver._forkserver_pid
for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGUSR1):
    os.kill(server, signum)
time.sleep(0.2)
os.environ["LAZYTRAIN_TEST_JOB"] = "second"
second = launch(rank_facts, 2, use_gpu=False)
with open(f"/proc/{server}/stat") as f:
    server_parent = int(f.read().rsplit(")", 1)[1].split()[1])
blocked_here = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
print(json.dumps({"first": first, "second": second, "server": server, "server_parent": server_parent,
                  "launcher": os.getpid(), "blocked_here": blocked_here}))
"""


def test_ranks_are_forked_from_one_server_with_their_own_jobs_environment_and_signals():
    result = _run_script(TWO_JOBS, OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    first, second = facts["first"], facts["second"]
    # One server, started by the launching process, forked the ranks of both jobs, and survived the signals.
    assert facts["server_parent"] == facts["launcher"]
    assert {rank["parent"] for rank in first + second} == {facts["server"]}
    assert len({rank["pid"] for rank in first + second}) == 4
    # Each job's ranks see the environment the launcher had for that job, not the server's.
    assert [rank["mark"] for rank in first] == ["first", "first"]
    assert [rank["mark"] for rank in second] == ["second", "second"]
    # Stop signals are not blocked in the ranks (they act there) nor, after the start, in the launcher.
    assert all(not _JOB_SIGNALS & set(rank["blocked"]) for rank in first + second)
    assert not _JOB_SIGNALS & set(facts["blocked_here"])


# Importing what the server preloads must not query CUDA: the CUDA driver does not survive a fork, so a
# server that initialized it would hand every GPU rank a broken CUDA.
NO_CUDA_AT_IMPORT = """
import torch, torch.cuda

def refuse(*args, **kwargs):
    raise AssertionError("CUDA queried while importing")

for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties"):
    setattr(torch.cuda, name, refuse)
torch._C._cuda_getDeviceCount = refuse
import lazytrain.program.job, lazytrain.program.default  # the rank function's module and the default program
print("ok")
"""


def test_what_the_server_imports_does_not_touch_cuda():
    result = _run_script(NO_CUDA_AT_IMPORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
