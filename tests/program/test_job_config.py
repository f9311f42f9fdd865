"""A job run again by its launcher (SLURM requeue, torchrun restart) resumes (faked environments)."""

import logging

import pytest
from omegaconf import OmegaConf

from lazytrain.program.job_config import resume_if_requeued

RESTART_VARIABLES = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def environment(monkeypatch):
    for variable in RESTART_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    # A run in this session (`setup_logger`) may have stopped the library logger propagating to caplog's handler.
    monkeypatch.setattr(logging.getLogger("lazytrain"), "propagate", True)
    return monkeypatch


@pytest.mark.parametrize(
    "variable, message",
    [
        pytest.param("SLURM_RESTART_COUNT", "Requeued SLURM job (SLURM_RESTART_COUNT=2)", id="slurm-requeue"),
        pytest.param(
            "TORCHELASTIC_RESTART_COUNT",
            "Restarted torchrun workers (TORCHELASTIC_RESTART_COUNT=2)",
            id="torchrun-restart",
        ),
    ],
)
def test_a_restarted_job_resumes_with_a_warning(environment, caplog, variable, message):
    environment.setenv(variable, "2")
    cfg = OmegaConf.create({"train": {"resume": False}})
    with caplog.at_level(logging.WARNING, logger="lazytrain.program.job_config"):
        resume_if_requeued(cfg)
    assert cfg.train.resume is True
    assert [record.getMessage() for record in caplog.records] == [
        f"{message}: resuming from the last checkpoint (train.resume=true)."
    ]


@pytest.mark.parametrize(
    "environment_values",
    [
        pytest.param({}, id="no-launcher"),
        pytest.param({"SLURM_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "0"}, id="first-run"),
        pytest.param({"TORCHELASTIC_RESTART_COUNT": ""}, id="empty"),
    ],
)
def test_a_first_run_starts_as_told(environment, caplog, environment_values):
    for variable, value in environment_values.items():
        environment.setenv(variable, value)
    cfg = OmegaConf.create({"train": {"resume": False}})
    resume_if_requeued(cfg)
    assert cfg.train.resume is False and not caplog.records


def test_a_restart_of_a_job_told_to_resume_says_nothing(environment, caplog):
    environment.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    cfg = OmegaConf.create({"train": {"resume": True}})
    resume_if_requeued(cfg)
    assert cfg.train.resume is True and not caplog.records
