"""A resumed run and its tracker run: an evaluation a signal stopped reaches the tracker when the resumed run
does it again, and the run id survives a resume whose store did not answer (real MLflow, W&B offline)."""

import json
import logging
import os
import signal

import mlflow
import pytest
from pytest import param

from lazytrain.engine.trackers.mlflow import MLflowTracker
from lazytrain.program.default import run
from lazytrain.utils.preemption import TrainingInterrupted
from tests.engine.test_trackers import (  # noqa: F401  (the fixture keeps this machine's settings out)
    _no_tracker_settings,
    make_run_dir,
    mlflow_history,
    read_wandb_run,
    train_toy,
)
from tests.engine.test_trackers_failures import break_store, make_store, mend_store

TRACKERS = {
    "mlflow": "lazytrain.engine.trackers.mlflow.MLflowTracker",
    "wandb": "lazytrain.engine.trackers.wandb.WandbTracker",
}


def stop_during_evaluation(iteration):
    """A hook sending SIGTERM to this process at the first image of the evaluation of `iteration`."""
    function = {
        "_target_": "lazytrain.config.locate",
        "_args_": ["tests.engine.toy.signal_during_evaluation"],
    }
    callback = {"_target_": "functools.partial", "_args_": [function], "iteration": iteration}
    return {
        "_target_": "lazytrain.engine.hooks.CallbackHook",
        "before_train": {**callback, "signum": int(signal.SIGTERM)},
    }


def evaluated_iterations(run_dir):
    lines = map(json.loads, open(os.path.join(run_dir, "metrics.json")).read().splitlines())
    return {line["iteration"]: line["toy/AP"] for line in lines if "toy/AP" in line}


@pytest.mark.parametrize("kind", [param("mlflow", id="mlflow"), param("wandb", id="wandb-offline")])
def test_an_evaluation_stopped_by_a_signal_reaches_the_tracker_after_resume(toy_cfg, kind):
    """Stopped during the evaluation of iteration 9 (after the tracker logged 9's losses): the resumed run
    evaluates 9 first and the tracker gets that evaluation at step 9, beside the later ones."""
    toy_cfg.train.eval_period = 10
    toy_cfg.train.hooks.tracker = {
        "_target_": TRACKERS[kind],
        "output_dir": "${train.output_dir}",
        "period": 5,
    }
    if kind == "mlflow":
        toy_cfg.train.hooks.tracker.tracking_uri = make_store(toy_cfg.train.output_dir)
    toy_cfg.train.hooks.stop = stop_during_evaluation(9)
    with pytest.raises(TrainingInterrupted):
        run(toy_cfg)
    assert evaluated_iterations(toy_cfg.train.output_dir) == {}
    del toy_cfg.train.hooks.stop
    toy_cfg.train.resume = True
    run(toy_cfg)

    evaluated = evaluated_iterations(toy_cfg.train.output_dir)
    assert sorted(evaluated) == [9, 19, 30]  # the abandoned one first, then the periodic and final ones
    if kind == "mlflow":
        client = mlflow.MlflowClient(toy_cfg.train.hooks.tracker.tracking_uri)
        (tracked,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
        history = mlflow_history(client, tracked.info.run_id)
        assert "total_loss" in history[9] and tracked.info.status == "FINISHED"
    else:
        (_, _, before, _, _), (_, _, after, _, _) = read_wandb_run(toy_cfg.train.output_dir)
        history = {**before, **{step: {**before.get(step, {}), **values} for step, values in after.items()}}
    assert {step: values["toy/AP"] for step, values in history.items() if "toy/AP" in values} == evaluated


def test_the_run_id_survives_a_resume_whose_store_did_not_answer(tmp_path, caplog):
    run_dir = make_run_dir(tmp_path / "run")
    make_store(run_dir)
    first = MLflowTracker(str(run_dir), period=2)
    train_toy(run_dir, first, max_iter=4)

    # Resumed while the store is down: the run cannot be reopened, the run id and the metrics stay hook state.
    break_store("replaced-by-a-folder", str(run_dir))
    second = MLflowTracker(str(run_dir), period=2, timeout=2.0)
    second.load_state_dict(first.state_dict())
    with caplog.at_level(logging.INFO, logger="lazytrain.engine.trackers"):
        train_toy(run_dir, second, max_iter=8, start_iter=4)
    assert "MLflowTracker: starting the run failed" in caplog.text and second.run_id is None
    state = second.state_dict()  # what the next checkpoint saves
    assert state["run_id"] == first.run_id
    assert [step for step, _ in state["unsent"]] == [5, 7, 8]

    # The next resume, with the store back, reopens the same run and sends what the last one could not.
    mend_store(str(run_dir))
    third = MLflowTracker(str(run_dir), period=2)
    third.load_state_dict(state)
    train_toy(run_dir, third, max_iter=10, start_iter=8)
    assert third.run_id == first.run_id
    client = mlflow.MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    assert len(client.search_runs([client.get_run(first.run_id).info.experiment_id])) == 1
    history = mlflow_history(client, first.run_id)
    assert sorted(history) == [1, 3, 4, 5, 7, 8, 9, 10]
    assert history[8] == {"toy/AP": 58.0} and history[10] == {"toy/AP": 60.0}
