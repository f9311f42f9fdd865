import pytest
import torch
import torch.nn.functional as F
from pytest import param
from torch import nn
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.ops.misc import FrozenBatchNorm2d

from lazytrain.modeling.backbone import build_resnet_fpn_backbone, get_feature_map_names


@pytest.mark.parametrize(
    ("depth", "norm", "norm_type"),
    [
        param(18, "BN", nn.BatchNorm2d, id="r18-bn"),
        param(34, "GN", nn.GroupNorm, id="r34-gn"),
        param(50, "FrozenBN", FrozenBatchNorm2d, id="r50-frozen"),
    ],
)
def test_feature_maps_channels_and_norms(depth, norm, norm_type):
    backbone = build_resnet_fpn_backbone(depth, norm=norm, trainable_layers=5, out_channels=32)
    assert isinstance(backbone.body.layer4[0].bn1, norm_type)
    backbone.eval()
    with torch.no_grad():
        features = backbone(torch.zeros(1, 3, 64, 96))
    assert list(features) == get_feature_map_names(backbone) == ["0", "1", "2", "3", "pool"]
    assert [tuple(f.shape[-2:]) for f in features.values()] == [(16, 24), (8, 12), (4, 6), (2, 3), (1, 2)]
    assert all(f.shape[1] == 32 for f in features.values())


def test_the_pool_map_is_torchvisions_last_level_max_pool_with_torchvisions_keys():
    """The "pool" map comes from torchvision's `LastLevelMaxPool` (no weights of its own): the state-dict keys
    are those of torchvision's `resnet_fpn_backbone`, and the map is the last level max-pooled with stride 2."""
    torch.manual_seed(0)
    backbone = build_resnet_fpn_backbone(18).eval()
    assert isinstance(backbone.fpn.extra_blocks, LastLevelMaxPool)
    reference = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=3)
    assert list(backbone.state_dict()) == list(reference.state_dict())
    with torch.no_grad():
        features = backbone(torch.rand(1, 3, 96, 64))
    assert torch.equal(features["pool"], F.max_pool2d(features["3"], kernel_size=1, stride=2))


@pytest.mark.parametrize("trainable_layers", [0, 2, 5])
def test_frozen_stages_have_no_gradients_and_frozen_statistics(trainable_layers):
    backbone = build_resnet_fpn_backbone(18, norm="BN", trainable_layers=trainable_layers, out_channels=16)
    stages = ["conv1", "layer1", "layer2", "layer3", "layer4"]
    trainable = set(stages[len(stages) - trainable_layers :])
    for name, parameter in backbone.body.named_parameters():
        stage = "conv1" if name.startswith(("conv1", "bn1")) else name.split(".")[0]
        assert parameter.requires_grad == (stage in trainable), name
    for stage in stages[1:]:
        expected = nn.BatchNorm2d if stage in trainable else FrozenBatchNorm2d
        assert isinstance(getattr(backbone.body, stage)[0].bn1, expected)  # FrozenBN folded: a subclass
    assert isinstance(backbone.body.bn1, nn.BatchNorm2d if "conv1" in trainable else FrozenBatchNorm2d)


def test_returned_layers_choose_the_maps():
    backbone = build_resnet_fpn_backbone(18, returned_layers=[2, 3, 4], out_channels=16)
    assert get_feature_map_names(backbone) == ["0", "1", "2", "pool"]
    assert backbone.fpn.inner_blocks[0][0].in_channels == 128


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        param({"depth": 42}, r"depth=\) must be one of \[18, 34, 50, 101, 152\]; got 42", id="depth"),
        param({"norm": "LN"}, r"norm=\) must be one of", id="norm"),
        param({"fpn_norm": "LN"}, r"fpn_norm=\) must be one of", id="fpn-norm"),
        param({"trainable_layers": 6}, r"trainable_layers=\) must be in \[0, 5\]", id="trainable"),
        param({"returned_layers": [3, 2]}, r"returned_layers=\) must be increasing", id="returned"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_resnet_fpn_backbone(**{"depth": 18, **kwargs})
