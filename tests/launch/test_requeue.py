"""SLURM requeue, as far as it can run here: submitit's local executor (the same signal handler and requeue
protocol as on SLURM, with a local restart instead of ``scontrol requeue``) and a faked requeued SLURM job; and
torchrun's own restart of a failed rank group (``--max-restarts``)."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.engine.test_preemption import callback_hook
from tests.launch.test_entrypoint import ENGINE_TOY, REPO, lazytrain


def final_weights(run_dir):
    return torch.load(run_dir / "model_final.pth", weights_only=True)["model"]


def assert_same_weights(expected, got):
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[key], got[key]) for key in expected)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = lazytrain(ENGINE_TOY, f"hydra.run.dir={run_dir}", cwd=run_dir.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return final_weights(run_dir)


@pytest.mark.slow
def test_submitit_timeout_signal_checkpoints_requeues_and_the_job_resumes_exactly(tmp_path, reference):
    # SIGUSR2 is what SLURM sends (--signal=USR2@signal_delay_s) before a submitit job's time runs out.
    usr2 = callback_hook("stop", "send_signal_at", iteration=12, signum=int(signal.SIGUSR2))
    result = lazytrain(
        ENGINE_TOY,
        "-m",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={tmp_path}/sweep",
        "train.resume=true",  # the documented way: the same command starts and resumes the job
        usr2,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "sweep" / "0"
    log = (run_dir / "log.txt").read_text()
    # The step in progress finished, its checkpoint was written, submitit requeued the job, which resumed.
    assert "Received SIGUSR2: stopping after iteration 13; saving a checkpoint" in log
    assert "Resuming from iteration 14" in log
    submitit_logs = "".join(path.read_text() for path in (tmp_path / "sweep" / ".submitit").rglob("*_log.*"))
    assert "Requeued job" in submitit_logs
    assert_same_weights(reference, final_weights(run_dir))


def test_a_requeued_slurm_job_resumes_without_being_told(tmp_path, reference):
    run_dir = tmp_path / "run"
    stop = callback_hook("stop", "send_signal_at", iteration=12, signum=int(signal.SIGTERM))
    stopped = lazytrain(ENGINE_TOY, f"hydra.run.dir={run_dir}", stop, cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]

    # SLURM runs the same command again and sets SLURM_RESTART_COUNT; train.resume is not given.
    requeued = lazytrain(
        ENGINE_TOY, f"hydra.run.dir={run_dir}", cwd=tmp_path, env={"SLURM_RESTART_COUNT": "1"}
    )
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    log = (run_dir / "log.txt").read_text()
    assert (
        "Requeued SLURM job (SLURM_RESTART_COUNT=1): resuming from the last checkpoint"
        in requeued.stdout + requeued.stderr + log
    )
    assert "Resuming from iteration 14" in log
    assert_same_weights(reference, final_weights(run_dir))
    assert os.path.exists(run_dir / "model_0000013.pth")


def torchrun(*args, cwd):
    """``torchrun --standalone --nproc-per-node=2 --max-restarts=1 -m lazytrain ARGS`` on CPU."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    environment = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [*command, "--max-restarts=1", "-m", "lazytrain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )


@pytest.mark.slow
def test_a_rank_group_restarted_by_torchrun_resumes_from_the_last_checkpoint(tmp_path):
    uninterrupted = torchrun(ENGINE_TOY, f"hydra.run.dir={tmp_path}/reference", cwd=tmp_path)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]

    # Rank 1 dies after step 12 (the last checkpoint is step 9's); torchrun restarts both ranks, once.
    run_dir = tmp_path / "run"
    kill = callback_hook("kill", "kill_rank_before_any_restart", iteration=12, rank=1)
    restarted = torchrun(ENGINE_TOY, f"hydra.run.dir={run_dir}", kill, cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    log = (run_dir / "log.txt").read_text()
    assert "rank 1 died" in log
    assert (
        "Restarted torchrun workers (TORCHELASTIC_RESTART_COUNT=1): resuming from the last checkpoint"
        in restarted.stdout + restarted.stderr + log
    )
    assert "Resuming from iteration 10" in log
    assert_same_weights(final_weights(tmp_path / "reference"), final_weights(run_dir))
