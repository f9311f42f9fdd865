"""Experiment trackers (lazytrain.engine.trackers) with the real libraries, nothing reaching the internet: MLflow
on SQLite files under tmp_path, W&B offline (its run file read back). Most tests drive the hooks with the toy
trainer; one runs the shortened demo recipe with the MLflow tracker added from the command line."""

import glob
import importlib.util
import io
import json
import os
import time

import mlflow  # the [test] extra installs both libraries: these tests use the real ones
import pytest
import torch
import yaml
from pytest import param

from lazytrain.config import LazyConfig
from lazytrain.engine.hooks import CallbackHook, EvalHook, PeriodicWriter
from lazytrain.engine.trackers import base as tracker_base
from lazytrain.engine.trackers.mlflow import MLflowTracker
from lazytrain.engine.trackers.wandb import WandbTracker
from lazytrain.engine.train_loop import SimpleTrainer
from lazytrain.program.default import run
from lazytrain.utils.run_dirs import read_metrics
from tests.engine import toy
from tests.smoke import TINY_SYNTHETIC_LT, smoke_overrides
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _no_tracker_settings(monkeypatch, tmp_path):
    """No setting of the developer's machine reaches a test; W&B can only write files."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory):
    """One SQLite store for the tests that name it (creating a store's tables takes a second)."""
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def train_toy(
    run_dir,
    tracker,
    max_iter=6,
    start_iter=0,
    fail_at=None,
    extra_hooks=None,
    before_tracker=False,
    evaluate=True,
):
    """Train the toy model with an evaluation every 4 iterations, metrics.json every 2, then `tracker`
    (`extra_hooks` after it, or before it with `before_tracker`)."""
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    hooks = {}
    if evaluate:
        hooks["eval"] = EvalHook(eval_period=4, eval_function=lambda: {"toy": {"AP": 50.0 + trainer.iter}})
    hooks["writer"] = PeriodicWriter(str(run_dir), period=2, tensorboard=False)
    extra = dict(extra_hooks or {})
    if fail_at is not None:

        def fail(t):
            if t.iter == fail_at:
                raise RuntimeError("boom")

        extra["fail"] = CallbackHook(after_step=fail)
    hooks.update({**extra, "tracker": tracker} if before_tracker else {"tracker": tracker, **extra})
    trainer.register_hooks(hooks)
    trainer.train(start_iter, max_iter)
    return trainer


def make_run_dir(path, overrides=()):
    """A run directory as the program leaves it before training: config.yaml, a plot, a CSV."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = LazyConfig.load(os.path.join(REPO, "tests", "engine", "toy_config.py"))
    cfg.train.output_dir = "./output"
    LazyConfig.save(cfg, path / "config.yaml")
    (path / "curves.png").write_bytes(b"\x89PNG fake")
    (path / "lvis_per_category_ap.csv").write_text("id,name\n1,a\n")
    if overrides:
        (path / ".hydra").mkdir()
        (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    return path


def metric_lines(run_dir):
    """metrics.json as {iteration: {name: value}}."""
    return {
        record["iteration"]: {k: v for k, v in record.items() if k != "iteration"}
        for record in read_metrics(str(run_dir))
    }


def mlflow_history(client, run_id):
    """{step: {name: value}} of every metric of an MLflow run."""
    history = {}
    for key in client.get_run(run_id).data.metrics:
        for metric in client.get_metric_history(run_id, key):
            history.setdefault(metric.step, {})[key] = metric.value
    return history


def test_mlflow_logs_params_the_metrics_json_values_and_files(tmp_path, store_uri):
    run_dir = make_run_dir(tmp_path / "run")
    tracker = MLflowTracker(str(run_dir), period=2, tracking_uri=store_uri, experiment_name="toy")
    train_toy(run_dir, tracker)

    client = mlflow.MlflowClient(store_uri)
    finished = client.get_run(tracker.run_id)
    assert finished.info.status == "FINISHED" and finished.info.run_name == "run"
    assert client.get_experiment(finished.info.experiment_id).name == "toy"
    params = finished.data.params
    assert params["train.max_iter"] == "30" and params["model.dim"] == "4"
    assert params["train.output_dir"] == str(run_dir)  # the run's own directory, not the saved ./output
    assert params["train.hooks.eval.eval_period"] == "0"  # resolved from ${train.eval_period}
    mlflow_metrics = mlflow_history(client, tracker.run_id)
    written = metric_lines(run_dir)
    assert sorted(mlflow_metrics) == sorted(written) == [1, 3, 5, 6]  # every 2 iterations, final eval at 6
    for step, values in written.items():
        assert mlflow_metrics[step] == pytest.approx(values)
    assert mlflow_metrics[6] == {"toy/AP": 56.0}
    artifacts = {entry.path for entry in client.list_artifacts(tracker.run_id)}
    assert artifacts == {"config.yaml", "curves.png", "lvis_per_category_ap.csv", "metrics.json"}
    store_dir = os.path.dirname(store_uri[len("sqlite:///") :])
    assert tracker.run_id in os.listdir(
        os.path.join(store_dir, "mlruns")
    )  # beside the store, not in ./mlruns


def make_sweep_job(sweep_dir, number, seed):
    """A job directory as a Hydra sweep leaves it: ``.hydra/hydra.yaml`` (MULTIRUN) and its overrides."""
    job_dir = make_run_dir(sweep_dir / str(number), overrides=[f"train.seed={seed}"])
    hydra = {
        "hydra": {
            "mode": "MULTIRUN",
            "sweep": {"dir": "multirun/${now:%H-%M-%S}", "subdir": "${hydra.job.num}"},
            "job": {"name": "toy_config", "num": number},
        }
    }
    (job_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    return job_dir


def test_a_sweeps_jobs_are_runs_of_one_experiment_named_after_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep_dir = tmp_path / "multirun" / "10-00-00"
    run_ids = []
    for number in (0, 1):
        job_dir = make_sweep_job(sweep_dir, number, seed=number)
        tracker = MLflowTracker(str(job_dir), period=2)
        train_toy(job_dir, tracker, max_iter=2)
        run_ids.append(tracker.run_id)
    client = mlflow.MlflowClient(f"sqlite:///{sweep_dir}/mlflow.db")  # one store for the sweep, no server
    runs = [client.get_run(run_id) for run_id in run_ids]
    assert len({r.info.experiment_id for r in runs}) == 1
    assert client.get_experiment(runs[0].info.experiment_id).name == "multirun/10-00-00"
    assert [r.info.run_name for r in runs] == ["0 train.seed=0", "1 train.seed=1"]
    assert [r.data.tags["lazytrain.output_dir"] for r in runs] == [str(sweep_dir / "0"), str(sweep_dir / "1")]
    assert sorted(os.listdir(sweep_dir / "mlruns")) == sorted(run_ids)  # artifacts beside the store
    assert sorted(os.listdir(tmp_path)) == ["multirun"]  # nothing in the working directory


def test_resume_reopens_the_same_mlflow_run_without_repeating_steps(toy_cfg, store_uri):
    toy_cfg.train.max_iter = 7
    toy_cfg.train.checkpointer.period = 4
    toy_cfg.train.hooks.mlflow = {
        "_target_": "lazytrain.engine.trackers.mlflow.MLflowTracker",
        "output_dir": "${train.output_dir}",
        "period": "${train.log_period}",
        "tracking_uri": store_uri,
    }
    run(toy_cfg)  # metrics logged at 4 and 6 (log_period 5, final 6), the last checkpoint at iteration 3
    os.remove(os.path.join(toy_cfg.train.output_dir, "model_final.pth"))
    with open(os.path.join(toy_cfg.train.output_dir, "last_checkpoint"), "w") as f:
        f.write("model_0000003.pth")
    state = torch.load(os.path.join(toy_cfg.train.output_dir, "model_0000003.pth"), weights_only=True)
    run_id = state["trainer"]["hooks"]["mlflow"]["run_id"]
    toy_cfg.train.resume = True
    toy_cfg.train.max_iter = 12
    run(toy_cfg)  # resumes at 4: steps 4 and 6 are in the run already, 9 and 11 are new, eval at 12

    client = mlflow.MlflowClient(store_uri)
    runs = client.search_runs([client.get_run(run_id).info.experiment_id])
    of_this_dir = [
        r.info.run_id for r in runs if r.data.tags["lazytrain.output_dir"] == toy_cfg.train.output_dir
    ]
    assert of_this_dir == [run_id]
    steps = [m.step for m in client.get_metric_history(run_id, "total_loss")]
    assert steps == [4, 6, 9, 11]
    assert [m.step for m in client.get_metric_history(run_id, "toy/AP")] == [7, 12]
    assert client.get_run(run_id).info.status == "FINISHED"


def read_wandb_records(path):
    """The records of a W&B run file (``run-ID.wandb``): W&B's header, then LevelDB-log blocks of 32 KiB
    whose chunks (7-byte header: checksum, length, type 1 full / 2 first / 3 middle / 4 last) hold protobuf
    ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
        pending += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def read_items(items):
    """{key: value} of W&B record items (a key is ``key``, or ``nested_key`` in newer files)."""
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_wandb_run(run_dir):
    """(run record, config, {step: metrics}, summary, saved files) of each offline W&B run under `run_dir`,
    oldest first."""
    runs = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        run_record, config, history, summary, files = None, {}, {}, {}, set()
        for record in read_wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_record = record.run
                config.update(read_items(record.run.config.update))
            elif kind == "config":
                config.update(read_items(record.config.update))
            elif kind == "history":
                items = read_items(record.history.item)
                history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
            elif kind == "summary":
                summary.update(read_items(record.summary.update))
            elif kind == "files":
                files.update(item.path for item in record.files.files)
        runs.append((run_record, config, history, summary, files))
    return runs


def wandb_core_children():
    """Processes of W&B's service started by this process."""
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
            command = open(stat.replace("stat", "cmdline"), "rb").read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"wandb" in command:
            children.append(command)
    return children


def test_wandb_offline_run_has_the_config_metrics_and_files(tmp_path):
    run_dir = make_run_dir(tmp_path / "run", overrides=["train.seed=1"])
    tracker = WandbTracker(str(run_dir), period=2, project="toy")
    train_toy(run_dir, tracker)

    ((run_record, config, history, summary, files),) = read_wandb_run(run_dir)
    assert run_record.run_id == tracker.run_id and run_record.project == "toy"
    assert run_record.display_name == "run train.seed=1"
    assert config["train.max_iter"] == 30 and config["train.output_dir"] == str(run_dir)
    written = metric_lines(run_dir)
    assert sorted(history) == sorted(written) == [1, 3, 5, 6]
    for step, values in written.items():
        assert history[step] == pytest.approx(values)
    assert summary["toy/AP"] == 56.0
    assert {"config.yaml", "curves.png", "lvis_per_category_ap.csv", "metrics.json"} <= files
    (files_dir,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "files"))
    assert open(os.path.join(files_dir, "metrics.json")).read() == open(run_dir / "metrics.json").read()
    assert wandb_core_children() == []  # finish and teardown at after_train: W&B's service is gone


def test_wandb_resume_continues_the_same_run_id_and_a_sweep_is_a_group(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job_dir = make_sweep_job(tmp_path / "sweep", 0, seed=0)
    first = WandbTracker(str(job_dir), period=2)
    train_toy(job_dir, first, max_iter=4)
    time.sleep(
        1.01 - time.time() % 1
    )  # offline folders are named by the second: a resumed run never shares it
    resumed = WandbTracker(str(job_dir), period=2)
    resumed.load_state_dict(first.state_dict())
    train_toy(job_dir, resumed, max_iter=8, start_iter=4)

    assert resumed.run_id == first.run_id
    (run_a, _, history_a, _, _), (run_b, _, history_b, _, _) = read_wandb_run(job_dir)
    assert run_a.run_id == run_b.run_id == first.run_id
    assert run_a.run_group == "sweep" and run_a.project == "toy_config"
    assert sorted(history_a) == [1, 3, 4] and sorted(history_b) == [5, 7, 8]


@pytest.mark.parametrize(
    "environment, netrc_host, expected",
    [
        param({}, None, "offline", id="no-credentials"),
        param({"WANDB_API_KEY": "x" * 40}, None, "online", id="api-key"),
        param({}, "api.wandb.ai", "online", id="wandb-login"),
        param({"WANDB_BASE_URL": "https://wandb.example.org"}, "api.wandb.ai", "offline", id="other-host"),
        param({"WANDB_MODE": "disabled"}, None, None, id="WANDB_MODE-decides"),
    ],
)
def test_wandb_mode_is_offline_without_credentials(tmp_path, monkeypatch, environment, netrc_host, expected):
    monkeypatch.delenv("WANDB_MODE")
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text(f"machine {netrc_host} login user password {'k' * 40}\n" if netrc_host else "")
    monkeypatch.setenv("NETRC", str(netrc_file))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert WandbTracker(str(tmp_path)).get_mode() == expected
    assert WandbTracker(str(tmp_path), mode="disabled").get_mode() == "disabled"


@pytest.mark.parametrize("factory", [param(MLflowTracker, id="mlflow"), param(WandbTracker, id="wandb")])
def test_tracker_hook_contract(tmp_path, store_uri, factory):
    """Survives an exception mid-run (the tracker run is closed as failed); state is weights-only data."""
    kwargs = {"tracking_uri": store_uri} if factory is MLflowTracker else {}
    tracker = factory(str(make_run_dir(tmp_path / "run")), period=2, **kwargs)
    with pytest.raises(RuntimeError, match="boom"):
        train_toy(tmp_path / "run", tracker, fail_at=2)
    buffer = io.BytesIO()
    torch.save(tracker.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == {"run_id": tracker.run_id}
    if factory is MLflowTracker:
        assert mlflow.MlflowClient(store_uri).get_run(tracker.run_id).info.status == "FAILED"
    else:
        history = read_wandb_run(tmp_path / "run")[0][2]
        assert sorted(history) == [1, 2]  # after_train sends what iteration 2 put before it failed


def test_only_the_main_process_tracks(tmp_path, monkeypatch):
    monkeypatch.setattr(tracker_base.comm, "is_main_process", lambda: False)
    run_dir = make_run_dir(tmp_path / "run")
    tracker = MLflowTracker(str(run_dir), period=2)
    train_toy(run_dir, tracker, max_iter=2)
    assert tracker.run_id is None and tracker.state_dict() == {}
    assert not os.path.exists(run_dir / "mlflow.db")


@pytest.mark.parametrize(
    "make, message",
    [
        param(
            lambda d: MLflowTracker(d, period=0),
            r"MLflowTracker\(period=\) must be an int > 0; got 0",
            id="period",
        ),
        param(
            lambda d: MLflowTracker(""),
            r"MLflowTracker\(output_dir=\) must be the run directory",
            id="output_dir",
        ),
        param(lambda d: WandbTracker(d, artifacts="*.png"), r"artifacts=\) must be a list", id="artifacts"),
        param(
            lambda d: MLflowTracker(d, timeout=0),
            r"MLflowTracker\(timeout=\) must be a number of seconds > 0; got 0",
            id="timeout",
        ),
        param(
            lambda d: WandbTracker(d, retry_for="1h"),
            r"WandbTracker\(retry_for=\) must be a number",
            id="retry_for",
        ),
        param(
            lambda d: WandbTracker(d, mode="dryrun"),
            r"WandbTracker\(mode=\) must be one of 'online', 'offline', 'disabled' .*got 'dryrun'",
            id="mode",
        ),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path, make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make(str(tmp_path))


@pytest.mark.parametrize(
    "make, missing, extra",
    [
        param(lambda d: MLflowTracker(d), "sqlalchemy", "mlflow", id="mlflow"),
        param(lambda d: WandbTracker(d), "wandb", "wandb", id="wandb"),
    ],
)
def test_a_missing_package_names_the_extra_at_construction(tmp_path, monkeypatch, make, missing, extra):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == missing else find_spec(name)
    )
    with pytest.raises(
        ModuleNotFoundError, match=rf"needs '{missing}', .*pip install \"lazytrain\[{extra}\]\""
    ):
        make(str(tmp_path))


@pytest.mark.slow
def test_demo_recipe_with_mlflow_from_the_command_line(tmp_path):
    """The shortened demo with ``+train.hooks.mlflow=...``: params, metrics and files in RUN/mlflow.db."""
    from lazytrain.data.datasets.synthetic import generate_synthetic_lt

    generate_synthetic_lt(str(tmp_path / "datasets" / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    run_dir = tmp_path / "run"
    hook = (
        "+train.hooks.mlflow={_target_: lazytrain.engine.trackers.mlflow.MLflowTracker, "
        "output_dir: ${train.output_dir}, period: ${train.log_period}}"
    )
    env = {
        **os.environ,
        "LAZYTRAIN_DATASETS": str(tmp_path / "datasets"),
        "PYTHONPATH": REPO,
        "OMP_NUM_THREADS": "1",
    }
    arguments = ["conf/rfs_maskrcnn_demo.py", *smoke_overrides(), hook, f"hydra.run.dir={run_dir}"]
    result = run_warm(arguments, REPO, env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MLflowTracker: run " in result.stdout and "  mlflow.db  " in result.stdout  # the closing block

    client = mlflow.MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "rfs_maskrcnn_demo"]
    (finished,) = client.search_runs([experiment.experiment_id])
    assert finished.info.status == "FINISHED"
    assert finished.info.run_name == " ".join(["run", *smoke_overrides()])[:200]  # the hook override left out
    assert finished.data.params["model.num_classes"] == "30"
    assert finished.data.params["dataloader.train.sampler.repeat_thresh"] == "0.3"
    history = mlflow_history(client, finished.info.run_id)
    written = metric_lines(run_dir)
    assert sorted(history) == sorted(written) == [0, 1, 2]  # log_period 1, the final evaluation at 2
    for step, values in written.items():
        assert history[step] == pytest.approx(values, nan_ok=True)
    assert "segm/APr" in history[2] and "total_loss" in history[1]
    artifacts = {entry.path for entry in client.list_artifacts(finished.info.run_id)}
    assert {"curves.png", "ap_by_frequency.png", "lvis_per_category_ap.csv", "metrics.json"} <= artifacts
