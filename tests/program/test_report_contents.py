"""What the run header and the closing block say about a run's settings: a mixture's sources by name with their
shares, Copy-Paste, activation checkpointing, a warm-up longer than the run, AP-fixed and AP-pool."""

from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

from lazytrain.config import LazyCall as L
from lazytrain.data.copy_paste import CopyPaste
from lazytrain.data.datasets.custom import register_json_dataset
from lazytrain.data.mixture_sampler import MixtureTrainingSampler
from lazytrain.engine.hooks import LRScheduler
from lazytrain.engine.lr_schedule import WarmupCosineMultiplier
from lazytrain.modeling.checkpointing import checkpoint_blocks
from lazytrain.program.run_report import (
    find_short_warmup,
    format_eval_header,
    format_run_header,
    format_run_summary,
)
from lazytrain.utils.events import EventStorage


def _lines_by_field(text):
    return {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()[1:]}


def test_the_header_names_a_mixtures_sources_copy_paste_and_activation_checkpointing():
    mine = L(register_json_dataset)(name="my_train", json_file="my.json", image_root="images")
    cfg = OmegaConf.create(
        {
            "train": {"output_dir": "/runs/a", "max_iter": 10},
            "dataloader": {
                "train": {
                    "dataset": {"names": ["synthetic_lt_train", mine]},
                    "sampler": {"repeat_thresh": [0.3, None]},
                    "mapper": {
                        "copy_paste": L(CopyPaste)(mode="rare", prob=0.5, max_objects=10, repeat_thresh=0.3)
                    },
                }
            },
        }
    )
    sampler = MixtureTrainingSampler([1000, 24], ratios=[3, 1], total_batch_size=8, rank=0, world_size=1)
    body = torch.nn.Sequential()
    body.add_module("layer1", torch.nn.Sequential(torch.nn.Linear(2, 2)))
    body.add_module("layer2", torch.nn.Sequential(torch.nn.Linear(2, 2)))
    checkpoint_blocks(body, ["layer2"])
    model = torch.nn.Sequential()
    model.add_module("body", body)
    trainer = SimpleNamespace(
        model=model, data_loader=SimpleNamespace(batch_sampler=SimpleNamespace(sampler=sampler))
    )
    fields = _lines_by_field(format_run_header(cfg, trainer))
    assert fields["data"] == (
        "synthetic_lt_train, my_train; Copy-Paste rare (prob 0.5, up to 10 objects, t=0.3)"
    )
    assert fields["sampler"] == (
        "MixtureTrainingSampler: images per step (all ranks) synthetic_lt_train 6 (of 1000 images, RFS t=0.3 "
        "inside it), my_train 2 (of 24 images)"
    )
    assert fields["model"] == (
        "Sequential: 0.0M parameters (0.0M trainable); activation checkpointing in body.layer2"
    )


def test_the_header_leaves_copy_paste_out_when_it_is_off():
    cfg = OmegaConf.create(
        {
            "train": {"output_dir": "/runs/a", "max_iter": 10},
            "dataloader": {
                "train": {
                    "dataset": {"names": "synthetic_lt_train"},
                    "mapper": {"copy_paste": L(CopyPaste)(mode="none")},
                }
            },
        }
    )
    trainer = SimpleNamespace(model=torch.nn.Linear(2, 2), data_loader=None)
    fields = _lines_by_field(format_run_header(cfg, trainer))
    assert fields["data"] == "synthetic_lt_train"
    assert fields["model"] == "Linear: 0.0M parameters (0.0M trainable)"


def _trainer_with_warmup(warmup_iters, max_iter, lr=0.02):
    model = torch.nn.Linear(2, 2)
    multiplier = WarmupCosineMultiplier(max_iter=max_iter, warmup_iters=warmup_iters)
    return SimpleNamespace(
        hooks=[LRScheduler(multiplier)], optimizer=torch.optim.SGD(model.parameters(), lr=lr)
    )


def test_a_warmup_longer_than_the_run_says_how_high_the_learning_rate_gets():
    # The case: the demo (cosine, warm-up 50, lr 0.02) shortened to 40 iterations.
    cfg = OmegaConf.create({"train": {"max_iter": 40}, "lr_multiplier": {"warmup_iters": 50}})
    peak = max(WarmupCosineMultiplier(max_iter=40, warmup_iters=50)(i) for i in range(40))
    assert round(0.02 * peak, 3) == 0.004
    assert find_short_warmup(cfg, _trainer_with_warmup(50, 40)) == (
        "lr_multiplier.warmup_iters=50 is longer than the run (train.max_iter=40): the learning rate peaks at "
        "0.0042 (x0.21 of 0.02) and never reaches its value; shorten the warm-up (e.g. "
        "lr_multiplier.warmup_iters=4) or train longer."
    )
    cfg.train.max_iter = 400  # the demo as it is
    assert find_short_warmup(cfg, _trainer_with_warmup(50, 400)) is None


def test_the_closing_block_shows_ap_fixed_and_ap_pool_when_they_were_computed(tmp_path):
    results = {
        "segm": {"AP": 40.0, "APr": 25.2, "APc": 46.3, "APf": 44.4, "APfixed": 41.5, "APpool": 38.25},
        "bbox": {"AP": 40.8, "APr": 22.7, "APc": 45.0, "APf": 50.3, "APfixed": 42.0, "APpool": 39.0},
    }
    trainer = SimpleNamespace(iter=2, start_iter=0, storage=None, last_eval_results=results, hooks=[])
    cfg = OmegaConf.create({"train": {"output_dir": str(tmp_path)}})
    block = format_run_summary(cfg, trainer, 1.0).splitlines()
    assert block[1].split() == ["AP", "APr", "APc", "APf", "AP-fixed", "AP-pool"]
    assert block[2].split() == ["mask", "40.0", "25.2", "46.3", "44.4", "41.5", "38.2"]
    assert block[3].split() == ["box", "40.8", "22.7", "45.0", "50.3", "42.0", "39.0"]


def test_the_evaluation_header_names_ap_fixed_and_ap_pool_with_k_and_the_score_threshold(tmp_path):
    cfg = OmegaConf.create(
        {
            "train": {"output_dir": str(tmp_path), "init_checkpoint": "runs/a/model_final.pth"},
            "model": {"roi_heads": {"score_thresh": 0.0001, "detections_per_img": None}},
            "dataloader": {
                "test": {"dataset": {"names": "lvis_v1_val"}},
                "evaluator": {"ap_fixed": True, "ap_pool": True, "max_dets_per_category": 10000},
            },
        }
    )
    fields = _lines_by_field(format_eval_header(cfg, torch.nn.Linear(2, 2)))
    assert fields["metrics"] == (
        "AP and AP-fixed and AP-pool: K=10000 detections per category, model.roi_heads.score_thresh=0.0001, "
        "detections_per_img=None"
    )
    cfg.dataloader.evaluator.ap_fixed = cfg.dataloader.evaluator.ap_pool = False
    assert "metrics" not in _lines_by_field(format_eval_header(cfg, torch.nn.Linear(2, 2)))


def _trained(iterations, seconds_per_step, hooks=()):
    storage = EventStorage(0)
    for iteration, seconds in enumerate(seconds_per_step):
        storage.iter = iteration
        storage.put_scalar("time", seconds)
    return SimpleNamespace(
        iter=iterations, start_iter=0, storage=storage, last_eval_results={}, hooks=list(hooks)
    )


def test_the_closing_line_says_how_many_iterations_its_speed_is_the_mean_of(tmp_path):
    # The case: 4 iterations, the first 3 warming up (190 s), the last one 4.29 s.
    cfg = OmegaConf.create({"train": {"output_dir": str(tmp_path)}})
    done = format_run_summary(cfg, _trained(4, [100.0, 50.0, 40.0, 4.29]), 196.0).splitlines()[0]
    assert done == (
        "Done: 4 iterations in 0:03:16 (wall time), 4.29 s/it over the last 1 iteration; no evaluation "
        "(train.hooks has no eval hook)."
    )
    done = format_run_summary(cfg, _trained(2, [3.0, 1.0]), 4.0).splitlines()[0]
    assert done.startswith("Done: 2 iterations in 0:00:04 (wall time), 2.00 s/it over 2 iterations; ")


def test_without_evaluation_the_curves_are_not_said_to_hold_ap(tmp_path):
    (tmp_path / "curves.png").write_bytes(b"")
    cfg = OmegaConf.create({"train": {"output_dir": str(tmp_path)}})
    block = format_run_summary(cfg, _trained(2, [1.0, 1.0]), 2.0)
    assert "\n  curves.png  losses and learning rate over iterations\n" in block
    evaluated = _trained(2, [1.0, 1.0])
    evaluated.last_eval_results = {"segm": {"AP": 1.0}}
    assert "\n  curves.png  losses, learning rate and AP over iterations\n" in format_run_summary(
        cfg, evaluated, 2.0
    )
