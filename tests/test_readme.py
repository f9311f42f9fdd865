"""Every command in README.md runs: the quickstart is exactly two commands, CI runs the test command verbatim,
and each ``python -m lazytrain`` / ``python scripts/...`` command is run here as written, in README order, with
smoke overrides appended (2 iterations, tiny images, a tiny stand-in of the embedded data set). The lane of the
quickstart's run, its prediction and export runs each command as a new interpreter, as a user does; the other
lanes' ``python -m lazytrain`` commands run forked from a process that imported torch and lazytrain once
(tests/warm_command.py)."""

import glob
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from tests.smoke import FEW_DETECTIONS, TINY_SYNTHETIC_LT, smoke_overrides
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

# Appended to every `python -m lazytrain` command; a README override of the same key is replaced.
SMOKE = [
    *smoke_overrides(),
    "train.eval_period=0",
    FEW_DETECTIONS,
]
# Appended to search sweeps (hydra/sweeper=...): 2 trials, whatever the README asks for.
SEARCH_SMOKE = ["hydra.sweeper.n_trials=2"]
# Appended to grid sweeps of more than 2 jobs: no checkpoints (16 jobs would write 1.6 GB) and no plots (~2 s a
# job). The two-job sweeps and every single run still write both.
LARGE_SWEEP_SMOKE = ["~train.hooks.checkpointer", "~train.hooks.plots"]
# Appended to the training commands but those of runs/a, the quickstart's run that the chain builds on: the
# plots are most of a 2-iteration run's time (tests/engine/test_run_report.py checks a demo run's plots).
NO_PLOTS = "~train.hooks.plots"
SCRIPT_SMOKE = {
    "scripts/benchmark_trainer.py": ["--iters", "4", "--warmup", "1", "--repeats", "1", "--width", "32"]
}


def readme_commands(section: str | None = None) -> list[str]:
    """Commands of the ```bash blocks (of one `## section`, or all), comments stripped, in order."""
    text = open(README).read()
    if section is not None:
        text = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    else:  # its commands run in a fresh environment with the wheel, from its files' folder: test_own_project.py
        before, own_project = text.split("## Your own project\n", 1)
        text = before + "\n## " + own_project.split("\n## ", 1)[1]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        commands += [line.split(" #")[0].strip() for line in block.splitlines() if line.strip()]
    return commands


def test_quickstart_is_two_commands_install_and_run_then_test():
    install_and_run, test = readme_commands("Quickstart")
    assert install_and_run.startswith("pip install -e ") and "python -m lazytrain conf/" in install_and_run
    assert test == "python -m pytest tests -q -n 2"


def test_ci_runs_the_readme_test_command_verbatim():
    ci = [line.strip() for line in open(os.path.join(REPO, ".ci", "run"))]
    test_command = readme_commands("Quickstart")[1]
    assert test_command in ci
    # The floor environment's quick suite runs after it: any failing step, in either environment, must end CI.
    assert "set -euo pipefail" in ci
    install = readme_commands("Quickstart")[0].split(" && ")[0]
    # with pip, or uv's pip interface, and the arguments README gives
    installs = [line for line in ci if re.search(r"pip[ _]install", line)]
    assert any(line.endswith(install.removeprefix("pip install ")) for line in installs)


def test_ci_tests_the_floor_versions_that_pyproject_and_readme_state():
    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    floors = dict(re.findall(r'"(torch|torchvision)>=([0-9.]+)"', pyproject))
    assert set(floors) == {"torch", "torchvision"}, floors
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    floor_steps = ci[ci.index("python3 -m venv .venv-floor") :]
    readme = open(README).read()
    for name, version in floors.items():
        pinned = rf"(?<![\w.]){name}=={re.escape(version)}(\.0)*(?![\w.])"
        assert re.search(pinned, floor_steps), (name, version)
        assert f"{name} >= {version}" in readme, (name, version)
    assert '-m pytest tests -q -m "not slow"' in floor_steps


def grid_jobs(arguments: list[str]) -> int:
    """How many jobs a command starts: 1 for a run, the product of the numbers of values for a grid sweep."""
    if "-m" not in arguments or any(a.startswith("hydra/sweeper=") for a in arguments):
        return 1
    return math.prod(len(a.split("=", 1)[1].split(",")) for a in arguments if "=" in a and "/" not in a)


def with_smoke(arguments: list[str]) -> list[str]:
    smoke = SMOKE + (SEARCH_SMOKE if any(a.startswith("hydra/sweeper=") for a in arguments) else [])
    smoke += LARGE_SWEEP_SMOKE if grid_jobs(arguments) > 2 else []
    if _trains_without_plots(arguments) and NO_PLOTS not in smoke:
        smoke.append(NO_PLOTS)
    keys = {override.split("=")[0] for override in smoke}
    return [a for a in arguments if a.split("=")[0] not in keys] + smoke


@pytest.fixture(scope="module")
def datasets_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    generate_synthetic_lt(str(root / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    return str(root)


def _trains_without_plots(arguments: list[str]) -> bool:
    """A training (or evaluation) command of a config that does not write runs/a."""
    trains = bool(arguments) and arguments[0].endswith((".py", ".yaml"))
    return trains and not any(a.startswith("hydra.run.dir=runs/a") for a in arguments)


def smoke_argv(command: str) -> list[str]:
    """One README command as typed (python = this interpreter, conf/ = the repo's), smoke overrides appended."""
    words = shlex.split(command)
    assert words[0] == "python", command
    if words[1:4] == ["-m", "lazytrain", "cache"]:  # no run: nothing to shrink
        return [sys.executable, *words[1:]]
    if words[1:3] == ["-m", "lazytrain"]:
        arguments = [os.path.join(REPO, w) if w.startswith("conf/") else w for w in words[3:]]
        return [sys.executable, "-m", "lazytrain", *with_smoke(arguments)]
    return [sys.executable, os.path.join(REPO, words[1]), *SCRIPT_SMOKE.get(words[1], []), *words[2:]]


def run_command(command: str, cwd, env, warm: bool = False) -> subprocess.CompletedProcess:
    """`command` as a new process, or, `warm`, a ``python -m lazytrain`` command forked warm."""
    argv = smoke_argv(command)
    if warm and argv[1:3] == ["-m", "lazytrain"]:
        return run_warm(argv[3:], cwd, env, timeout=600)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def readme_lanes() -> list[list[str]]:
    """README's ``python -m lazytrain`` / ``python scripts/`` commands in README order, each distinct run once,
    in lanes that can run side by side: the commands that build on runs/a in two lanes, every other command
    alone, the longest first."""
    commands = [c.split(" && ")[-1] for c in readme_commands()]
    commands = [c for c in commands if c.startswith(("python -m lazytrain", "python scripts/"))]
    assert len(commands) >= 8, commands  # the tour, the sweep, resume, eval-only, the benchmark
    # The smoke overrides replace all of `train.max_iter=100 model.roi_heads.detections_per_img=50`, which
    # then is the quickstart's run.
    runs = {}
    for command in commands:
        runs.setdefault(tuple(smoke_argv(command)), command)
    commands = list(runs.values())
    chain = [c for c in commands if "runs/a" in c]
    # The chain in two lanes that each train runs/a first: evaluation and resume; prediction and export.
    deployment = [
        c for c in chain[1:] if c.startswith(("python -m lazytrain predict", "python -m lazytrain export"))
    ]
    evaluation = [c for c in chain[1:] if c not in deployment]
    alone = sorted((c for c in commands if "runs/a" not in c), key=lambda c: "losses.use=" not in c)
    return [[chain[0], *deployment], [alone[0]], [chain[0], *evaluation], *[[c] for c in alone[1:]]]


def _lane_id(lane: list[str]) -> str:
    words = [w for w in shlex.split(lane[0])[1:] if w not in ("-m", "lazytrain")][:3]
    return re.sub(r"[^A-Za-z0-9_.=/,-]+", "_", " ".join(words))[:60] + (
        f"+{len(lane) - 1}" if len(lane) > 1 else ""
    )


# Each lane is its own test, so pytest-xdist spreads them over its workers (one core each): the runs/a chain,
# the loss sweep and the other commands no longer share one worker.
@pytest.mark.slow
@pytest.mark.parametrize("lane", readme_lanes(), ids=_lane_id)
def test_readme_commands_run(lane, datasets_root, tmp_path):
    env = dict(os.environ, LAZYTRAIN_DATASETS=datasets_root, OMP_NUM_THREADS="1")
    # The tracker commands write local files only, whatever this machine's tracker settings are.
    env.update(WANDB_MODE="offline", MLFLOW_DISABLE_TELEMETRY="true", WANDB_ERROR_REPORTING="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    run_lane(lane, tmp_path / "lane", env, datasets_root, warm=lane != readme_lanes()[0])


def run_lane(commands: list[str], cwd, env, datasets_root: str, warm: bool) -> None:
    cwd.mkdir()
    (cwd / "datasets").symlink_to(datasets_root)  # "your own data" commands name ./datasets/... files
    for command in commands:
        before = snapshot(cwd / "runs" / "a")
        result = run_command(command, cwd, env, warm)
        assert result.returncode == 0, failure_report(command, result)
        check_outputs(command, result, cwd)
        if "runs/a/config.yaml" in command:  # a new run from the saved config leaves runs/a as it was
            assert snapshot(cwd / "runs" / "a") == before
    shutil.rmtree(cwd)  # checked: its runs' checkpoints need not wait for the end of the test


def failure_report(command: str, result: subprocess.CompletedProcess) -> str:
    """The command, its logged errors (a sweep's failed jobs are logged to stdout, with their tracebacks) and
    the end of stderr."""
    lines = result.stdout.splitlines()
    first_error = next((i for i, line in enumerate(lines) if re.search(r"\bERROR\b|^Traceback", line)), None)
    errors = (
        "\n".join(lines[first_error : first_error + 60]) if first_error is not None else result.stdout[-2000:]
    )
    return (
        f"{command}\n--- stdout from the first error ---\n{errors}\n--- stderr ---\n{result.stderr[-3000:]}"
    )


def snapshot(directory) -> dict[str, tuple[int, int]]:
    if not directory.exists():
        return {}
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir() if p.is_file()}


def check_outputs(command: str, result: subprocess.CompletedProcess, cwd) -> None:
    """What each kind of command must leave behind, beyond exiting 0."""
    output = result.stdout + result.stderr  # logs go to stdout, progress bars to stderr
    if "MLflowTracker" in command:
        assert "in experiment 'rfs_maskrcnn_demo'" in output
        assert os.path.isfile(cwd / "runs" / "mlflow" / "mlflow.db")
    elif "WandbTracker" in command:
        assert glob.glob(str(cwd / "runs" / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
        assert "wandb sync " in output
    elif "hydra/sweeper=optuna" in command:
        (best,) = glob.glob(str(cwd / "multirun" / "*" / "*" / "optimization_results.yaml"))
        assert "best_params" in open(best).read() and "Best value:" in output
    elif "conf/rfs_maskrcnn_custom" in command:
        # the embedded set is LVIS-style
        assert "Evaluation protocol for custom_val: federated (LVIS)" in output
    elif "--cfg job" in command:
        assert "dataloader:" in result.stdout and "Starting training" not in output
    elif " -m dataloader.train.sampler.repeat_thresh=" in command:
        (summary,) = glob.glob(str(cwd / "multirun" / "*" / "*" / "summary.csv"))
        rows = open(summary).read().splitlines()
        jobs = grid_jobs(shlex.split(command))  # the repeat_thresh values, times any other swept key's
        assert len(rows) == 1 + jobs and all("repeat_thresh" in row for row in rows[1:]), rows
    elif "train.resume=true" in command:
        assert "Resuming from iteration 2" in output
    elif "train.eval_only=true" in command:
        # 2 iterations detect nothing above the score threshold, so there may be no AP to print
        assert "Inference on 6 images" in output and "init weights from runs/a/model_final.pth" in output
    elif "hydra.run.dir=runs/a" in command:
        with open(cwd / "runs" / "a" / "last_checkpoint") as f:
            assert f.read().strip() == "model_final.pth"
        iterations = [json.loads(line).get("iteration") for line in open(cwd / "runs" / "a" / "metrics.json")]
        assert 1 in iterations
    elif "predict.exported=" in command:
        images = json.load(open(cwd / "runs" / "a" / "exported" / "images.json"))["images"]
        assert len(images) == 6 and "Predicted 6 images" in result.stdout
        assert "export/model.pt2" in output
    elif command.startswith("python -m lazytrain predict runs/a"):
        images = json.load(open(cwd / "runs" / "a" / "predictions" / "images.json"))["images"]
        assert len(images) == 6 and "Predicted 6 images" in result.stdout
        assert isinstance(json.load(open(cwd / "runs" / "a" / "predictions" / "results.json")), list)
        assert len(os.listdir(cwd / "runs" / "a" / "predictions" / "drawn")) == 6
    elif command.startswith("python -m lazytrain export runs/a"):
        exported = sorted(os.listdir(cwd / "runs" / "a" / "export"))
        assert exported == ["model.json", "model.onnx", "model.pt2"], exported
        assert output.count("parity") >= 2, output
    elif command.startswith("python -m lazytrain cache "):
        # The file's line (or, before any run made it, where it will be): named after the json.
        assert result.stdout.startswith("cache folder: ") and "lvis_v1_train-" in result.stdout
    elif command.startswith("python scripts/"):
        assert "|" in result.stdout  # a markdown table
