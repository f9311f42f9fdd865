"""`RCNN.compile_backbone` (``train.compile``) and `pad_to_sizes`: training batches padded to fixed sizes, the
backbone compiled for them with the same losses and gradients as eager, and a clear error where shapes vary."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.image_batch import NoResizeTransform
from tests.modeling.helpers import build_model, make_record


def _transform(pad_to_sizes):
    return NoResizeTransform([0.0] * 3, [1.0] * 3, 32, pad_to_sizes)


def _batch(transform, sizes):
    images = [torch.ones(3, height, width) for height, width in sizes]
    return transform(images)[0]


def test_training_batches_are_padded_to_the_smallest_size_that_holds_them():
    transform = _transform([[96, 96], [64, 96], [96, 64]]).train()
    assert transform.pad_to_sizes == ((64, 96), (96, 64), (96, 96))  # by area
    assert _batch(transform, [(50, 90), (40, 40)]).tensors.shape == (2, 3, 64, 96)
    assert _batch(transform, [(90, 50)]).tensors.shape == (1, 3, 96, 64)
    batch = _batch(transform, [(70, 70), (30, 20)])
    assert batch.tensors.shape == (2, 3, 96, 96) and batch.image_sizes == [(70, 70), (30, 20)]
    assert batch.tensors[1, :, :30, :20].eq(1).all() and batch.tensors[1].sum() == 3 * 30 * 20
    # Evaluation pads by size_divisible, as without pad_to_sizes.
    assert _batch(transform.eval(), [(50, 40)]).tensors.shape == (1, 3, 64, 64)


def test_a_training_batch_larger_than_every_size_is_refused_with_the_size_to_add():
    transform = _transform([[64, 64]]).train()
    with pytest.raises(ValueError) as error:
        _batch(transform, [(70, 40)])
    assert str(error.value) == (
        "RCNN(pad_to_sizes=[[64, 64]]): a training batch has images up to 70 x 40 px (height x width), which fit "
        "none of these sizes. Add a size that holds them (model.pad_to_sizes=[..., [96, 64]]) or make the train "
        "mapper's images smaller."
    )


@pytest.mark.parametrize("sizes", [[[64, 70]], [[64]], [64, 64], [[True, 64]], [], "64x64", [[0, 64]]])
def test_pad_to_sizes_must_be_pairs_of_multiples_of_size_divisible(sizes):
    with pytest.raises(ValueError, match=r"RCNN\(pad_to_sizes=\) must be a list of \[height, width\] pairs"):
        _transform(sizes)


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
    model.compile_backbone(backend="aot_eager")
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
    model.compile_backbone(backend="aot_eager")
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
