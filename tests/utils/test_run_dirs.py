import os

import pytest
import yaml
from pytest import param

from lazytrain.utils.run_dirs import HydraJob, read_hydra_job


def write_hydra_yaml(run_dir, mode, subdir="${hydra.job.num}", num=3):
    """``.hydra/hydra.yaml`` as Hydra writes it: ``sweep.dir`` unresolved (``${now:...}``), job facts resolved."""
    os.makedirs(os.path.join(run_dir, ".hydra"))
    hydra = {
        "hydra": {
            "mode": mode,
            "sweep": {"dir": "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}", "subdir": subdir},
            "job": {"name": "rfs_maskrcnn_demo", "num": num, "override_dirname": "train.seed=1"},
        }
    }
    with open(os.path.join(run_dir, ".hydra", "hydra.yaml"), "w") as f:
        yaml.safe_dump(hydra, f)


@pytest.mark.parametrize(
    "mode, subdir, job_path, sweep_path",
    [
        param("RUN", "${hydra.job.num}", "outputs/10-00-00", None, id="single-run"),
        param("MULTIRUN", "${hydra.job.num}", "multirun/10-00-00/3", "multirun/10-00-00", id="sweep"),
        param(
            "MULTIRUN",
            "seeds/${hydra.job.override_dirname}",
            "sw/seeds/train.seed=1",
            "sw",
            id="nested-subdir",
        ),
        param("MULTIRUN", "${now:%H}", "sw/x", "sw", id="subdir-not-resolvable-here"),
    ],
)
def test_read_hydra_job_finds_the_job_name_and_sweep_dir(tmp_path, mode, subdir, job_path, sweep_path):
    run_dir = tmp_path / job_path
    write_hydra_yaml(str(run_dir), mode, subdir)
    sweep_dir = str(tmp_path / sweep_path) if sweep_path else None
    assert read_hydra_job(str(run_dir)) == HydraJob("rfs_maskrcnn_demo", sweep_dir)


def test_read_hydra_job_is_none_without_hydra(tmp_path):
    assert read_hydra_job(str(tmp_path)) is None
    os.makedirs(tmp_path / ".hydra")
    (tmp_path / ".hydra" / "hydra.yaml").write_text("not: [hydra")
    assert read_hydra_job(str(tmp_path)) is None
