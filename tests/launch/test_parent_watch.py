"""A sweep job in a launcher's worker process stops cleanly when the sweep's main process is killed."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.engine.conftest import TOY_CONFIG
from tests.engine.test_preemption import REPO, callback_hook

WATCHED_JOB = """
import os, signal, sys, time
from lazytrain.launch.parent_watch import ParentWatch

def on_term(signum, frame):
    print("got SIGTERM", flush=True)
    raise SystemExit(143)

signal.signal(signal.SIGTERM, on_term)
with ParentWatch(parent_pid=int(sys.argv[1]), poll_seconds=0.05) as watch:
    time.sleep(30)
print("not reached", flush=True)
"""


def run_watched_job(parent_pid):
    return subprocess.run(
        [sys.executable, "-c", WATCHED_JOB, str(parent_pid)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": REPO},
    )


def test_a_job_whose_parent_changed_gets_sigterm_and_exits_with_its_status():
    result = run_watched_job(parent_pid=os.getpid() + 10**6)  # never this process's parent
    assert result.returncode == 143, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["got SIGTERM"]
    assert "The sweep's main process (pid" in result.stderr


def test_a_job_whose_parent_is_alive_is_left_alone():
    code = (
        "import os, time\n"
        "from lazytrain.launch.parent_watch import ParentWatch\n"
        "with ParentWatch(parent_pid=os.getppid(), poll_seconds=0.05) as watch:\n"
        "    time.sleep(0.5)\n"
        "print('orphaned' if watch.orphaned else 'finished', flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "finished"


def _children(pid):
    """(pid, command line) of the processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if parent == pid:
            found.append((int(entry), command))
    return found


def _running(pid):
    """Alive and not a zombie (an orphan's new parent may be slow to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the worker processes through /proc")
def test_killing_a_joblib_sweeps_main_process_stops_each_job_with_a_checkpoint(tmp_path):
    sweep = tmp_path / "sweep"
    command = [
        *(sys.executable, "-m", "lazytrain", TOY_CONFIG, "-m", "hydra/launcher=joblib"),
        *("optimizer.lr=0.01,0.02", "train.max_iter=100000", f"hydra.sweep.dir={sweep}"),
        callback_hook("slow", "sleep_each_step", seconds=0.02),
    ]
    environment = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "stderr.txt", "w") as stderr:
        main = subprocess.Popen(
            command, cwd=tmp_path, env=environment, stdout=subprocess.DEVNULL, stderr=stderr
        )
    logs = [sweep / str(job) / "log.txt" for job in (0, 1)]
    workers = []
    try:
        started = lambda: all(log.exists() and "Starting training" in log.read_text() for log in logs)  # noqa: E731
        _wait_for(started, 120, "both jobs to train")
        workers = [pid for pid, command in _children(main.pid) if "LokyProcess" in command]
        assert len(workers) == 2, _children(main.pid)
        main.send_signal(signal.SIGTERM)  # the main process alone, as `kill PID` does
        assert main.wait(timeout=30) == -signal.SIGTERM
        _wait_for(lambda: not any(_running(pid) for pid in workers), 60, "the orphaned jobs to exit")
    finally:  # leave nothing training if the test fails
        for pid in [main.pid, *workers]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        main.wait()
    stopped_after = []
    for log in logs:
        text = log.read_text()
        assert f"The sweep's main process (pid {main.pid}) is gone" in text, text[-2000:]
        stopped_after.append(int(text.split("stopping after iteration ")[1].split(";")[0]))
        checkpoint = f"model_{stopped_after[-1]:07d}.pth"
        assert (log.parent / "last_checkpoint").read_text() == checkpoint
        assert (log.parent / checkpoint).stat().st_size > 0
    assert min(stopped_after) > 0 and max(stopped_after) < 100000

    # The same sweep again with train.resume=true continues each job from its own checkpoint.
    command[command.index("train.max_iter=100000")] = f"train.max_iter={max(stopped_after) + 10}"
    resumed = subprocess.run(
        [*command[:-1], "train.resume=true"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for log, iteration in zip(logs, stopped_after):
        assert f"Starting training from iteration {iteration + 1}" in log.read_text()
        assert (log.parent / "last_checkpoint").read_text() == "model_final.pth"
