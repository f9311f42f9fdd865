"""The batch settings: gradient accumulation's pass count and its preflight error, linear LR scaling, and what
the run header says of them."""

import logging
import os

import pytest
import torch
from omegaconf import OmegaConf

from lazytrain.errors import ConfigError
from lazytrain.program.batch_size import get_accumulation_steps, get_lr_scale, scale_learning_rate
from lazytrain.program.default import INJECTED_ARGUMENTS
from lazytrain.program.preflight import preflight
from lazytrain.program.primary_config import load_primary_config
from lazytrain.program.run_report import _describe_schedule

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")


def _cfg(total=16, images_per_forward=None, **auto_scale_lr):
    return OmegaConf.create(
        {
            "train": {"images_per_forward": images_per_forward, "auto_scale_lr": auto_scale_lr},
            "dataloader": {"train": {"total_batch_size": total}},
        }
    )


def test_accumulation_passes_are_the_share_of_each_process_over_images_per_forward():
    assert get_accumulation_steps(_cfg(16, 2), world_size=2) == 4
    assert get_accumulation_steps(_cfg(16, None), world_size=2) == 1
    with pytest.raises(
        ConfigError, match=r"train.images_per_forward=3 does not divide the 8 images each of the 2"
    ):
        get_accumulation_steps(_cfg(16, 3), world_size=2)


def test_preflight_names_an_accumulation_that_does_not_divide(tmp_path):
    cfg = load_primary_config(DEMO)
    cfg.train.output_dir = str(tmp_path)
    cfg.launch.num_processes = 2
    cfg.train.images_per_forward = 4  # the demo's total batch 4 gives each of 2 processes 2 images
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "train.images_per_forward=4 does not divide the 2 images each of the 2 process(es) takes per step "
        "(dataloader.train.total_batch_size=4); gradient accumulation needs 2 / images_per_forward forward "
        "passes. Set train.images_per_forward to one of [1, 2], or change dataloader.train.total_batch_size."
    ]
    cfg.train.images_per_forward = 1
    cfg.train.auto_scale_lr = {"enabled": True, "base_batch_size": 0}
    assert preflight(cfg, INJECTED_ARGUMENTS)[0].startswith(
        "train.auto_scale_lr.base_batch_size=0: must be an integer >= 1"
    )


def test_auto_scale_lr_scales_every_group_and_says_so(caplog):
    cfg = _cfg(4, enabled=True, base_batch_size=16)
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(
        [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.01}], lr=0.02
    )
    with caplog.at_level(logging.INFO, logger="lazytrain.program.batch_size"):
        scale_learning_rate(cfg, optimizer)
    assert [group["lr"] for group in optimizer.param_groups] == [0.005, 0.0025]
    assert "train.auto_scale_lr: learning rate 0.02 -> 0.005 (x 4 / 16: " in caplog.text


def test_auto_scale_lr_is_off_unless_enabled():
    assert get_lr_scale(_cfg(4, enabled=False, base_batch_size=16)) is None
    assert get_lr_scale(OmegaConf.create({"train": {}})) is None  # configs from before the key
    with pytest.raises(ConfigError, match="needs dataloader.train.total_batch_size"):
        get_lr_scale(OmegaConf.create({"train": {"auto_scale_lr": {"enabled": True, "base_batch_size": 16}}}))


def test_the_run_header_says_accumulation_scaled_lr_and_ema():
    cfg = load_primary_config(DEMO)
    cfg.dataloader.train.total_batch_size = 8
    cfg.train.images_per_forward = 2
    cfg.train.auto_scale_lr.enabled = True
    cfg.train.ema.enabled = True
    text = _describe_schedule(cfg, epoch=None)
    assert "400 iterations x 8 images, 2 per forward pass (4 passes per step and process)" in text
    assert "SGD lr 0.04 (0.02 x 8/4, auto_scale_lr)" in text
    assert "EMA decay 0.9998 (tau 2000)" in text
