"""Layer-wise LR decay groups (`get_layer_decay_optimizer_params`) on timm backbones under ``backbone.body``, and
a saved optimizer state loaded into the run's groups (`load_optimizer_state`, through `Checkpointer`)."""

import importlib.util
import os

import pytest
import torch
from pytest import param
from torch import nn

from lazytrain.config import LazyConfig, instantiate
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.optimizer import (
    get_default_optimizer_params,
    get_layer_decay_optimizer_params,
    get_layer_id,
)
from lazytrain.errors import CheckpointError
from lazytrain.modeling import TimmBackbone

needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")

RECIPES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes"
)


class _Detector(nn.Module):
    """What the groups see of `RCNN`: ``backbone.body`` (timm), ``backbone.fpn`` and a head after it."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.roi_heads = nn.Linear(4, 2)


def _vit_tiny() -> _Detector:
    return _Detector(
        TimmBackbone(
            "vit_tiny_patch16_224", out_indices=[-1], out_channels=16, model_kwargs=dict(img_size=32)
        )
    )


def _sizes(groups: list[dict]) -> dict[str, int]:
    return {g["name"]: sum(p.numel() for p in g["params"]) for g in groups}


@needs_timm
def test_vit_groups_are_named_by_block_and_scaled_as_vitdet():
    model = _vit_tiny()
    groups = get_layer_decay_optimizer_params(
        model,
        base_lr=1.0,
        layer_decay=0.5,
        num_layers=12,
        weight_decay=0.1,
        weight_decay_norm=0.0,
        weight_decay_embed=0.0,
    )
    by_name = {g["name"]: g for g in groups}
    blocks = model.backbone.body.model.blocks
    block_params = {i: sum(p.numel() for p in blocks[i].parameters()) for i in range(12)}
    norms = {i: sum(p.numel() for n, p in blocks[i].named_parameters() if "norm" in n) for i in range(12)}
    sizes = _sizes(groups)
    for i in range(12):  # block i is layer i + 1: lr 0.5 ** (13 - (i + 1))
        assert by_name[f"layer{i + 1}_wd0.1"]["lr"] == pytest.approx(0.5 ** (12 - i))
        assert by_name[f"layer{i + 1}_wd0"]["lr_scale"] == pytest.approx(0.5 ** (12 - i))
        assert sizes[f"layer{i + 1}_wd0.1"] + sizes[f"layer{i + 1}_wd0"] == block_params[i]
        assert sizes[f"layer{i + 1}_wd0"] == norms[i]
    body = model.backbone.body.model
    embed = body.pos_embed.numel() + body.cls_token.numel()
    assert sizes["layer0_wd0"] == embed  # position embedding and class token: no decay, the stem's lr
    assert sizes["layer0_wd0.1"] == sum(p.numel() for p in body.patch_embed.parameters())
    assert by_name["layer0_wd0.1"]["lr"] == pytest.approx(0.5**13)
    after = sum(p.numel() for p in model.backbone.fpn.parameters()) + sum(
        p.numel() for p in model.roi_heads.parameters()
    )
    assert sizes["layer13_wd0.1"] + sizes["layer13_wd0"] == after
    assert groups[0]["lr"] == 1.0  # the full lr first: it is the one logged
    assert sum(sizes.values()) == sum(p.numel() for p in model.parameters())


@needs_timm
def test_convnext_stages_count_as_layers():
    model = _Detector(TimmBackbone("convnext_atto", out_channels=16))
    names = [name for name, _ in model.named_parameters()]
    layer = {name: get_layer_id(name, 4) for name in names}
    assert layer["backbone.body.stem_0.weight"] == 0
    assert {layer[n] for n in names if n.startswith("backbone.body.stages_2.")} == {3}
    assert {layer[n] for n in names if n.startswith("backbone.body.stages_3.")} == {4}
    assert {layer[n] for n in names if n.startswith(("backbone.fpn.", "roi_heads."))} == {5}
    groups = get_layer_decay_optimizer_params(model, base_lr=0.1, layer_decay=0.9, num_layers=4)
    assert [g["name"] for g in groups] == ["layer5", "layer4", "layer3", "layer2", "layer1", "layer0"]
    assert [g["lr"] for g in groups] == pytest.approx([0.1 * 0.9**k for k in range(6)])


@needs_timm
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        param(
            dict(layer_decay=0.0, num_layers=4), r"layer_decay=\) must be in \(0, 1\]; got 0.0", id="decay"
        ),
        param(
            dict(layer_decay=0.9, num_layers=3),
            r"must count every block or stage of the backbone: backbone.body.stages_3.* got num_layers=3",
            id="too-few-layers",
        ),
    ],
)
def test_bad_settings_name_the_argument(kwargs, message):
    model = _Detector(TimmBackbone("convnext_atto", out_channels=16))
    with pytest.raises(ValueError, match=message):
        get_layer_decay_optimizer_params(model, base_lr=0.1, **kwargs)


@needs_timm
def test_adamw_recipe_builds_layer_decay_groups_from_its_lr():
    cfg = LazyConfig.load(os.path.join(RECIPES, "optim.py"))
    cfg.AdamW.lr = 2e-4
    model = _vit_tiny()
    optimizer = instantiate(cfg.AdamW, params=instantiate(cfg.AdamW.params, model=model))
    assert isinstance(optimizer, torch.optim.AdamW)
    groups = {g["name"]: g for g in optimizer.param_groups}
    # Ordinary weights take the optimizer's decay (0.1): their groups name no decay of their own.
    assert groups["layer13"]["lr"] == pytest.approx(2e-4) and groups["layer13"]["weight_decay"] == 0.1
    assert groups["layer12"]["lr"] == pytest.approx(2e-4 * 0.7)
    assert groups["layer0_wd0"]["lr"] == pytest.approx(2e-4 * 0.7**13)
    assert groups["layer0_wd0"]["weight_decay"] == 0.0


def _interleaved() -> nn.Module:
    """Norm parameters between two linear layers: merged groups order the parameters unlike the module."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _per_parameter_groups(model: nn.Module) -> list[dict]:
    """The layout `get_default_optimizer_params` had before groups were merged: one group per parameter."""
    merged = get_default_optimizer_params(model, weight_decay_norm=0.0)
    setting = {id(p): {k: v for k, v in g.items() if k != "params"} for g in merged for p in g["params"]}
    return [{"params": [p], **setting[id(p)]} for p in model.parameters()]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(8, 3, generator=generator)).square().mean().backward()
    optimizer.step()


def test_a_state_saved_with_one_group_per_parameter_resumes_exactly_in_merged_groups(tmp_path):
    old_model = _interleaved()
    old = torch.optim.SGD(_per_parameter_groups(old_model), lr=0.1, momentum=0.9, weight_decay=1e-2)
    for seed in range(3):
        _step(old_model, old, seed)
    Checkpointer(old_model, str(tmp_path), optimizer=old).save("model_0000002", iteration=2)

    model = _interleaved()
    optimizer = torch.optim.SGD(
        get_default_optimizer_params(model, weight_decay_norm=0.0), lr=0.1, momentum=0.9, weight_decay=1e-2
    )
    assert len(optimizer.param_groups) == 2 and len(old.param_groups) == 6
    Checkpointer(model, optimizer=optimizer).load(str(tmp_path / "model_0000002.pth"))
    for seed in (3, 4):  # the same updates as the run that saved it, momentum included
        _step(old_model, old, seed)
        _step(model, optimizer, seed)
    for (name, expected), actual in zip(old_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(expected, actual), name


def test_a_state_that_cannot_be_converted_is_one_line_saying_how_to_go_on(tmp_path):
    model = _interleaved()
    params = list(model.parameters())
    # Two groups, neither one per parameter nor this run's layout.
    saved = torch.optim.SGD([{"params": params[:3]}, {"params": params[3:]}], lr=0.1, momentum=0.9)
    _step(model, saved, 0)
    Checkpointer(model, str(tmp_path), optimizer=saved).save("model_final")
    optimizer = torch.optim.SGD(get_default_optimizer_params(model, weight_decay_norm=0.0), lr=0.1)
    path = str(tmp_path / "model_final.pth")
    with pytest.raises(CheckpointError) as error:
        Checkpointer(model, optimizer=optimizer).load(path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"Checkpointer: the optimizer state in {path} has 2 parameter group(s) of 3, 3 parameters and this run's "
        "optimizer 2 parameter group(s) of 4, 2 parameters: it was saved with other parameter groups"
    ), message
    assert message.endswith(
        f"(its groups are not one per parameter). To go on from its weights with a fresh optimizer, schedule "
        f"and iteration count: train.resume=false train.init_checkpoint={path}."
    ), message
