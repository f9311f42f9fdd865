"""`RCNN.compile_backbone` (``train.compile``, `lazytrain.modeling.compiled_backbone`): the backbone compiled for
the padded training sizes with the same losses and gradients as eager, kept out of the module tree and of
copies, and a clear error where shapes vary."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from tests.modeling.helpers import build_model, make_record


def _records(size, count=2):
    return [make_record(*size, seed=seed) for seed in range(count)]


def _step(model, records, seed=0):
    """Losses and parameter gradients of one training step (the RPN's and RoI heads' draws seeded)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    losses = model(records)
    sum(losses.values()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {name: value.detach() for name, value in losses.items()}, grads


def _assert_same_step(got, expected, tolerance):
    (losses, grads), (expected_losses, expected_grads) = got, expected
    assert losses.keys() == expected_losses.keys() and grads.keys() == expected_grads.keys()
    for name in expected_losses:
        torch.testing.assert_close(losses[name], expected_losses[name], rtol=tolerance, atol=tolerance)
    for name in expected_grads:
        torch.testing.assert_close(
            grads[name], expected_grads[name], rtol=tolerance, atol=tolerance, msg=name
        )


def test_the_compiled_backbone_gives_eager_losses_and_gradients_and_keeps_the_checkpoint_keys():
    model = build_model(overrides=("model.num_classes=3", "model.pad_to_sizes=[[128,128]]")).train()
    eager = copy.deepcopy(model)
    model.compile_backbone(backend="aot_eager")
    records = _records((96, 112))
    for seed in range(2):  # the second step runs the compiled graphs again, after a BN statistics update
        _assert_same_step(_step(model, records, seed), _step(eager, records, seed), 1e-5)
    assert model.compiled_backbone.input_shapes == [(2, 3, 128, 128)]
    assert list(model.state_dict()) == list(eager.state_dict())
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # A copy (EMA, checkpoint tooling) compiles its own backbone, not the original's.
    duplicate = copy.deepcopy(model)
    assert model.compiled_backbone.compiled is not None and duplicate.compiled_backbone.compiled is None
    assert duplicate.compiled_backbone.input_shapes == [(2, 3, 128, 128)]
    _step(duplicate, records)
    assert duplicate.compiled_backbone.compiled._orig_mod is duplicate.backbone
    # Outside the module tree: no state-dict keys or parameters of its own, and a pickled model drops it.
    assert not any("_orig_mod" in name for name, _ in model.named_modules())
    assert pickle.loads(pickle.dumps(model)).compiled_backbone.compiled is None


def test_a_new_training_shape_raises_but_evaluation_runs_eager_at_any_size():
    model = build_model().train()
    model.compile_backbone(backend="eager")
    _step(model, _records((64, 64)))
    with pytest.raises(ValueError) as error:
        _step(model, _records((96, 64)))
    assert "compiled for the input shape [2, 3, 64, 64] and a training batch now has [2, 3, 96, 64]" in str(
        error.value
    )
    assert "model.pad_to_sizes=[[H, W]]" in str(error.value) and "train.compile.enabled=false" in str(
        error.value
    )
    model.eval()
    with torch.no_grad():
        outputs = model([{"image": record["image"]} for record in _records((96, 64), 1)])
    assert outputs[0]["instances"]["boxes"].shape[1] == 4
    assert model.compiled_backbone.input_shapes == [(2, 3, 64, 64)]


def test_one_compiled_shape_per_padded_size():
    model = build_model(overrides=("model.num_classes=3", "model.pad_to_sizes=[[64,96],[96,64]]")).train()
    model.compile_backbone(backend="eager")
    for size in [(60, 90), (90, 60), (50, 50)]:
        _step(model, _records(size))
    assert model.compiled_backbone.input_shapes == [(2, 3, 64, 96), (2, 3, 96, 64)]


@pytest.mark.slow
def test_inductor_compiles_the_folded_frozen_bn_backbone_with_eager_outputs_and_gradients():
    """What a GPU compiles in the R50 recipe (FrozenBN folded into the convolutions), here inductor's C++
    code on a ResNet-18 at 64 px."""
    torch.manual_seed(0)
    backbone = build_resnet_fpn_backbone(depth=18, norm="FrozenBN", trainable_layers=3, fold_frozen_bn=True)
    images = torch.randn(2, 3, 64, 64)
    compiled = torch.compile(copy.deepcopy(backbone), dynamic=False)
    results = []
    for module in (backbone, compiled):
        outputs = module(images)
        sum((value * (index + 1)).sum() for index, value in enumerate(outputs.values())).backward()
        results.append(
            (outputs, {name: p.grad for name, p in module.named_parameters() if p.grad is not None})
        )
    (eager_outputs, eager_grads), (compiled_outputs, compiled_grads) = results
    # Relative to each tensor's largest value (generated code sums in other orders: ~2e-6 seen here).
    for name in eager_outputs:
        assert _relative_error(compiled_outputs[name], eager_outputs[name]) < 1e-4, name
    assert compiled_grads.keys() == {f"_orig_mod.{name}" for name in eager_grads}
    for name, grad in eager_grads.items():
        assert _relative_error(compiled_grads[f"_orig_mod.{name}"], grad) < 1e-4, name


def _relative_error(got, expected):
    return float((got - expected).detach().abs().max() / expected.detach().abs().max())
