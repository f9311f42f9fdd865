"""Ranks started by a launcher (torchrun-style environment: RANK, WORLD_SIZE, MASTER_ADDR, ...) agree: on a
non-finite loss, on one rank's exception or death, on the checkpoint to resume from, and they wait out a long
evaluation when launch.timeout allows it. Two gloo processes on localhost, forked warm
(tests/warm_command.py), stand for two GPUs."""

import os
import signal
import subprocess
import time

import pytest

from lazytrain.launch.launch import find_free_port
from tests.engine.conftest import TOY_CONFIG
from tests.engine.test_preemption import callback_hook
from tests.warm_command import WarmProcess, start_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANK_PROGRAM = f"""
import sys
from datetime import timedelta
from omegaconf import OmegaConf
from lazytrain.config import LazyConfig
from lazytrain.launch.launch import launch
from tests.engine import toy

main, processes, output_dir, *overrides = sys.argv[1:]
cfg = LazyConfig.load({TOY_CONFIG!r})
cfg.train.output_dir = output_dir
LazyConfig.apply_overrides(cfg, overrides)
OmegaConf.resolve(cfg)
launch(getattr(toy, main), int(processes), args=(OmegaConf.to_container(cfg),), use_gpu=False,
       timeout=timedelta(seconds=60))
"""


def _start_ranks(output_dir, overrides_of_rank, main="ddp_main", world_size=2):
    """Start `world_size` processes as torchrun would (one rank each); returns them with their start time."""
    port = find_free_port()
    processes = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        command = ["-c", RANK_PROGRAM, main, "1", str(output_dir), *overrides_of_rank(rank)]
        processes.append(start_warm(command, REPO, env))
    return processes


def _finish(processes, timeout=120):
    """(exit code, seconds from the first exit to this one's, output: stdout and stderr) of each process."""
    deadline = time.monotonic() + timeout
    ended = {}
    while len(ended) < len(processes) and time.monotonic() < deadline:
        for index, process in enumerate(processes):
            if index not in ended and process.poll() is not None:
                ended[index] = time.monotonic()
        time.sleep(0.1)
    for process in processes:
        if process.poll() is None:
            process.kill()
    first = min(ended.values(), default=time.monotonic())
    results = []
    for index, process in enumerate(processes):
        with process:
            code = process.wait()
            results.append((code, ended.get(index, float("inf")) - first, "".join(process.read_output())))
    return results


def _steps(n=40):
    return [f"train.max_iter={n}", "train.checkpointer.period=1000", "train.eval_period=0"]


@pytest.mark.slow
def test_non_finite_loss_on_one_rank_stops_every_rank_with_one_message(tmp_path):
    processes = _start_ranks(
        tmp_path, lambda rank: _steps() + (["+model.nan_at_call=5"] if rank == 1 else [])
    )
    results = _finish(processes)
    expected = "Loss became infinite or NaN at iteration 4 on rank 1 of 2: loss_mse=nan"
    for code, _, output in results:
        assert code != 0
        assert expected in output, output[-3000:]


@pytest.mark.slow
def test_exception_on_one_rank_stops_the_others_within_seconds(tmp_path):
    def overrides(rank):
        slow = [callback_hook("slow", "sleep_each_step", seconds=0.05)]
        return _steps(400) + slow + ([callback_hook("fail", "fail_at", iteration=3)] if rank == 1 else [])

    results = _finish(_start_ranks(tmp_path, overrides))
    (code0, after0, output0), (code1, _, output1) = results
    assert code1 != 0 and "deliberate failure at iteration 3" in output1
    assert code0 != 0 and after0 < 15, output0[-3000:]
    assert "rank 1 failed: RuntimeError: deliberate failure at iteration 3" in output0, output0[-3000:]


@pytest.mark.slow
def test_killed_rank_stops_the_others_within_seconds(tmp_path):
    def overrides(rank):
        slow = [callback_hook("slow", "sleep_each_step", seconds=0.05)]
        return (
            _steps(400) + slow + ([callback_hook("kill", "kill_self_at", iteration=3)] if rank == 1 else [])
        )

    results = _finish(_start_ranks(tmp_path, overrides))
    (code0, after0, output0), (code1, _, _) = results
    assert code1 == -signal.SIGKILL
    assert code0 != 0 and after0 < 15, output0[-3000:]
    assert "rank 1 died" in output0, output0[-3000:]


@pytest.mark.slow
def test_ranks_resume_from_the_checkpoint_rank_0_chose(tmp_path):
    # First 6 iterations with checkpoints after iterations 1 and 3, and model_final after 5.
    first = _finish(_start_ranks(tmp_path, lambda rank: _steps(6) + ["train.checkpointer.period=2"]))
    assert [code for code, _, _ in first] == [0, 0], first[0][2][-2000:]
    assert open(tmp_path / "last_checkpoint").read() == "model_final.pth"

    # Rank 1 sees an older last_checkpoint (model_0000001.pth): it must still resume where rank 0 does.
    record = callback_hook(
        "record", "record_start_iteration", moment="before_train", output_dir=str(tmp_path)
    )
    overrides = _steps(8) + ["train.resume=true", record]
    results = _finish(
        _start_ranks(tmp_path, lambda rank: overrides, main="ddp_main_with_lagging_file_system")
    )
    assert [code for code, _, _ in results] == [0, 0], results[1][2][-3000:]
    assert [open(tmp_path / f"start_iter.rank{rank}").read() for rank in (0, 1)] == ["6", "6"]


def _start_cli(tmp_path, *overrides) -> WarmProcess:
    arguments = [TOY_CONFIG, f"hydra.run.dir={tmp_path}", "launch.num_processes=2", *overrides]
    return start_warm(["-m", "lazytrain", *arguments], REPO, {**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_cli(process: WarmProcess) -> subprocess.CompletedProcess:
    with process:
        process.wait(timeout=300)
        return subprocess.CompletedProcess(process.args, process.returncode, *process.read_output())


@pytest.mark.slow
def test_evaluation_longer_than_launch_timeout(tmp_path):
    long_evaluation = ["train.max_iter=4", "+dataloader.evaluator.sleep_seconds=6"]
    # Both jobs mostly wait (on the sleeping evaluation, on the timeout): they run side by side.
    allowed = _start_cli(tmp_path / "allowed", *long_evaluation, "launch.timeout=60s")
    too_short = _start_cli(tmp_path / "short", *long_evaluation, "launch.timeout=2s")
    allowed, too_short = _wait_cli(allowed), _wait_cli(too_short)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "toy/AP" in open(tmp_path / "allowed" / "metrics.json").read()

    assert too_short.returncode != 0
    assert "launch.timeout" in too_short.stderr, too_short.stderr[-3000:]
