"""The config.yaml a run saves can be fed back as CONFIG without writing into the old run's directory."""

from omegaconf import OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.program.default import default_setup


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
