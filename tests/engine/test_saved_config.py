"""The config.yaml a run saves: fed back as CONFIG, it does not write into the old run's directory; a resumed run
replaces it only once it has trained a step."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.program.default import default_setup, run


def test_saved_config_points_paths_derived_from_output_dir_at_the_new_run(tmp_path):
    run_dir = str(tmp_path / "runs" / "a")
    cfg = OmegaConf.create(
        {
            "train": {"output_dir": run_dir, "seed": 0, "hooks": {"writer": {"output_dir": run_dir}}},
            "dataloader": {"evaluator": {"output_dir": run_dir, "json": f"{run_dir}/inference/results.json"}},
            "other": {"path": f"{run_dir}_elsewhere", "list": [run_dir, 3]},
        }
    )
    default_setup(cfg)
    saved = LazyConfig.load(f"{run_dir}/config.yaml")
    saved.train.output_dir = str(tmp_path / "runs" / "b")  # what the entrypoint does with a new job directory
    assert saved.train.hooks.writer.output_dir == str(tmp_path / "runs" / "b")
    assert saved.dataloader.evaluator.json == str(tmp_path / "runs" / "b" / "inference" / "results.json")
    assert saved.other.list[0] == str(tmp_path / "runs" / "b")
    assert saved.other.path == f"{run_dir}_elsewhere"  # only the directory itself and paths under it
    assert cfg.train.hooks.writer.output_dir == run_dir  # the running config is unchanged


@pytest.mark.parametrize(
    "override, error",
    [
        pytest.param("optimizer.lr=-1", "Invalid learning rate", id="setup-fails"),
        pytest.param("dataloader.train.dim=5", "running_mean should contain", id="first-step-fails"),
    ],
)
def test_a_resume_that_fails_before_its_first_step_leaves_the_run_folder_as_it_was(toy_cfg, override, error):
    """config.yaml says what trained: a resumed run's changed config replaces it (keeping the earlier one as
    config.before_resume_N.yaml) only once a step has run on it; a resume that fails before leaves both as they
    were, so that a plain train.resume=true continues the run again."""
    toy_cfg.train.max_iter = 2
    run(toy_cfg)
    run_dir = Path(toy_cfg.train.output_dir)
    first = (run_dir / "config.yaml").read_bytes()
    failing = LazyConfig.apply_overrides(toy_cfg.copy(), ["train.resume=true", "train.max_iter=4", override])
    with pytest.raises((ValueError, RuntimeError), match=error):
        run(failing)
    assert (run_dir / "config.yaml").read_bytes() == first
    assert sorted(p.name for p in run_dir.glob("config*")) == ["config.yaml"]

    run(LazyConfig.apply_overrides(toy_cfg.copy(), ["train.resume=true", "train.max_iter=4"]))
    assert (run_dir / "config.before_resume_1.yaml").read_bytes() == first
    assert LazyConfig.load(str(run_dir / "config.yaml")).train.max_iter == 4
