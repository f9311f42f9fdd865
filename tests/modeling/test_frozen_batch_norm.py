import copy

import pytest
import torch
from pytest import param
from torch import nn
from torchvision.models import resnet18, resnet50
from torchvision.ops.misc import FrozenBatchNorm2d

from lazytrain.modeling import FoldedFrozenBatchNorm2d, FrozenBatchNormConv2d, fold_frozen_batch_norm
from lazytrain.modeling.backbone import build_resnet_fpn_backbone, get_feature_map_names

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomise_norms(module: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial frozen statistics and affine, so a wrong fold cannot pass as the identity."""
    generator = torch.Generator().manual_seed(seed)
    for norm in module.modules():
        if isinstance(norm, FrozenBatchNorm2d):
            (n,) = norm.weight.shape
            norm.weight.copy_(torch.rand(n, generator=generator) + 0.5)
            norm.bias.copy_(torch.randn(n, generator=generator) * 0.2)
            norm.running_mean.copy_(torch.randn(n, generator=generator) * 0.2)
            norm.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.25)
    return module


def _frozen_resnet50() -> nn.Module:
    """torchvision's ResNet-50 with FrozenBN and the stem and layer1 frozen (``trainable_layers=3``)."""
    model = _randomise_norms(resnet50(weights=None, norm_layer=FrozenBatchNorm2d))
    for module in (model.conv1, model.bn1, model.layer1):
        module.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def _resnet50_float64() -> nn.Module:
    """One float64 frozen ResNet-50 per module: each test takes a deep copy (cheaper than building one)."""
    return _frozen_resnet50().to(torch.float64)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach(), expected.detach()
    return float((actual.double() - expected.double()).abs().max() / expected.double().abs().max())


def _folded_convs(module: nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if isinstance(m, FrozenBatchNormConv2d)]


def _conv_and_norm(*, bias: bool = False, padding_mode: str = "zeros", frozen: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=bias, padding_mode=padding_mode))
    model.append(_randomise_norms(FrozenBatchNorm2d(8)))
    return model.requires_grad_(not frozen)


def _folded_copy(model: nn.Module) -> nn.Module:
    return fold_frozen_batch_norm(copy.deepcopy(model))


def test_folded_resnet50_matches_in_training_over_two_sgd_steps(_resnet50_float64):
    reference = copy.deepcopy(_resnet50_float64).train()
    folded = _folded_copy(reference)
    assert len(_folded_convs(folded)) == 53  # stem + 16 blocks x 3 + 4 downsamples
    frozen_conv = folded.layer1[0].conv2
    assert not frozen_conv.weight.requires_grad
    models = (reference, folded)
    optimizers = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=1e-4, momentum=0.9) for m in models
    ]
    generator = torch.Generator().manual_seed(2)
    initial_fc = folded.fc.weight.detach().clone()
    for _ in range(2):
        image = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=generator)
        target = torch.randn(2, 1000, dtype=torch.float64, generator=generator)
        outputs, inputs = [], []
        cached_before = frozen_conv.folded_weight_and_bias()[0]
        for model, optimizer in zip(models, optimizers):
            x = image.clone().requires_grad_(True)
            out = model(x)
            (out * target).mean().backward()  # linear: random-init activations are large
            outputs.append(out)
            inputs.append(x)
            optimizer.step()
        assert frozen_conv.folded_weight_and_bias()[0] is cached_before  # frozen: fold computed once
        assert outputs[0].isfinite().all()
        assert _relative_error(outputs[1], outputs[0]) < 1e-10
        assert _relative_error(inputs[1].grad, inputs[0].grad) < 1e-10
        reference_parameters = dict(reference.named_parameters())
        for name, parameter in folded.named_parameters():
            expected = reference_parameters[name]
            assert (parameter.grad is None) == (expected.grad is None), name
            if parameter.grad is not None:
                assert _relative_error(parameter.grad, expected.grad) < 1e-9, name
                assert _relative_error(parameter, expected) < 1e-12, name
        for model in models:
            model.zero_grad()
    assert not torch.equal(folded.fc.weight, initial_fc)  # the steps did change the weights


@pytest.mark.parametrize("depth", [param(18, id="r18"), param(50, id="r50")])
def test_backbone_fold_keeps_keys_outputs_and_gradients(depth):
    reference = build_resnet_fpn_backbone(depth, norm="FrozenBN", out_channels=32, fold_frozen_bn=False)
    _randomise_norms(reference)
    folded = build_resnet_fpn_backbone(depth, norm="FrozenBN", out_channels=32, fold_frozen_bn=True)
    folded.load_state_dict(reference.state_dict(), strict=True)
    expected_state, state = reference.state_dict(), folded.state_dict()
    assert list(state) == list(expected_state)
    assert all(torch.equal(state[key], expected_state[key]) for key in state)
    assert _folded_convs(reference) == []
    assert len(_folded_convs(folded)) == {18: 1 + 16 + 3, 50: 53}[depth]
    assert get_feature_map_names(folded) == ["0", "1", "2", "3", "pool"]

    image = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    maps = [model(image) for model in (reference, folded)]
    assert list(maps[1]) == list(maps[0])
    for name in maps[0]:
        assert _relative_error(maps[1][name], maps[0][name]) < 1e-5, name
    for features in maps:
        sum(f.square().mean() for f in features.values()).backward()
    reference_parameters = dict(reference.named_parameters())
    for name, parameter in folded.named_parameters():
        expected = reference_parameters[name]
        assert parameter.requires_grad == expected.requires_grad, name
        if expected.requires_grad:
            assert _relative_error(parameter.grad, expected.grad) < 1e-4, name


@pytest.mark.parametrize(
    "norm_layer",
    [
        param(FrozenBatchNorm2d, id="frozen-bn-checkpoint"),
        param(nn.BatchNorm2d, id="bn-checkpoint-with-num-batches-tracked"),
    ],
)
def test_torchvision_resnet_checkpoint_loads_strictly_into_folded_body(norm_layer):
    source = resnet50(weights=None, norm_layer=norm_layer)
    with torch.no_grad():
        for module in source.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.2)
                module.running_var.uniform_(0.25, 1.75)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)
    _randomise_norms(source)
    checkpoint = {key: value for key, value in source.state_dict().items() if not key.startswith("fc.")}
    bodies = [build_resnet_fpn_backbone(50, fold_frozen_bn=fold).body for fold in (False, True)]
    for body in bodies:
        body.load_state_dict(checkpoint, strict=True)
        expected_keys = {key for key in checkpoint if not key.endswith("num_batches_tracked")}
        assert set(body.state_dict()) == expected_keys
    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected, actual = (body(image) for body in bodies)
    assert list(actual) == list(expected) == ["0", "1", "2", "3"]
    for name in expected:
        assert _relative_error(actual[name], expected[name]) < 1e-5, name


def test_frozen_conv_computes_its_fold_once():
    model = _folded_copy(_conv_and_norm())
    image = torch.randn(2, 3, 8, 8)
    model(image)
    weight, bias = model[0].folded_weight_and_bias()
    model(image)
    assert model[0].folded_weight_and_bias()[0] is weight
    assert model[0].folded_weight_and_bias()[1] is bias


def _load_scaled_state(model: nn.Module, *, assign: bool = False) -> None:
    model.load_state_dict({key: value * 1.5 for key, value in model.state_dict().items()}, assign=assign)


def _scale_running_var(model: nn.Module) -> None:
    model[1].running_var.mul_(4)


def _negate_conv_weight(model: nn.Module) -> None:
    with torch.no_grad():
        model[0].weight.neg_()


def _change_eps(model: nn.Module) -> None:
    model[1].eps = 0.5


def _to_float64(model: nn.Module) -> None:
    model.to(torch.float64)


@pytest.mark.parametrize(
    "change",
    [
        param(_load_scaled_state, id="load-state-dict"),
        param(lambda model: _load_scaled_state(model, assign=True), id="load-state-dict-assign"),
        param(_scale_running_var, id="running-var-in-place"),
        param(_negate_conv_weight, id="conv-weight-in-place"),
        param(_change_eps, id="eps"),
        param(_to_float64, id="to-float64"),
    ],
)
@pytest.mark.parametrize("frozen", [param(True, id="frozen-conv"), param(False, id="trainable-conv")])
@pytest.mark.parametrize("bias", [param(False, id="no-bias"), param(True, id="bias")])
def test_cached_fold_follows_changes(change, bias, frozen):
    reference = _conv_and_norm(bias=bias, frozen=frozen)
    folded = _folded_copy(reference)
    image = torch.randn(2, 3, 8, 8)
    assert torch.allclose(folded(image), reference(image), rtol=1e-5, atol=1e-6)
    stale = folded[0].folded_weight_and_bias()[0]
    for model in (reference, folded):
        change(model)
    image = image.to(reference[0].weight.dtype)
    actual, expected = folded(image), reference(image)
    assert folded[0].folded_weight_and_bias()[0] is not stale
    assert actual.dtype == expected.dtype == image.dtype
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_trainable_conv_reuses_the_norms_cached_scale_and_shift():
    # The norm is frozen even where the conv trains: its scale and shift are computed once, and the fold
    # costs one multiplication of the weight per forward.
    folded = _folded_copy(_conv_and_norm(frozen=False))
    scale, shift = folded[1].scale_and_shift()
    assert folded[1].scale_and_shift()[0] is scale and folded[1].scale_and_shift()[1] is shift
    image = torch.randn(2, 3, 8, 8)
    folded(image).sum().backward()
    assert folded[0].weight.grad is not None and folded[1].scale_and_shift()[0] is scale
    reference = _conv_and_norm(frozen=False)
    for model in (reference, folded):
        _scale_running_var(model)
    assert folded[1].scale_and_shift()[0] is not scale
    actual, expected = folded(image), reference(image)
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "frozen_at_first", [param(True, id="unfrozen-after-a-cached-forward"), param(False, id="trainable")]
)
def test_fused_optimizer_step_is_seen_by_the_next_no_grad_forward(frozen_at_first):
    """Fused optimizers update weights without bumping `_version`, so a trainable conv must never use a cache."""
    reference = _conv_and_norm(frozen=frozen_at_first)
    folded = _folded_copy(reference)
    image = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        folded(image)
    for model in (reference, folded):
        model.requires_grad_(True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, fused=True)
        model(image).square().mean().backward()
        version = model[0].weight._version
        optimizer.step()
        assert model[0].weight._version == version  # what makes a version-keyed cache unsafe here
        model.requires_grad_(not frozen_at_first)
    with torch.no_grad():
        assert torch.allclose(folded(image), reference(image), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("frozen", [param(True, id="frozen"), param(False, id="trainable")])
def test_inference_mode_then_training_forward(frozen):
    reference = _conv_and_norm(bias=True, frozen=frozen)
    folded = _folded_copy(reference)
    image = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        assert torch.allclose(folded(image), reference(image), rtol=1e-5, atol=1e-6)
    weight, bias = folded[0].folded_weight_and_bias()
    assert not weight.is_inference() and not bias.is_inference()
    grads = []
    for model in (reference, folded):
        x = image.clone().requires_grad_(True)
        model(x).square().sum().backward()
        grads.append(x.grad)
    assert torch.allclose(grads[1], grads[0], rtol=1e-5, atol=1e-5)
    if not frozen:
        assert torch.allclose(folded[0].weight.grad, reference[0].weight.grad, rtol=1e-5, atol=1e-5)


def test_deepcopy_refers_to_the_copied_norm():
    original = _folded_copy(_conv_and_norm(bias=True))
    image = torch.randn(2, 3, 8, 8)
    expected = original(image)  # fills the cache before the copy
    duplicate = copy.deepcopy(original)
    assert duplicate[0].norm is duplicate[1]
    assert duplicate[0].weight is not original[0].weight
    assert duplicate[1].running_var is not original[1].running_var
    assert torch.equal(duplicate(image), expected)
    duplicate[1].running_var.mul_(9)
    assert torch.equal(original(image), expected)
    assert not torch.allclose(duplicate(image), expected)


def test_deepcopy_of_folded_backbone_shares_nothing_with_the_original():
    original = build_resnet_fpn_backbone(18, out_channels=16)
    duplicate = copy.deepcopy(original)
    modules = {id(m) for m in duplicate.modules()}
    original_modules = {id(m) for m in original.modules()}
    norms = [m.norm for m in duplicate.modules() if isinstance(m, FrozenBatchNormConv2d)]
    assert len(norms) == 20
    assert all(id(norm) in modules and id(norm) not in original_modules for norm in norms)


@pytest.mark.parametrize(
    ("bias", "padding_mode"),
    [
        param(False, "zeros", id="zeros"),
        param(True, "reflect", id="reflect-bias"),
        param(False, "circular", id="circular"),
    ],
)
def test_fold_respects_bias_and_padding_mode(bias, padding_mode):
    reference = _conv_and_norm(bias=bias, padding_mode=padding_mode, frozen=False)
    folded = _folded_copy(reference)
    assert isinstance(folded[0], FrozenBatchNormConv2d) and isinstance(folded[1], FoldedFrozenBatchNorm2d)
    image = torch.randn(2, 3, 8, 8)
    assert torch.allclose(folded(image), reference(image), rtol=1e-5, atol=1e-6)
    assert "folded_frozen_batch_norm" in repr(folded[0])


def test_bf16_autocast_keeps_stage_outputs_in_bf16():
    reference = build_resnet_fpn_backbone(50, out_channels=16, fold_frozen_bn=False).body.eval()
    _randomise_norms(reference)
    folded = _folded_copy(reference).eval()
    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = reference(image)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            unfolded_bf16, folded_bf16 = reference(image), folded(image)
    assert {f.dtype for f in unfolded_bf16.values()} == {torch.float32}
    assert {f.dtype for f in folded_bf16.values()} == {torch.bfloat16}
    for name, feature in expected.items():
        error = (folded_bf16[name].float() - feature).norm() / feature.norm()
        assert error < 5e-2, name


def test_traced_folded_backbone_matches_eager():
    backbone = _randomise_norms(build_resnet_fpn_backbone(18, out_channels=16)).eval()
    generator = torch.Generator().manual_seed(6)
    example, other = (torch.randn(1, 3, 64, 64, generator=generator) for _ in range(2))
    with torch.no_grad():
        traced = torch.jit.trace(backbone, example, strict=False)
        # The traced graph must compute the fold from the shared buffers, not hold a constant copy of it.
        backbone.body.layer1[0].bn2.running_var.mul_(4)
        for image in (example, other):
            expected, actual = backbone(image), traced(image)
            assert list(actual) == list(expected)
            for name in expected:
                assert torch.allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize(
    ("trainable_layers", "expected"),
    [
        param(5, [], id="all-trainable"),
        param(
            3,
            ["conv1", "layer1.0.conv1", "layer1.0.conv2", "layer1.1.conv1", "layer1.1.conv2"],
            id="stem-and-layer1-frozen",
        ),
    ],
)
def test_trainable_batch_norm_backbone_folds_only_frozen_stages(trainable_layers, expected):
    backbone = build_resnet_fpn_backbone(18, norm="BN", trainable_layers=trainable_layers, out_channels=16)
    assert _folded_convs(backbone.body) == expected
    assert isinstance(backbone.body.layer2[0].bn1, nn.BatchNorm2d)
    assert type(backbone.body.layer2[0].conv1) is nn.Conv2d


def test_fold_skips_unfoldable_pairs():
    class MyConv(nn.Conv2d):
        pass

    model = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1), nn.GroupNorm(2, 4),
        MyConv(4, 4, 1), FrozenBatchNorm2d(4), nn.Conv2d(4, 8, 1), nn.ReLU(), FrozenBatchNorm2d(8),
    )  # fmt: skip
    kinds = [type(m) for m in model]
    assert fold_frozen_batch_norm(model) is model
    assert [type(m) for m in model] == kinds
    block = resnet18(weights=None, norm_layer=FrozenBatchNorm2d).layer2[0]
    block.bn2 = FrozenBatchNorm2d(4)  # channel count differs from conv2's
    fold_frozen_batch_norm(block)
    assert type(block.conv1) is FrozenBatchNormConv2d
    assert type(block.conv2) is nn.Conv2d and type(block.bn2) is FrozenBatchNorm2d


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        param(lambda: fold_frozen_batch_norm("resnet"), TypeError, r"module=\) must be an nn.Module; got str",
              id="not-a-module"),
        param(lambda: FrozenBatchNormConv2d(nn.Linear(2, 2), FoldedFrozenBatchNorm2d(2)), TypeError,
              r"conv=\) must be an nn.Conv2d; got Linear", id="conv-type"),
        param(lambda: FrozenBatchNormConv2d(nn.Conv2d(2, 2, 1), FrozenBatchNorm2d(2)), TypeError,
              r"norm=\) must be a FoldedFrozenBatchNorm2d; got FrozenBatchNorm2d", id="norm-type"),
        param(lambda: FrozenBatchNormConv2d(nn.Conv2d(2, 2, 1), FoldedFrozenBatchNorm2d(3)), ValueError,
              r"must have conv.out_channels=2 channels; got 3", id="channels"),
        param(lambda: FrozenBatchNormConv2d(nn.Conv2d(2, 2, 1), FoldedFrozenBatchNorm2d(2))
              ._replicate_for_data_parallel(), TypeError, r"nn.DataParallel cannot replicate", id="data-parallel"),
    ],
)  # fmt: skip
def test_invalid_use_raises(call, error, message):
    with pytest.raises(error, match=message):
        call()


def _to_batch_norm(norm: FrozenBatchNorm2d) -> nn.BatchNorm2d:
    """What a user swapping frozen norms to fine-tune them writes: a BatchNorm2d with the frozen statistics."""
    batch_norm = nn.BatchNorm2d(norm.weight.numel(), eps=norm.eps)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(batch_norm, name).copy_(getattr(norm, name))
    return batch_norm.to(norm.weight.dtype).eval()


def _swap_norms(model: nn.Module) -> nn.Module:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FrozenBatchNorm2d):  # FoldedFrozenBatchNorm2d is one too
                setattr(parent, name, _to_batch_norm(child))
    return model


def test_norms_swapped_after_folding_are_applied_once(_resnet50_float64):
    reference = copy.deepcopy(_resnet50_float64).eval()
    folded = _folded_copy(reference)
    image = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    expected = _swap_norms(copy.deepcopy(reference))(image)
    # The folded convs stay, the norms after them are BatchNorm2d now: no norm may be applied twice.
    swapped = _swap_norms(folded)
    assert len(_folded_convs(swapped)) == 53
    assert _relative_error(swapped(image), expected) < 1e-10


def test_conv_swapped_after_folding_leaves_the_norm_to_normalise():
    model = _conv_and_norm().to(torch.float64).eval()
    folded = _folded_copy(model)
    plain_conv = copy.deepcopy(model[0])
    folded[0] = plain_conv  # the folded conv replaced: its norm must normalise by itself again
    image = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    assert _relative_error(folded(image), model(image)) < 1e-12


def test_deepcopy_of_a_folded_model_follows_swaps_in_the_copy_only():
    model = _conv_and_norm().to(torch.float64).eval()
    folded = _folded_copy(model)
    copied = copy.deepcopy(folded)
    copied[1] = _to_batch_norm(model[1])
    image = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    assert _relative_error(copied(image), model(image)) < 1e-12
    assert _relative_error(folded(image), model(image)) < 1e-12
