"""Stopping on SIGTERM (preemption) and Ctrl-C: checkpoint, clean exit, exact resume; random SIGKILL soak."""

import json
import multiprocessing
import os
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch

from lazytrain.config import LazyConfig
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.program.default import run
from tests.engine import toy
from tests.engine.conftest import TOY_CONFIG
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_sigint():
    """Children of a background job in a non-interactive shell (as CI may run us) inherit an ignored SIGINT,
    which lazytrain, like Python, keeps ignoring; the runs under test get the default, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def lazytrain(*args, cwd, timeout=180, ignore_sigint=False, config=TOY_CONFIG):
    """``python -m lazytrain CONFIG *args``, forked warm in a session of its own (the toy's callbacks
    signal it from inside); SIGINT raises KeyboardInterrupt as in a terminal, or stays ignored."""
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    return run_warm([config, *args], cwd, env, timeout=timeout, new_session=True, ignore_sigint=ignore_sigint)


def callback_hook(name, function, moment="after_step", **kwargs):
    """An override adding a CallbackHook that calls ``tests.engine.toy.<function>(trainer, **kwargs)``."""
    arguments = ", ".join(f"{key}: {value}" for key, value in kwargs.items())
    return (
        f"+train.hooks.{name}={{_target_: lazytrain.engine.hooks.CallbackHook, {moment}: {{_target_: "
        f"functools.partial, _args_: [{{_target_: lazytrain.config.locate, _args_: [tests.engine.toy.{function}]}}], "
        f"{arguments}}}}}"
    )


def final_weights(run_dir):
    return torch.load(os.path.join(run_dir, "model_final.pth"), weights_only=True)["model"]


def assert_same_weights(expected, got):
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


@pytest.mark.parametrize(
    ("signum", "times", "exit_code"),
    [(signal.SIGTERM, 1, 143), (signal.SIGINT, 1, 130), (signal.SIGINT, 2, 130)],
    # twice at once: one Ctrl-C that a wrapper such as `timeout` passed on as well
    ids=["sigterm", "ctrl-c", "ctrl-c-delivered-twice"],
)
def test_signal_checkpoints_stops_cleanly_and_resume_is_exact(toy_cfg, tmp_path, signum, times, exit_code):
    run(toy_cfg)  # the uninterrupted reference
    run_dir = tmp_path / "stopped"
    # Sent while the hooks of step 12 run: the trainer finishes step 13, then stops.
    stop = callback_hook("stop", "send_signal_at", iteration=12, signum=int(signum), times=times)
    result = lazytrain(f"hydra.run.dir={run_dir}", stop, cwd=tmp_path)

    name = signal.Signals(signum).name
    assert result.returncode == exit_code, result.stderr[-3000:]
    assert f"Training stopped by {name} after iteration 13 (checkpoint saved)" in result.stderr
    resume = f"python -m lazytrain {run_dir}/config.yaml hydra.run.dir={run_dir} train.resume=true"
    assert f"lazytrain: to continue: {resume}" in result.stderr
    assert "train.resume=true" in result.stderr and "Traceback" not in result.stderr
    log = (run_dir / "log.txt").read_text()
    assert f"Received {name}: stopping after iteration 13; saving a checkpoint" in log
    assert (run_dir / "last_checkpoint").read_text() == "model_0000013.pth"
    # The checkpoint hook saved it (so it is rotated like a periodic one), the after_train hooks flushed the
    # metrics up to the stop, and no evaluation ran.
    checkpoint = Checkpointer(toy.ToyRegressor(), str(run_dir)).read(str(run_dir / "model_0000013.pth"))
    assert checkpoint["iteration"] == 13
    assert "model_0000013.pth" in checkpoint["trainer"]["hooks"]["checkpointer"]["saved"]
    metrics = (run_dir / "metrics.json").read_text()
    assert '"iteration": 13' in metrics and "toy/AP" not in metrics

    # The printed command, with the run's saved config.
    config, *arguments = shlex.split(resume)[3:]
    resumed = lazytrain(*arguments, cwd=tmp_path, config=config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from iteration 14" in (run_dir / "log.txt").read_text()
    assert_same_weights(final_weights(toy_cfg.train.output_dir), final_weights(run_dir))


def test_stop_during_a_periodic_evaluation_abandons_it_and_resume_evaluates_first(toy_cfg, tmp_path):
    toy_cfg.train.eval_period = 10
    run(toy_cfg)
    run_dir = tmp_path / "stopped"
    periodic = ["train.eval_period=10"]
    stop = callback_hook(
        "stop", "signal_during_evaluation", moment="before_train", iteration=9, signum=int(signal.SIGTERM)
    )
    result = lazytrain(f"hydra.run.dir={run_dir}", *periodic, stop, cwd=tmp_path)

    assert result.returncode == 143, result.stderr[-3000:]
    log = (run_dir / "log.txt").read_text()
    assert "Received SIGTERM during the evaluation at iteration 9: evaluation abandoned" in log
    assert "toy/AP" not in (run_dir / "metrics.json").read_text()
    # The checkpoint of iteration 9 (written before the evaluation) was saved again with the evaluation pending.
    assert (run_dir / "last_checkpoint").read_text() == "model_0000009.pth"
    checkpoint = Checkpointer(toy.ToyRegressor(), str(run_dir)).read(str(run_dir / "model_0000009.pth"))
    assert checkpoint["trainer"]["hooks"]["eval"] == {"pending_iter": 9}

    resumed = lazytrain(f"hydra.run.dir={run_dir}", *periodic, "train.resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from iteration 10" in (run_dir / "log.txt").read_text()
    evaluated = [
        line["iteration"]
        for line in map(json.loads, (run_dir / "metrics.json").read_text().splitlines())
        if "toy/AP" in line
    ]
    assert evaluated == [9, 19, 30]  # the abandoned one first, then the periodic and final ones
    assert_same_weights(final_weights(toy_cfg.train.output_dir), final_weights(run_dir))


def test_second_ctrl_c_stops_at_once_without_corrupting_checkpoints(toy_cfg, tmp_path):
    run(toy_cfg)
    run_dir = tmp_path / "aborted"
    # A second press later than `SAME_CTRL_C_SECONDS` after the first.
    twice = callback_hook(
        "stop", "send_signal_at", iteration=12, signum=int(signal.SIGINT), times=2, interval=1.2
    )
    result = lazytrain(f"hydra.run.dir={run_dir}", twice, cwd=tmp_path)

    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr
    assert not (run_dir / "model_0000012.pth").exists()  # stopped at once, no stop checkpoint
    assert (run_dir / "last_checkpoint").read_text() == "model_0000009.pth"
    resumed = lazytrain(f"hydra.run.dir={run_dir}", "train.resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from iteration 10" in (run_dir / "log.txt").read_text()
    assert_same_weights(final_weights(toy_cfg.train.output_dir), final_weights(run_dir))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c to the process group", "sigterm from rank 1 to the parent"])
def test_two_ranks_stop_at_the_same_iteration_and_resume(tmp_path, how):
    run_dir = tmp_path / "run"
    args = [
        f"hydra.run.dir={run_dir}",
        "launch.num_processes=2",
        "train.max_iter=400",
        "train.checkpointer.period=1000",
        callback_hook("slow", "sleep_each_step", seconds=0.02),
    ]
    if how.startswith("sigterm"):
        args.append(
            callback_hook("stop", "send_signal_at", iteration=20, signum=int(signal.SIGTERM), to_parent=True)
        )
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "lazytrain", TOY_CONFIG, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=default_sigint,
    )
    if how.startswith("ctrl-c"):
        _wait_for(lambda: "iter: 29" in _read(run_dir / "log.txt"), process, seconds=120)
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, stderr = process.communicate(timeout=120)

    name = "SIGINT" if how.startswith("ctrl-c") else "SIGTERM"
    assert process.returncode == 128 + getattr(signal, name), stderr[-3000:]
    assert f"Training stopped by {name}: all 2 ranks saved a checkpoint" in stderr
    # Each rank logged its stop; both stopped after the same step, and the checkpoint is of that step.
    stops = [_stop_iteration(run_dir / log) for log in ("log.txt", "log.txt.rank1")]
    assert stops[0] == stops[1] and 0 < stops[0] < 399, stops
    assert (run_dir / "last_checkpoint").read_text() == f"model_{stops[0]:07d}.pth"

    resumed = lazytrain(*args[:4], "train.resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from iteration {stops[0] + 1}" in _read(run_dir / "log.txt")
    assert torch.load(run_dir / "model_final.pth", weights_only=True)["iteration"] == 399


def _read(path):
    return path.read_text() if path.exists() else ""


def _wait_for(condition, process, seconds):
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _log_mentions(log_path, text, times):
    return _read(log_path).count(text) >= times


def _stop_iteration(log_path):
    marker = "stopping after iteration "
    line = next(line for line in _read(log_path).splitlines() if marker in line)
    return int(line.split(marker)[1].split(";")[0])


def _soak_run(run_dir: str, overrides: list[str]) -> None:
    """One run of the soak's job, in a process the fork server forks (torch and lazytrain already imported)."""
    torch.set_num_threads(1)
    cfg = LazyConfig.load(TOY_CONFIG)
    cfg.train.output_dir = run_dir
    LazyConfig.apply_overrides(cfg, overrides)
    run(cfg)


@pytest.mark.slow
def test_random_sigkill_soak_always_leaves_a_loadable_checkpoint_and_resumes_exactly(toy_cfg, tmp_path):
    """20 chained runs of one job, each SIGKILLed at a random moment (setup, steps, saves), then one to the end."""
    toy_cfg.train.max_iter = 2000
    toy_cfg.train.checkpointer.period = 1000  # how often a run saves does not change its weights
    run(toy_cfg)
    run_dir = tmp_path / "soak"
    overrides = [
        "train.resume=true",
        "train.max_iter=2000",
        "train.checkpointer.period=3",
        "train.checkpointer.max_to_keep=2",
    ]
    slow = callback_hook("slow", "sleep_each_step", seconds=0.01)
    # The killed runs are forked by a clean single-threaded server that imported torch and lazytrain once,
    # rather than started as new interpreters: 20 imports of torch were most of this test's time.
    processes = multiprocessing.get_context("forkserver")
    processes.set_forkserver_preload([__name__])
    rng = random.Random(0)
    last_iteration, starts = -1, 0
    for trial in range(20):
        process = processes.Process(target=_soak_run, args=(str(run_dir), [*overrides, slow]))
        process.start()
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.0, 0.5))  # during setup
        else:
            starts += 1
            deadline = time.monotonic() + 60
            while not _log_mentions(run_dir / "log.txt", "Starting training", starts):
                assert process.is_alive() and time.monotonic() < deadline, f"trial {trial}: no start"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.8))  # during steps and checkpoint writes (one every 3 steps)
        assert process.is_alive(), f"trial {trial}: the run ended before it was killed"
        process.kill()
        process.join()
        checkpointer = Checkpointer(toy.ToyRegressor(), str(run_dir))
        if checkpointer.has_checkpoint():
            extra = checkpointer.load(checkpointer.get_checkpoint_file(), checkpointables=[])
            assert extra["iteration"] >= last_iteration, f"trial {trial}: went back to {extra['iteration']}"
            last_iteration = extra["iteration"]
    assert last_iteration > 100, last_iteration  # the kills landed during training
    code = (
        "import sys\n"
        "from tests.engine.test_preemption import _soak_run\n"
        f"_soak_run({str(run_dir)!r}, sys.argv[1:])\n"
    )
    to_the_end = [*overrides, "train.checkpointer.period=1000"]
    finished = subprocess.run(
        [sys.executable, "-c", code, *to_the_end], cwd=REPO, capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_weights(final_weights(toy_cfg.train.output_dir), final_weights(run_dir))


def test_an_ignored_sigint_stays_ignored_as_python_does(tmp_path):
    """Started with SIGINT ignored (nohup, a background job of a script), a run is not stopped by it."""
    run_dir = tmp_path / "run"
    stop = callback_hook("stop", "send_signal_at", iteration=12, signum=int(signal.SIGINT))
    result = lazytrain(f"hydra.run.dir={run_dir}", stop, cwd=tmp_path, ignore_sigint=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "last_checkpoint").read_text() == "model_final.pth"
