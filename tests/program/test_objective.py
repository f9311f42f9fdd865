"""Search sweeps: the objective a job returns, Optuna end to end on toy configs, failed trials."""

import csv
import logging
import math
import os
import pickle

import pytest
import yaml
from omegaconf import OmegaConf

from lazytrain.errors import ConfigError
from lazytrain.program.objective import (
    FailedJobValue,
    check_objective,
    check_search,
    get_job_value,
    get_objective_value,
    get_sweeper_direction_overrides,
)
from tests.launch.test_entrypoint import ENGINE_TOY, TOY, lazytrain

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")

DEFAULT_MAIN = "lazytrain.program.default.run"


def test_objective_value_is_read_from_nested_results():
    results = {"segm": {"AP": 12.5, "APr": 3.0}, "bbox": {"AP": 10.0}}
    assert get_objective_value(results, "segm/APr") == 3.0
    assert get_objective_value(results, "segm/APx") is None
    assert get_objective_value({}, "segm/AP") is None
    assert get_objective_value({"segm": {"APl": float("nan")}}, "segm/APl") is None  # NaN would stop Optuna


def test_a_missing_metric_is_a_warning_in_a_sweep_and_quiet_in_a_single_run(caplog):
    objective = {"metric": "segm/APr", "direction": "maximize"}
    with caplog.at_level(logging.DEBUG, logger="lazytrain.program.objective"):
        assert get_job_value({}, objective, in_sweep=True) == -math.inf
        (record,) = caplog.records
        assert record.levelno == logging.WARNING and "the job returns -inf" in record.getMessage()
        caplog.clear()
        # A single run without evaluation: nothing on the console (the value is read by sweepers only).
        assert get_job_value({}, objective, in_sweep=False) == -math.inf
        assert [r.levelno for r in caplog.records] == [logging.DEBUG]
        caplog.clear()
        # A single run whose results lack it (a misspelled objective.metric): one quiet line.
        assert get_job_value({"bbox": {"AP": 1.0}}, objective, in_sweep=False) == -math.inf
        (record,) = caplog.records
        assert record.levelno == logging.INFO and "(they have: bbox/AP)" in record.getMessage()
    assert get_job_value({"segm": {"APr": 3.0}}, objective, in_sweep=False) == 3.0


def test_failed_job_value_is_the_worst_float_and_survives_pickling():
    value = pickle.loads(pickle.dumps(FailedJobValue(-math.inf, "diverged")))
    assert isinstance(value, FailedJobValue) and value == -math.inf and value.reason == "diverged"
    assert float(value) < 0.0


@pytest.mark.parametrize(
    "objective, message",
    [
        pytest.param({"metric": "APr"}, "objective.metric must name a final evaluation metric", id="no-task"),
        pytest.param(
            {"metric": "segm/AP", "direction": "up"}, "objective.direction must be one of", id="dir"
        ),
    ],
)
def test_bad_objective_is_a_config_error(objective, message):
    with pytest.raises(ConfigError, match=message):
        check_objective(objective)


def test_direction_is_passed_to_the_chosen_sweeper_unless_given():
    assert get_sweeper_direction_overrides(["hydra/sweeper=optuna"], "maximize") == [
        "hydra.sweeper.direction=maximize"
    ]
    given = ["hydra/sweeper=optuna", "hydra.sweeper.direction=minimize"]
    assert get_sweeper_direction_overrides(given, "maximize") == []
    assert get_sweeper_direction_overrides(["x=1,2"], "maximize") == []


def test_search_without_objective_or_eval_hook_is_refused():
    cfg = OmegaConf.create({"train": {"hooks": {}}})
    with pytest.raises(ConfigError, match="this config has none"):
        check_search(cfg, ["hydra/sweeper=optuna"], DEFAULT_MAIN)
    cfg.objective = {"metric": "segm/AP", "direction": "maximize"}
    with pytest.raises(ConfigError, match="train.hooks has no EvalHook"):
        check_search(cfg, ["hydra/sweeper=optuna"], DEFAULT_MAIN)
    check_search(cfg, ["x=1,2"], DEFAULT_MAIN)  # a grid sweep needs no objective


def run_lr_search(tmp_path, sweep_name, *overrides):
    """An Optuna search over the toy training's learning rate, its sweep in `tmp_path/sweep_name`."""
    return lazytrain(
        ENGINE_TOY,
        "-m",
        "hydra/sweeper=optuna",
        "optimizer.lr=interval(0.001,0.3)",
        *overrides,
        f"hydra.sweep.dir={tmp_path}/{sweep_name}",
        cwd=tmp_path,
        timeout=300,
    )


def read_trials(sweep_dir):
    """The rows of summary.csv and Optuna's optimization_results.yaml."""
    with open(os.path.join(sweep_dir, "optimization_results.yaml")) as f:
        best = yaml.safe_load(f)
    with open(os.path.join(sweep_dir, "summary.csv")) as f:
        return list(csv.DictReader(f)), best


@pytest.mark.slow
def test_optuna_searches_a_toy_training_for_the_best_objective(tmp_path):
    # The command of issue 18 on the toy training config: interval search, 3 trials, maximize toy/AP.
    result = run_lr_search(tmp_path, "sweep", "hydra.sweeper.n_trials=3", "train.max_iter=4")
    assert result.returncode == 0, result.stderr[-3000:]
    rows, best = read_trials(tmp_path / "sweep")
    assert [row["status"] for row in rows] == ["ok"] * 3
    values = [float(row["toy/AP"]) for row in rows]
    assert best["best_value"] == pytest.approx(max(values), abs=0.01)  # maximize was passed to Optuna
    assert "Best value:" in result.stdout + result.stderr


@pytest.mark.slow
def test_an_optuna_study_in_sqlite_continues_where_it_stopped(tmp_path):
    # hydra.sweeper.storage keeps the study; the same command run again adds trials to it (load_if_exists).
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    for run in (1, 2):
        result = run_lr_search(
            tmp_path,
            f"sweep{run}",
            "hydra.sweeper.n_trials=2",
            f"hydra.sweeper.storage={storage}",
            "hydra.sweeper.study_name=lr_search",
            "train.max_iter=2",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        study = optuna.load_study(study_name="lr_search", storage=storage)
        trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert len(trials) == 2 * run
    rows, _ = read_trials(tmp_path / "sweep2")
    assert sorted(float(row["toy/AP"]) for row in rows) == pytest.approx(
        sorted(t.value for t in trials[2:]), abs=0.01
    )


def test_optuna_without_the_eval_hook_fails_before_any_job(tmp_path):
    result = run_lr_search(tmp_path, "sweep", "~train.hooks.eval")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "train.hooks has no EvalHook (removed with ~train.hooks.eval?)" in result.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_objective_of_two_process_jobs_reaches_optuna(tmp_path):
    # record_ranks returns {"bbox": {"AP": train.lr}} on rank 0 of 2 spawned processes.
    result = lazytrain(
        TOY,
        "-m",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=grid",
        "train.lr=choice(0.25,0.75)",
        "+objective.metric=bbox/AP",
        "+objective.direction=minimize",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, best = read_trials(tmp_path / "sweep")
    assert best["best_value"] == 0.25 and best["best_params"] == {"train.lr": 0.25}


@pytest.mark.slow
def test_a_diverging_trial_does_not_stop_the_search(tmp_path):
    result = lazytrain(
        ENGINE_TOY,
        "-m",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=grid",
        "+model.nan_at_call=choice(1,-1)",  # the first trial's loss is NaN at its first step
        "train.max_iter=3",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows, best = read_trials(tmp_path / "sweep")
    assert sorted(row["status"] for row in rows) == ["failed", "ok"]
    assert best["best_params"] == {"+model.nan_at_call": -1} and best["best_value"] > 90
    assert "1 of 2 trials failed" in result.stdout + result.stderr
