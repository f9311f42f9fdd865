"""`TimmBackbone` on four timm families (random init, nothing downloaded) and `SimpleFeaturePyramid`."""

import logging
import sys

import pytest
import torch
from pytest import param
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from lazytrain.errors import ConfigError
from lazytrain.modeling.backbone import get_feature_map_names
from lazytrain.modeling.timm_backbone import SimpleFeaturePyramid, TimmBackbone, find_model_name_problem

timm = pytest.importorskip("timm")

# The cheapest member of each family that still has its traits: BatchNorm (resnet10t), LayerNorm and
# flattened stages (convnext_atto), NHWC maps (Swin; strict_img_size=False pads windows for any size), a plain
# ViT (one stride-16 map: the simple pyramid).
FAMILIES = {
    "resnet": dict(model_name="resnet10t"),
    "convnext": dict(model_name="convnext_atto"),
    "swin": dict(model_name="swin_tiny_patch4_window7_224", model_kwargs=dict(strict_img_size=False)),
    "vit": dict(
        model_name="vit_tiny_patch16_224",
        out_indices=[-1],
        model_kwargs=dict(img_size=64, dynamic_img_size=True),
    ),
}


def _build(family: str, **kwargs) -> TimmBackbone:
    return TimmBackbone(**{**FAMILIES[family], "out_channels": 32, **kwargs})


@pytest.mark.parametrize("family", [param(name, id=name) for name in FAMILIES])
def test_maps_have_the_strides_and_channels_of_timms_feature_info(family):
    backbone = _build(family).eval()
    info = backbone.body.feature_info
    assert backbone.strides == info.reduction() and backbone.channels == info.channels()
    with torch.no_grad():
        maps = backbone(torch.zeros(1, 3, 64, 96))
    assert list(maps) == get_feature_map_names(backbone) == ["0", "1", "2", "3", "pool"]
    assert [tuple(m.shape[1:]) for m in maps.values()] == [(32, 64 // s, 96 // s) for s in (4, 8, 16, 32)] + [
        (32, 1, 2)
    ]


def test_timm_feature_info_is_read_not_assumed():
    backbone = _build("resnet", out_indices=(2, 3, 4))
    assert backbone.strides == [8, 16, 32] and backbone.channels == [128, 256, 512]
    assert get_feature_map_names(backbone) == ["0", "1", "2", "pool"]
    vit = _build("vit")
    assert vit.is_plain and vit.strides == [16] and vit.channels == [192]


def test_swin_maps_come_nhwc_from_timm_and_leave_as_nchw():
    backbone = _build("swin").eval()
    assert backbone.channels_last_output
    x = torch.zeros(1, 3, 64, 96)
    with torch.no_grad():
        raw = backbone.body(x)
        maps = backbone(x)
    assert tuple(raw[0].shape) == (1, 16, 24, 96)  # NHWC, as timm gives it
    assert tuple(maps["0"].shape) == (1, 32, 16, 24)
    assert not _build("convnext").channels_last_output


def _frozen_and_trainable(module: nn.Module, prefixes: tuple[str, ...]) -> tuple[list[bool], list[bool]]:
    grads = {name: p.requires_grad for name, p in module.named_parameters()}
    frozen = [g for name, g in grads.items() if name.startswith(prefixes)]
    trainable = [g for name, g in grads.items() if not name.startswith(prefixes)]
    return frozen, trainable


@pytest.mark.parametrize(
    ("family", "frozen_stages", "frozen_prefixes"),
    [
        param("resnet", 0, ("conv1", "bn1"), id="resnet-stem"),
        param("resnet", 2, ("conv1", "bn1", "layer1", "layer2"), id="resnet-2"),
        param("convnext", 1, ("stem", "stages_0"), id="convnext-1"),
        param("swin", 1, ("patch_embed", "layers_0"), id="swin-1"),
        param("vit", 0, ("model.patch_embed",), id="vit-patch-embed"),
    ],
)
def test_frozen_stages_get_no_gradients_and_frozen_batch_norms(family, frozen_stages, frozen_prefixes):
    backbone = _build(family, frozen_stages=frozen_stages)
    frozen, trainable = _frozen_and_trainable(backbone.body, frozen_prefixes)
    assert frozen and not any(frozen)
    assert trainable and all(trainable)
    batch_norms = {
        name: type(m) for name, m in backbone.body.named_modules() if "BatchNorm" in type(m).__name__
    }
    for name, kind in batch_norms.items():
        assert (kind is FrozenBatchNorm2d) == name.startswith(frozen_prefixes), name
    if family == "resnet":  # frozen statistics stay put in train mode, the others move
        backbone.train()
        before = backbone.body.conv1[1].running_mean.clone(), backbone.body.layer3[0].bn1.running_mean.clone()
        backbone(torch.randn(2, 3, 64, 64))
        assert torch.equal(backbone.body.conv1[1].running_mean, before[0])
        assert not torch.equal(backbone.body.layer3[0].bn1.running_mean, before[1])


def test_freeze_bn_freezes_every_batch_norm_and_leaves_layer_norm_models_alone():
    backbone = _build("resnet", freeze_bn=True)
    kinds = {type(m) for m in backbone.body.modules()}
    assert FrozenBatchNorm2d in kinds and nn.BatchNorm2d not in kinds
    assert all(p.requires_grad for p in backbone.parameters())
    convnext = _build("convnext", freeze_bn=True)
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in convnext.modules())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        param(
            dict(frozen_stages=5), ValueError, r"at most the number of feature maps, 4; got 5", id="too-many"
        ),
        param(dict(frozen_stages=-2), ValueError, r"frozen_stages=\) must be an int >= -1", id="negative"),
        param(dict(fpn_norm="BN"), ValueError, r"fpn_norm=\) must be None or 'LN'; got 'BN'", id="fpn-norm"),
        param(
            dict(pretrained=1),
            TypeError,
            r"pretrained=\) must be True, False, a path or a URL",
            id="pretrained",
        ),
        param(
            dict(pretrained="/no/such.pth"), FileNotFoundError, r"no such file: /no/such.pth", id="no-file"
        ),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _build("resnet", **kwargs)


def test_a_plain_vit_freezes_at_most_its_patch_embedding():
    with pytest.raises(ValueError, match=r"plain model \(every map at stride 16\), must be -1 or 0"):
        _build("vit", frozen_stages=1)


def test_vit_position_embedding_follows_the_input_size():
    backbone = _build("vit").eval()
    assert tuple(backbone.body.model.pos_embed.shape) == (1, 1 + 4 * 4, 192)  # img_size=64: 4 x 4 patches
    with torch.no_grad():
        maps = backbone(torch.zeros(1, 3, 128, 64))
    assert tuple(maps["2"].shape) == (1, 32, 8, 4)


def test_simple_feature_pyramid_strides_and_layer_norms():
    pyramid = SimpleFeaturePyramid(64, 16)
    maps = pyramid(torch.randn(2, 64, 8, 6))
    assert [tuple(m.shape) for m in maps.values()] == [
        (2, 16, 32, 24),
        (2, 16, 16, 12),
        (2, 16, 8, 6),
        (2, 16, 4, 3),
        (2, 16, 2, 2),
    ]
    assert list(maps) == ["0", "1", "2", "3", "pool"]
    with pytest.raises(ValueError, match=r"scale_factors=\) must be values from \(4, 2, 1, 0.5\); got \[3\]"):
        SimpleFeaturePyramid(64, 16, scale_factors=[3])


def test_pretrained_file_from_a_url_is_downloaded_once_and_the_report_names_what_was_reinitialised(
    file_server, caplog
):
    state = timm.create_model("resnet10t", pretrained=False).state_dict()
    del state["layer4.0.conv2.weight"]
    state["extra.weight"] = torch.zeros(1)
    url = file_server.add_weights(state, "resnet10t")
    with caplog.at_level(logging.INFO, logger="lazytrain"):
        backbone = _build("resnet", pretrained=url)
        _build("resnet", pretrained=url)
    assert sum(file_server.requests.values()) == 1  # the second build reads torch hub's cache
    assert torch.equal(backbone.body.layer1[0].conv1.weight, state["layer1.0.conv1.weight"])
    report = caplog.text
    assert f"weights from {url}" in report
    assert "re-initialised (not in the weights): layer4.0.conv2.weight" in report
    assert "unused (not in the model): extra.weight" in report
    assert "fc.weight" not in report  # the classifier, dropped by features_only


def test_pretrained_true_offline_is_one_line_with_the_fixes(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' (offline)")

    monkeypatch.setattr(timm.models._builder, "load_state_dict_from_hf", offline)
    with pytest.raises(ConfigError) as raised:
        _build("resnet", pretrained=True)
    message = str(raised.value)
    assert "\n" not in message
    assert "TimmBackbone(model_name='resnet10t', pretrained=True): could not get timm's weights" in message
    assert "timm/resnet10t" in message and "model.backbone.pretrained=PATH" in message
    assert "model.backbone.pretrained=False" in message


def test_without_timm_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "lazytrain\[timm\]"'):
        TimmBackbone("resnet10t")


def test_pretrained_true_loads_through_timms_hub_and_reports_it(monkeypatch, caplog):
    state = timm.create_model("resnet10t", pretrained=False).state_dict()
    asked = []

    def hub(model_id, *args, **kwargs):  # timm's hub download, answered here: no test downloads
        asked.append(model_id)
        return dict(state)

    monkeypatch.setattr(timm.models._builder, "load_state_dict_from_hf", hub)
    with caplog.at_level(logging.INFO, logger="lazytrain"):
        backbone = _build("resnet", pretrained=True)
    assert asked == ["timm/resnet10t.c3_in1k"]
    assert torch.equal(backbone.body.layer4[0].conv2.weight, state["layer4.0.conv2.weight"])
    assert "weights from timm's hub (timm/resnet10t.c3_in1k)" in caplog.text
    assert "every tensor loaded" in caplog.text


def test_layer_norms_are_timms_with_the_same_outputs_and_state_dict_keys():
    """The pyramids' "LN" is timm's LayerNorm2d at torch's epsilon: what the hand-written one computed."""
    torch.manual_seed(0)
    pyramid = SimpleFeaturePyramid(16, 8)
    norms = [m for m in pyramid.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(type(m) is timm.layers.LayerNorm2d and m.eps == 1e-5 for m in norms)
    assert [k for k in pyramid.state_dict() if k.startswith("stages.0.")] == [
        "stages.0.0.weight", "stages.0.0.bias", "stages.0.1.weight", "stages.0.1.bias", "stages.0.3.weight",
        "stages.0.3.bias", "stages.0.4.weight", "stages.0.5.weight", "stages.0.5.bias", "stages.0.6.weight",
        "stages.0.7.weight", "stages.0.7.bias",
    ]  # fmt: skip
    norm = norms[0]
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(2, norm.normalized_shape[0], 5, 3)
    expected = nn.functional.layer_norm(
        x.permute(0, 2, 3, 1), norm.normalized_shape, norm.weight, norm.bias, 1e-5
    )
    assert torch.equal(norm(x), expected.permute(0, 3, 1, 2))
    fpn_norms = [m for m in _build("resnet", fpn_norm="LN").fpn.modules() if isinstance(m, nn.LayerNorm)]
    assert fpn_norms and all(type(m) is timm.layers.LayerNorm2d and m.eps == 1e-5 for m in fpn_norms)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        param("convnext_tiny", None, id="known"),
        param("convnext_tiny.fb_in22k", None, id="known-tag"),
        param("convnxt_tiny", "not a timm model. Did you mean: convnext_tiny, ", id="misspelled"),
        param(
            "convnext_tiny.fb_in22kk",
            "timm has no pretrained tag 'fb_in22kk' for convnext_tiny. Did you mean convnext_tiny.fb_in22k? Its "
            "tags: ",
            id="tag",
        ),
    ],
)
def test_model_names_timm_does_not_know_get_the_closest(name, problem):
    found = find_model_name_problem(name)
    assert found is None if problem is None else found.startswith(problem), found


def test_an_unknown_model_name_fails_before_timm_builds_anything():
    with pytest.raises(
        ValueError,
        match=r"TimmBackbone\(model_name='resnet10tt'\): not a timm model. Did you mean: "
        "resnet10t",
    ):
        _build("resnet", model_name="resnet10tt")


def test_simple_feature_pyramid_pool_map_is_torchvisions_last_level_max_pool():
    pyramid = SimpleFeaturePyramid(16, 8).eval()
    maps = pyramid(torch.randn(1, 16, 8, 8))
    assert list(maps) == ["0", "1", "2", "3", "pool"]
    assert torch.equal(maps["pool"], maps["3"][..., ::2, ::2])  # a 1x1 max-pool of stride 2
    assert all(key.startswith("stages.") for key in pyramid.state_dict())
