"""End-to-end tests of `python -m lazytrain` on toy configs (CPU, gloo)."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.warm_command import run_warm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOY = os.path.join(HERE, "toy_launch_config.py")
ENGINE_TOY = os.path.join(REPO, "tests", "engine", "toy_config.py")


def _environment(env: dict | None) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", **(env or {})}


def lazytrain(*args, cwd, timeout=180, env=None):
    """``python -m lazytrain *args`` in `cwd`, forked from a process that imported torch and lazytrain once
    (tests/warm_command.py): its exit status, stdout and stderr."""
    return run_warm(list(args), cwd, _environment(env), timeout)


def read_rank(run_dir, rank):
    with open(os.path.join(run_dir, f"rank{rank}.json")) as f:
        return json.load(f)


def assert_no_rank_left(run_dir):
    """The ranks wrote their pids to run_dir/pid0, pid1; none of them may still run (no orphans)."""
    pids = [int((run_dir / f"pid{rank}").read_text()) for rank in (0, 1)]
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_two_cpu_processes_share_a_process_group(tmp_path):
    result = lazytrain(TOY, f"hydra.run.dir={tmp_path}/run", "train.lr=0.25", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [read_rank(tmp_path / "run", r) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["world_size"] == 2
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == [0, 10]
    assert ranks[0]["seed"] == ranks[1]["seed"]
    assert ranks[0]["gather"] == [1, 2] and ranks[1]["gather"] == []
    assert ranks[0]["reduced"] == 0.5  # mean of ranks 0 and 1
    assert [r["local_rank"] for r in ranks] == [0, 1] and ranks[1]["local_size"] == 2
    assert ranks[0]["lr"] == 0.25
    assert (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text().strip() == "- train.lr=0.25"


def test_single_process_and_add_delete_overrides(tmp_path):
    result = lazytrain(
        TOY,
        f"hydra.run.dir={tmp_path}/run",
        "launch.num_processes=1",
        "+train.extra=1",
        "++train.lr=0.5",
        "~train.device",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_rank(tmp_path / "run", 0)["world_size"] == 1
    saved = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "extra: 1" in saved and "device" not in saved


@pytest.mark.slow
def test_multirun_sweep_of_two_process_jobs_writes_summary(tmp_path):
    result = lazytrain(
        TOY, "-m", "train.lr=0.1,0.2,0.3", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "| 0 | train.lr=0.1 | ok |" in summary and "| 2 | train.lr=0.3 | ok |" in summary
    csv_lines = (tmp_path / "sweep" / "summary.csv").read_text().splitlines()
    assert csv_lines[0] == "job,overrides,status,seconds,bbox/AP,reason" and csv_lines[2].endswith(",20.0,")
    assert (tmp_path / "sweep" / "summary.png").stat().st_size > 10_000  # bbox/AP against train.lr
    for job in range(3):
        assert read_rank(tmp_path / "sweep" / str(job), 1)["world_size"] == 2
    assert "Sweep summary" in result.stdout


def test_cfg_job_prints_config_without_running(tmp_path):
    result = lazytrain(TOY, "--cfg", "job", "train.lr=0.75", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "lr: 0.75" in result.stdout and "main: tests.launch.toy_main.record_ranks" in result.stdout
    assert not list(tmp_path.glob("outputs"))


def test_cfg_job_shows_trainer_and_named_hooks(tmp_path):
    result = lazytrain(ENGINE_TOY, "--cfg", "job", "~train.hooks.checkpointer", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "_target_: lazytrain.engine.train_loop.SimpleTrainer" in result.stdout
    assert "lr_scheduler:" in result.stdout and "writer:" in result.stdout
    assert "PeriodicCheckpointer" not in result.stdout


def test_unknown_key_error_suggests_and_exits_nonzero(tmp_path):
    result = lazytrain(TOY, "train.lrr=3", cwd=tmp_path)
    assert result.returncode == 1
    assert "key 'train.lrr' is not in the config. Did you mean: train.lr" in result.stderr
    assert "Traceback" not in result.stderr


def test_sweep_syntax_without_multirun_is_explained(tmp_path):
    result = lazytrain(TOY, "train.lr=0.1,0.2", cwd=tmp_path)
    assert result.returncode == 1 and "--multirun" in result.stderr


def test_validation_reports_problems_before_spawning(tmp_path):
    result = lazytrain(ENGINE_TOY, f"hydra.run.dir={tmp_path}/run", "+model.dims=3", cwd=tmp_path)
    assert result.returncode == 1
    assert (
        "model.dims: tests.engine.toy.ToyRegressor has no argument 'dims'. Did you mean 'dim'?"
        in result.stderr
    )
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_missing_lvis_stops_before_spawn_with_layout_help(tmp_path):
    result = lazytrain(
        os.path.join(REPO, "conf", "rfs_maskrcnn.py"),
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
        env={"LAZYTRAIN_DATASETS": str(tmp_path / "nodata")},
    )
    assert result.returncode == 1
    assert "data set 'lvis_v1_train' is not on disk" in result.stderr
    assert "python -m lazytrain lazytrain://rfs_maskrcnn_demo" in result.stderr


@pytest.mark.slow
def test_failing_rank_exits_nonzero_quickly_naming_rank(tmp_path):
    start = time.time()
    result = lazytrain(
        TOY,
        "launch.main=tests.launch.toy_main.fail_on_rank_one",
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
        timeout=120,
    )
    assert time.time() - start < 60
    assert result.returncode == 1
    assert "lazytrain: rank 1 (process 1 on machine 0) failed" in result.stderr
    assert "deliberate failure on rank 1" in result.stderr
    assert_no_rank_left(tmp_path / "run")


def test_rank_failing_during_evaluation_exits_nonzero_quickly_naming_rank(tmp_path):
    start = time.time()
    result = lazytrain(
        ENGINE_TOY,
        f"hydra.run.dir={tmp_path}/run",
        "launch.num_processes=2",
        "train.max_iter=3",
        "dataloader.evaluator._target_=tests.engine.toy.EvaluatorFailingOnRankOne",
        "+dataloader.evaluator.output_dir=${train.output_dir}",
        cwd=tmp_path,
        timeout=120,
    )
    assert time.time() - start < 60
    assert result.returncode == 1, result.stderr[-3000:]
    assert "lazytrain: rank 1 (process 1 on machine 0) failed" in result.stderr
    assert "Traceback" in result.stderr and "deliberate evaluation failure on rank 1" in result.stderr
    # training had finished: its final checkpoint is intact
    assert (tmp_path / "run" / "last_checkpoint").read_text() == "model_final.pth"
    assert_no_rank_left(tmp_path / "run")


def test_missing_init_checkpoint_stops_before_spawn(tmp_path):
    missing = tmp_path / "nowhere" / "model.pth"
    result = lazytrain(
        ENGINE_TOY, f"hydra.run.dir={tmp_path}/run", f"train.init_checkpoint={missing}", cwd=tmp_path
    )
    assert result.returncode == 1
    assert f"lazytrain: train.init_checkpoint={missing}: no such file." in result.stderr
    assert "train.init_checkpoint=null" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "log.txt").exists()  # nothing ran


def test_failing_job_in_a_sweep_is_recorded_and_the_sweep_goes_on(tmp_path):
    result = lazytrain(
        TOY,
        "-m",
        "launch.num_processes=1",
        "launch.main=tests.launch.toy_main.fail_if_lr_is_negative",
        "train.lr=-1,0.5",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
    )
    assert result.returncode == 1 and "1 job(s) of the sweep failed" in result.stderr
    # The last lines name the failed job and why, whatever scrolled by before them.
    assert result.stderr.rstrip().endswith("  job 0 (train.lr=-1): ValueError: negative lr -1"), result.stderr
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "| 0 | train.lr=-1 | failed |" in summary and "| 1 | train.lr=0.5 | ok |" in summary
    assert "50.00 |" in summary
    assert "Failed jobs:\n- job 0 (train.lr=-1): ValueError: negative lr -1\n" in summary


def test_range_and_choice_sweep_runs_the_cartesian_product(tmp_path):
    result = lazytrain(
        TOY,
        "--multirun",
        "launch.num_processes=1",
        "train.lr=range(1,3)",
        "+train.tag=choice(a,b)",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = (tmp_path / "sweep" / "summary.csv").read_text().splitlines()[1:]
    assert [row.split(",")[1] for row in rows] == [
        "train.lr=1 +train.tag=a",
        "train.lr=1 +train.tag=b",
        "train.lr=2 +train.tag=a",
        "train.lr=2 +train.tag=b",
    ]
    assert read_rank(tmp_path / "sweep" / "3", 0)["lr"] == 2


def test_cfg_resolve_package_and_info(tmp_path):
    result = lazytrain(
        TOY, "--cfg", "job", "--resolve", "-p", "launch", "launch.dist_url=tcp://h:1", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# @package launch") and "dist_url: tcp://h:1" in result.stdout
    assert "train:" not in result.stdout
    result = lazytrain(TOY, "--info", "config", cwd=tmp_path)
    assert result.returncode == 0 and "num_processes: 2" in result.stdout


def test_help_lists_top_level_keys_and_the_config_docstring(tmp_path):
    result = lazytrain(TOY, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "A config whose per-rank program only records ranks" in result.stdout
    assert "== Top-level keys ==\n  train: output_dir, lr, device\n  launch: num_gpus," in result.stdout
    assert "lr: 0.5" in result.stdout


def test_more_gpus_than_visible_is_a_clear_error(tmp_path):
    result = lazytrain(
        TOY, "train.device=cuda", "launch.num_gpus=64", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "launch.num_gpus=64 but only" in result.stderr or "no GPU is visible" in result.stderr
    result = lazytrain(TOY, "launch.num_gpus=2", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 1 and "launch.num_gpus=2 but train.device is not cuda" in result.stderr


def test_explicit_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = lazytrain(
            TOY, f"launch.dist_url=tcp://127.0.0.1:{port}", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path
        )
    assert result.returncode != 0 and f"port {port} is already in use" in result.stderr


@pytest.mark.slow
def test_resume_via_run_dir_and_config_yaml_reproduces(tmp_path):
    run = tmp_path / "run"
    first = lazytrain(ENGINE_TOY, f"hydra.run.dir={run}", "train.max_iter=12", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = lazytrain(
        ENGINE_TOY, f"hydra.run.dir={run}", "train.max_iter=20", "train.resume=true", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from iteration 12" in (run / "log.txt").read_text()
    again = lazytrain(
        str(run / "config.yaml"), f"hydra.run.dir={tmp_path}/again", "train.resume=false", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    import torch

    a = torch.load(run / "model_final.pth", weights_only=True)["trainer"]["iteration"]
    b = torch.load(tmp_path / "again" / "model_final.pth", weights_only=True)["trainer"]["iteration"]
    assert a == b == 19


@pytest.mark.slow
def test_two_machines_on_localhost(tmp_path):
    from lazytrain.launch.launch import find_free_port

    url = f"tcp://127.0.0.1:{find_free_port()}"
    common = [TOY, "launch.num_processes=1", "launch.num_machines=2", f"launch.dist_url={url}"]
    environment = {**os.environ, "PYTHONPATH": REPO}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lazytrain",
                *common,
                f"launch.machine_rank={m}",
                f"hydra.run.dir={tmp_path}/m{m}",
            ],
            cwd=tmp_path,
            env=environment,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0], [p.stderr.read()[-2000:] for p in procs]
    assert read_rank(tmp_path / "m0", 0)["world_size"] == 2
    assert read_rank(tmp_path / "m1", 1)["gathered"] == [0, 10]


@pytest.mark.slow
def test_torchrun_style_environment_launch(tmp_path):
    from lazytrain.launch.launch import find_free_port

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(find_free_port()),
            "-m",
            "lazytrain",
            TOY,
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_rank(tmp_path / "run", 1)["world_size"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_hydra_launchers_run_a_sweep(tmp_path, launcher):
    result = lazytrain(
        TOY,
        "-m",
        f"hydra/launcher={launcher}",
        "launch.num_processes=1",
        "train.lr=0.1,0.2",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_rank(tmp_path / "sweep" / "1", 0)["lr"] == 0.2


def test_no_hydra_or_omegaconf_warning_reaches_the_user(tmp_path):
    # Hydra 1.4 warns on any version_base and when its instantiate builds hydra.callbacks without an execution
    # allow-list, Hydra 1.3 when version_base is left out, OmegaConf 2.4 on register_new_resolver and on a
    # resolver's argument of another type than annotated (docs/hydra_versions.md; failed before on Hydra 1.4).
    result = lazytrain(TOY, f"hydra.run.dir={tmp_path}/run", "launch.num_processes=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
