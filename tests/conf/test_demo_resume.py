"""The real recipe (conf/rfs_maskrcnn_demo.py, shortened) through kill-and-resume, 1 and 2 processes.

A chained job is killed during a step, during a checkpoint write and during the final evaluation, and resumed
each time with ``train.resume=true``; its final weights and its metrics.json (losses, lr, evaluation) must be
those of one uninterrupted run. The toy model cannot catch what broke this before (issue 17): a loader drawing
from the global RNG when it starts, which moved the detector's proposal sampling. The uninterrupted reference runs
are new interpreters; the interrupted and resumed runs are forked warm (tests/warm_command.py), each in a session
of its own.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.program.predictor import Predictor
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")
MAX_ITER = 6
SHORT = [
    f"train.max_iter={MAX_ITER}",
    "train.checkpointer.period=2",
    "train.checkpointer.max_to_keep=null",
    "train.log_period=1",
    "train.seed=3",
    "model.num_classes=30",
    "dataloader.train.total_batch_size=2",
    "dataloader.test.num_workers=0",
    "dataloader.test.batch_size=1",  # the evaluation is interrupted at its second forward pass
    "dataloader.train.mapper.augmentations.0.short_edge_length=[80,96]",
    "dataloader.train.mapper.augmentations.0.max_size=128",
    "dataloader.test.mapper.augmentations.0.short_edge_length=96",
    "dataloader.test.mapper.augmentations.0.max_size=128",
    "~train.hooks.plots",  # most of a short run's time; tests/engine/test_run_report.py checks the plots
]
NOT_REPRODUCIBLE = {"time", "data_time"}  # wall-clock measurements


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    generate_synthetic_lt(
        str(root / "synthetic_lt"), num_train=16, num_val=4, size_range=(64, 96), val_images_per_category=1
    )
    return root


def callback(name, moment, function, **kwargs):
    """An override adding a CallbackHook that calls ``tests.conf.interruptions.<function>(trainer, **kwargs)``."""
    arguments = "".join(f", {key}: {value}" for key, value in kwargs.items())
    return (
        f"+train.hooks.{name}={{_target_: lazytrain.engine.hooks.CallbackHook, {moment}: {{_target_: "
        f"functools.partial, _args_: [{{_target_: lazytrain.config.locate, _args_: "
        f"[tests.conf.interruptions.{function}]}}]{arguments}}}}}"
    )


def _environment(datasets) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "LAZYTRAIN_DATASETS": str(datasets)}


def _arguments(run_dir, processes: int, args) -> list[str]:
    return [DEMO, *SHORT, f"launch.num_processes={processes}", f"hydra.run.dir={run_dir}", *args]


def demo(run_dir, datasets, *args, processes=1):
    """Run the shortened demo in its own session (kills hit its process group), forked warm; returns the
    result and the time it ended."""
    result = run_warm(
        _arguments(run_dir, processes, args), REPO, _environment(datasets), timeout=300, new_session=True
    )
    return result, time.time()


def reference_run(tmp_path_factory, datasets, processes, *args):
    """A module fixture's body: an uninterrupted run's directory, removed after the module (a fixture's
    directory otherwise stays until the session ends). Its periodic checkpoints go at once: the tests compare
    the final weights and metrics.json."""
    run_dir = tmp_path_factory.mktemp(f"reference{processes}") / "run"
    # A new interpreter whose stdout is a file, as under SLURM: block-buffered, with forked loader workers.
    with open(run_dir.parent / "stdout.txt", "w") as stdout:
        result = subprocess.run(
            [sys.executable, "-m", "lazytrain", *_arguments(run_dir, processes, args)],
            cwd=REPO,
            env=_environment(datasets),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    # DDP's stride warning for 1x1 convolutions' gradients is spurious (lazytrain.program.default filters it).
    assert "Grad strides do not match" not in result.stderr
    # Each line once (the train annotations were loaded twice, and a forked worker can repeat unflushed output).
    printed = (run_dir.parent / "stdout.txt").read_text()
    assert printed.count("Loaded 16 images") == 1 and printed.count("Starting training") == 1, printed[-3000:]
    for periodic in run_dir.glob("model_0*.pth"):
        periodic.unlink()
    yield run_dir
    shutil.rmtree(run_dir.parent)


@pytest.fixture(scope="module")
def reference_1(tmp_path_factory, datasets):
    yield from reference_run(tmp_path_factory, datasets, 1)


@pytest.fixture(scope="module")
def reference_2(tmp_path_factory, datasets):
    yield from reference_run(tmp_path_factory, datasets, 2)


# An EMA far from the trained weights (decay 0.5 from the first step), and each step's 2 images in 2 passes.
EMA_AND_ACCUMULATION = [
    "train.ema.enabled=true",
    "train.ema.decay=0.5",
    "train.ema.tau=0",
    "train.images_per_forward=1",
]


@pytest.fixture(scope="module")
def reference_ema(tmp_path_factory, datasets):
    yield from reference_run(tmp_path_factory, datasets, 1, *EMA_AND_ACCUMULATION)


def metrics(run_dir):
    """iteration -> reproducible values of the metrics.json line (each iteration must appear once)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.json").read_text().splitlines()]
    iterations = [line["iteration"] for line in lines]
    assert len(iterations) == len(set(iterations)), iterations
    return {line["iteration"]: {k: v for k, v in line.items() if k not in NOT_REPRODUCIBLE} for line in lines}


def assert_same_run(reference, resumed, resumed_from, weights=("model",)):
    for entry in weights:
        expected = torch.load(reference / "model_final.pth", weights_only=True)[entry]
        got = torch.load(resumed / "model_final.pth", weights_only=True)[entry]
        assert expected.keys() == got.keys()
        different = [key for key in expected if not torch.equal(expected[key], got[key])]
        assert not different, (
            f"{entry}: {len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"
        )
    expected_metrics, got_metrics = metrics(reference), metrics(resumed)
    assert sorted(got_metrics) == sorted(expected_metrics) == list(range(MAX_ITER + 1))
    for iteration in range(resumed_from, MAX_ITER + 1):
        assert got_metrics[iteration] == expected_metrics[iteration], iteration
    assert "total_loss" in got_metrics[MAX_ITER - 1] and "segm/AP" in got_metrics[MAX_ITER]


def assert_killed(result, run_dir, last_checkpoint):
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert (run_dir / "last_checkpoint").read_text() == last_checkpoint


@pytest.mark.slow
def test_one_process_killed_during_a_step_a_checkpoint_write_and_the_evaluation_resumes_exactly(
    datasets, reference_1, tmp_path
):
    run_dir = tmp_path / "run"
    killed, _ = demo(run_dir, datasets, callback("kill", "after_backward", "kill_during_step", iteration=3))
    assert_killed(killed, run_dir, "model_0000001.pth")

    resume = "train.resume=true"
    write = callback("kill", "before_train", "kill_during_checkpoint_write", iteration=3)
    killed, _ = demo(run_dir, datasets, resume, write)
    assert_killed(killed, run_dir, "model_0000001.pth")
    assert any(name.startswith(".model_0000003.pth.tmp") for name in os.listdir(run_dir))  # half written

    evaluation = callback("kill", "before_train", "interrupt_final_evaluation", signum=int(signal.SIGKILL))
    killed, _ = demo(run_dir, datasets, resume, evaluation)
    assert_killed(killed, run_dir, "model_final.pth")
    assert "segm/AP" not in (run_dir / "metrics.json").read_text()

    finished, _ = demo(run_dir, datasets, resume)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"Resuming from iteration {MAX_ITER}" in (run_dir / "log.txt").read_text()
    assert not [name for name in os.listdir(run_dir) if ".pth.tmp" in name]  # the half-written file is gone
    assert_same_run(reference_1, run_dir, resumed_from=2)


@pytest.mark.slow
def test_two_processes_killed_during_a_step_and_stopped_during_the_evaluation_resume_exactly(
    datasets, reference_2, tmp_path
):
    run_dir = tmp_path / "run"
    killed, _ = demo(
        run_dir, datasets, callback("kill", "after_backward", "kill_during_step", iteration=4), processes=2
    )
    assert_killed(killed, run_dir, "model_0000003.pth")

    # SIGTERM to every process (as SLURM sends it) at the second image of an evaluation that would take 40 s
    # more: all ranks abandon it within seconds, and exit as a stopped run.
    evaluation = callback(
        "stop", "before_train", "interrupt_final_evaluation", signum=int(signal.SIGTERM), seconds_per_image=40
    )
    stopped, ended = demo(run_dir, datasets, "train.resume=true", evaluation, processes=2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert ended - float((run_dir / "signal_sent").read_text()) < 30
    assert "Traceback" not in stopped.stderr and "train.resume=true" in stopped.stderr.splitlines()[-1]
    for log in ("log.txt", "log.txt.rank1"):
        assert "during the evaluation at iteration 6: evaluation abandoned" in (run_dir / log).read_text(), (
            log
        )
    assert (run_dir / "last_checkpoint").read_text() == "model_final.pth"
    assert "segm/AP" not in (run_dir / "metrics.json").read_text()

    finished, _ = demo(run_dir, datasets, "train.resume=true", processes=2)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_run(reference_2, run_dir, resumed_from=4)


@pytest.mark.slow
def test_two_processes_sent_sigterm_during_a_step_stop_with_a_checkpoint_and_resume_exactly(
    datasets, reference_2, tmp_path
):
    # SLURM's preemption signals every process of the job, the loader workers included: a worker killed by it
    # made its rank fail ("DataLoader worker ... is killed by signal: Terminated") instead of stopping.
    run_dir = tmp_path / "run"
    sigterm = callback("stop", "after_backward", "kill_during_step", iteration=3, signum=int(signal.SIGTERM))
    stopped, _ = demo(run_dir, datasets, sigterm, processes=2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    # Sent during step 3, agreed on by the ranks in step 4: that step is saved, between periodic ones.
    assert (run_dir / "last_checkpoint").read_text() == "model_0000004.pth"
    finished, _ = demo(run_dir, datasets, "train.resume=true", processes=2)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_run(reference_2, run_dir, resumed_from=5)


@pytest.mark.slow
def test_with_ema_and_accumulation_a_run_killed_during_a_step_resumes_exactly_and_predicts_with_the_ema(
    datasets, reference_ema, tmp_path, one_thread
):
    run_dir = tmp_path / "run"
    kill = callback("kill", "after_backward", "kill_during_step", iteration=3)
    killed, _ = demo(run_dir, datasets, *EMA_AND_ACCUMULATION, kill)
    assert_killed(killed, run_dir, "model_0000001.pth")
    finished, _ = demo(run_dir, datasets, *EMA_AND_ACCUMULATION, "train.resume=true")
    assert finished.returncode == 0, finished.stderr[-3000:]
    # The average ("model") and the trained weights, the losses and the EMA's evaluation: all as uninterrupted.
    assert_same_run(reference_ema, run_dir, resumed_from=2, weights=("model", "training_model"))
    saved = torch.load(run_dir / "model_final.pth", weights_only=True)
    assert saved["ema"]["updates"] == MAX_ITER
    assert any(not torch.equal(saved["model"][k], saved["training_model"][k]) for k in saved["model"])
    log = (run_dir / "log.txt").read_text()
    assert f"Evaluating with EMA weights (decay 0.5, {MAX_ITER} updates)" in log
    assert "1 per forward pass (2 passes per step and process)" in log

    # Predict uses what evaluation measured: the EMA weights.
    evaluated = json.loads((run_dir / "lvis_instances_results.json").read_text())
    assert evaluated
    images = json.loads((datasets / "synthetic_lt" / "lvis_v1_val.json").read_text())["images"]
    predictor = Predictor.from_run(run_dir, device="cpu")
    paths = [str(datasets / "synthetic_lt" / image["file_name"]) for image in images]
    predicted = [e for image, p in zip(images, predictor(paths)) for e in p.to_coco(image["id"])]
    key = lambda e: (e["image_id"], -e["score"], e["category_id"], e["bbox"])  # noqa: E731
    assert sorted(predicted, key=key) == sorted(evaluated, key=key)
