"""The engine's recipe blocks: recipes/optim.py, recipes/schedules.py, recipes/train.py."""

import math
import os

import pytest
import torch
from omegaconf import OmegaConf

from lazytrain.config import LazyConfig, instantiate
from tests.engine import toy

RECIPES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes"
)


def test_optimizer_recipe_has_no_weight_decay_on_norm_layers():
    cfg = LazyConfig.load(os.path.join(RECIPES, "optim.py"))
    model = toy.ToyRegressor()
    optimizer = instantiate(cfg.optimizer, params=instantiate(cfg.optimizer.params, model=model))
    assert isinstance(optimizer, torch.optim.SGD)
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay[id(model.norm.weight)] == decay[id(model.norm.bias)] == 0.0
    assert decay[id(model.linear.weight)] == decay[id(model.linear.bias)] == 1e-4
    assert {g["lr"] for g in optimizer.param_groups} == {0.02}
    assert {g["momentum"] for g in optimizer.param_groups} == {0.9}


@pytest.mark.parametrize(
    "max_iter, milestones", [(90000, [60000, 80000]), (180000, [120000, 160000]), (9, [6, 8])]
)
def test_step_schedule_milestones_follow_max_iter(max_iter, milestones):
    schedules = LazyConfig.load(os.path.join(RECIPES, "schedules.py"))
    cfg = OmegaConf.create({"train": {"max_iter": 1}, "lr_multiplier": schedules.lr_multiplier})
    LazyConfig.apply_overrides(cfg, [f"train.max_iter={max_iter}"])
    multiplier = instantiate(cfg.lr_multiplier)
    assert multiplier.milestones == milestones
    assert multiplier(0) == pytest.approx(0.001)
    if max_iter > 1000:  # past the 1000-iteration warmup
        assert multiplier(milestones[0] - 1) == 1.0
        assert multiplier(milestones[0]) == pytest.approx(0.1)
        assert multiplier(milestones[1]) == pytest.approx(0.01)


def test_cosine_schedule_follows_max_iter():
    schedules = LazyConfig.load(os.path.join(RECIPES, "schedules.py"))
    cfg = OmegaConf.create({"train": {"max_iter": 3000}, "lr_multiplier": schedules.cosine_lr_multiplier})
    multiplier = instantiate(cfg.lr_multiplier)
    # cosine over the whole run (detectron2's convention), the linear warmup multiplied on top
    assert multiplier(0) == pytest.approx(0.001)
    assert multiplier(500) == pytest.approx((0.001 * 0.5 + 0.5) * 0.5 * (1 + math.cos(math.pi / 6)))
    assert multiplier(1500) == pytest.approx(0.5)
    assert multiplier(3000) == pytest.approx(0.0)


def test_train_recipe_hooks_are_plain_data_in_run_order():
    cfg = LazyConfig.load(os.path.join(RECIPES, "train.py"))
    assert list(cfg.train.hooks) == ["timer", "lr_scheduler", "checkpointer", "eval", "writer", "plots"]
    raw = OmegaConf.to_container(cfg.train, resolve=False)
    assert raw["hooks"]["checkpointer"]["period"] == "${train.checkpointer.period}"
    assert raw["trainer"]["_target_"] == "lazytrain.engine.train_loop.SimpleTrainer"
    assert raw["clip_grad"] == {"enabled": False, "max_norm": None}
    assert raw["amp"] == {"enabled": False, "dtype": "bfloat16"}


def test_optimizer_recipe_merges_parameters_with_the_same_settings_and_steps_as_before():
    cfg = LazyConfig.load(os.path.join(RECIPES, "optim.py"))
    models = [toy.ToyRegressor(), toy.ToyRegressor()]
    models[1].load_state_dict(models[0].state_dict())
    merged = instantiate(cfg.optimizer, params=instantiate(cfg.optimizer.params, model=models[0]))
    # One group per parameter, as before the merge: the same updates, parameter for parameter.
    single = torch.optim.SGD(
        [{"params": [p], "weight_decay": 0.0 if "norm" in n else 1e-4} for n, p in models[1].named_parameters()],
        lr=0.02, momentum=0.9,
    )  # fmt: skip
    assert sorted(g["weight_decay"] for g in merged.param_groups) == [0.0, 1e-4]
    assert sum(len(g["params"]) for g in merged.param_groups) == len(list(models[0].parameters()))
    batch = (torch.randn(8, 4), torch.randn(8))
    for _ in range(3):
        for model, optimizer in zip(models, (merged, single)):
            optimizer.zero_grad()
            model(batch)["loss_mse"].backward()
            optimizer.step()
    for (name, got), expected in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(got, expected), name
