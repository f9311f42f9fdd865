"""The closing block of a run: what it says without an evaluation, and what it says about experiment
trackers (what each holds, the files they left, a W&B offline folder deleted mid-run). The demo run's header
and closing block are tested in tests/engine/test_run_report.py."""

import glob
import logging
import os
import re
import shutil

from omegaconf import OmegaConf

from lazytrain.engine.hooks import CallbackHook
from lazytrain.engine.trackers.wandb import WandbTracker
from lazytrain.program.run_report import format_run_summary
from tests.engine.test_trackers import (  # noqa: F401  (the fixture keeps this machine's settings out)
    _no_tracker_settings,
    make_run_dir,
    train_toy,
)
from tests.launch.test_entrypoint import ENGINE_TOY, lazytrain


def summary_of(run_dir, trainer):
    cfg = OmegaConf.create({"train": {"output_dir": str(run_dir)}})
    return format_run_summary(cfg, trainer, 1.0)


def test_a_run_without_evaluation_ends_without_talk_of_evaluation(tmp_path):
    run_dir = tmp_path / "run"
    result = lazytrain(
        ENGINE_TOY, "~train.hooks.eval", "train.max_iter=2", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert re.search(
        r"Done: 2 iterations in 0:00:\d\d \(wall time\)(, \d+\.\d\d s/it over 2 iterations)?; no evaluation",
        output,
    )
    assert "with evaluation" not in output and "Final evaluation" not in output
    # The config's objective (toy/AP) is for sweeps: a single run without evaluation does not mention it.
    assert "objective.metric" not in output and "-inf" not in output


def test_the_report_names_the_wandb_folder_and_the_command_that_uploads_it(tmp_path):
    run_dir = make_run_dir(tmp_path / "run")
    tracker = WandbTracker(str(run_dir), period=2)
    summary = summary_of(run_dir, train_toy(run_dir, tracker, max_iter=2))
    (folder,) = glob.glob(str(run_dir / "wandb" / "offline-run-*"))
    relative = os.path.relpath(folder, run_dir)
    assert (
        f"\n  WandbTracker  offline run {tracker.run_id} in {folder} (upload it: wandb sync {folder}): "
        in summary
    )
    assert "config, metrics of 2 logged iterations, 4 files\n" in summary
    assert re.search(
        rf"\n  wandb/ +W&B's offline run \({relative}\): upload it with wandb sync {folder}\n", summary
    )


def test_a_wandb_offline_folder_deleted_mid_run_is_one_line_and_reported(
    tmp_path, caplog, capfd, monkeypatch
):
    monkeypatch.delenv("WANDB_SILENT")  # W&B's own closing lines would name the deleted folder
    run_dir = make_run_dir(tmp_path / "run")
    tracker = WandbTracker(str(run_dir), period=2)
    deleter = CallbackHook(after_step=lambda t: shutil.rmtree(run_dir / "wandb") if t.iter == 2 else None)
    with caplog.at_level(logging.INFO, logger="lazytrain.engine.trackers"):
        trainer = train_toy(
            run_dir, tracker, max_iter=4, extra_hooks={"deleter": deleter}, before_tracker=True
        )
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("WandbTracker: gave up after 1 attempt") and "\n" not in warning
    assert (
        "(logging metrics: TrackingLost: the offline run folder " in warning
        and "was deleted during the run" in warning
    )
    summary = summary_of(run_dir, trainer)
    assert f"\n  WandbTracker  INCOMPLETE, offline run {tracker.run_id}, whose folder " in summary
    assert "metrics of 1 of 3 logged iterations sent, 2 not" in summary
    assert "wandb sync" not in summary + capfd.readouterr().err  # no command pointing at nothing


def test_a_resumed_run_with_nothing_left_to_train_gives_no_speed(tmp_path):
    run_dir = tmp_path / "run"
    args = (ENGINE_TOY, "~train.hooks.eval", "train.max_iter=2", f"hydra.run.dir={run_dir}")
    assert lazytrain(*args, cwd=tmp_path).returncode == 0
    result = lazytrain(*args, "train.resume=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Done: no iteration left to train (resumed at 2)" in output, output[-2000:]
    assert "s/it" not in output.split("Done:")[-1].splitlines()[0]


def test_a_resume_with_another_config_says_what_changed_and_keeps_the_earlier_config(tmp_path):
    run_dir = tmp_path / "run"
    args = (ENGINE_TOY, "~train.hooks.eval", f"hydra.run.dir={run_dir}")
    assert lazytrain(*args, "train.max_iter=2", cwd=tmp_path).returncode == 0
    first = (run_dir / "config.yaml").read_text()
    result = lazytrain(*args, "train.max_iter=4", "train.resume=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "differs from the one it started with" in output and "train.max_iter: 2 -> 4" in output
    assert (run_dir / "config.before_resume_1.yaml").read_text() == first
    assert "max_iter: 4" in (run_dir / "config.yaml").read_text()


def test_the_header_gives_a_mixture_samplers_shares_per_source():
    from types import SimpleNamespace

    from lazytrain.data.mixture_sampler import MixtureTrainingSampler
    from lazytrain.program.run_report import _describe_sampler

    sampler = MixtureTrainingSampler([10, 30], ratios=[1, 3], total_batch_size=8, rank=0, world_size=1)
    loader = SimpleNamespace(batch_sampler=SimpleNamespace(sampler=sampler))
    line, epoch = _describe_sampler(OmegaConf.create({}), loader)
    assert line == "MixtureTrainingSampler: 2/6 images per step (all ranks) from sources of 10/30 images"
    assert epoch is None
