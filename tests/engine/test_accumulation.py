"""Gradient accumulation (``train.images_per_forward``): one step of batch 8 equals 4 accumulated passes of 2."""

import itertools
from typing import NamedTuple

import pytest
import torch
from pytest import param

from lazytrain.engine.accumulation import get_batch_size, split_batch
from lazytrain.engine.train_loop import SimpleTrainer
from lazytrain.launch.launch import launch
from tests.engine import toy


def _one_step(images_per_forward=None, **options):
    torch.manual_seed(0)
    model = toy.MeanLossMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    batches = itertools.repeat(toy.regression_batch(8))
    trainer = SimpleTrainer(model, batches, optimizer, images_per_forward=images_per_forward, **options)
    if trainer.grad_scaler is not None:  # the default first scale overflows float16 here: no step is taken
        trainer.grad_scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    hook = toy.RecordingHook()
    trainer.register_hooks([hook])
    trainer.train(0, 1)
    assert [moment for moment, _ in hook.events].count("after_backward") == 1
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    losses = {name: trainer.storage.history(name).latest() for name in ("loss_mse", "loss_l1")}
    return grads, model.state_dict(), losses


@pytest.mark.parametrize(
    "options, tolerance",
    [
        param({}, 1e-6, id="fp32"),
        param({"clip_grad_enabled": True, "clip_grad_max_norm": 0.5}, 1e-6, id="clipped"),
        param({"amp_enabled": True, "amp_dtype": "float16"}, 2e-3, id="fp16-grad-scaler"),
    ],
)
def test_one_step_of_batch_8_equals_4_accumulated_passes_of_batch_2(options, tolerance):
    whole = _one_step(None, **options)
    accumulated = _one_step(2, **options)
    assert all(torch.isfinite(grad).all() for grad in accumulated[0].values())  # a step was taken
    for expected, got in zip(whole[:2], accumulated[:2]):  # gradients, weights after the step
        for name in expected:
            assert torch.allclose(got[name], expected[name], rtol=tolerance, atol=tolerance), name
    assert accumulated[2] == pytest.approx(whole[2], rel=tolerance)  # the logged losses
    if "clip_grad_enabled" in options:  # the whole gradient was clipped, not each pass's
        assert torch.cat([g.flatten() for g in accumulated[0].values()]).norm() == pytest.approx(
            0.5, rel=1e-4
        )


def test_two_processes_accumulate_without_synchronising_each_pass(tmp_path):
    launch(toy.accumulated_ddp_step, 2, use_gpu=False, args=(str(tmp_path), 2))
    ranks = [torch.load(tmp_path / f"rank{r}.pth", weights_only=True) for r in (0, 1)]
    grads, weights, losses = _one_step(None)  # one process, the whole batch of 8 at once
    for rank in ranks:
        assert rank["reductions"] == 1  # one bucket, all-reduced after the last pass only (no_sync before)
        for name, grad in grads.items():
            assert torch.allclose(rank["grads"][f"{name}"], grad, atol=1e-6), name
        for name, value in weights.items():
            assert torch.allclose(rank["weights"][name], value, atol=1e-6), name
    assert ranks[0]["loss_mse"] == pytest.approx(losses["loss_mse"], rel=1e-6)


def test_batches_split_by_their_form():
    records = [{"image_id": i} for i in range(6)]
    assert split_batch(records, 3) == [records[0:2], records[2:4], records[4:6]]
    x, y = toy.regression_batch(6)
    chunks = split_batch((x, y), 2)
    assert [type(c) for c in chunks] == [tuple, tuple] and torch.equal(chunks[1][0], x[3:])
    assert torch.equal(split_batch({"x": x}, 3)[2]["x"], x[4:])
    assert get_batch_size((x, y)) == get_batch_size({"x": x}) == get_batch_size(records) == 6
    with pytest.raises(
        TypeError, match=r"splits each training batch .*got str. Set train.images_per_forward"
    ):
        get_batch_size("not a batch")


class Pair(NamedTuple):
    images: torch.Tensor
    records: list


def test_a_named_tuple_batch_is_split_into_named_tuples():
    x, _ = toy.regression_batch(6)
    records = [{"image_id": i} for i in range(6)]
    chunks = split_batch(Pair(x, records), 3)
    assert [type(chunk) for chunk in chunks] == [Pair] * 3
    assert torch.equal(chunks[2].images, x[4:]) and chunks[2].records == records[4:]
    assert get_batch_size(Pair(x, records)) == 6


@pytest.mark.parametrize(
    "batch, got",
    [
        param(
            (torch.zeros(6), torch.zeros(4)), r"got a tuple whose parts have batch sizes \[6, 4\]", id="sizes"
        ),
        param({"x": torch.zeros(6), "id": 3}, "got a dict holding an element of type int", id="number"),
        param(torch.tensor(1.0), "got Tensor", id="scalar"),
        param({}, "got an empty dict", id="empty"),
    ],
)
def test_a_batch_that_cannot_be_split_says_what_it_holds(batch, got):
    with pytest.raises(TypeError, match=f"{got}. Set train.images_per_forward=null"):
        get_batch_size(batch)


def test_split_batch_refuses_unequal_parts():
    with pytest.raises(ValueError, match="a batch of 6 cannot be cut into 4 equal parts"):
        split_batch(list(range(6)), 4)


@pytest.mark.parametrize(
    "images_per_forward, error, message",
    [
        param(
            3, ValueError, r"images_per_forward=3\) must divide .*batch of 8 .*one of \[1, 2, 4, 8\]", id="3"
        ),
        param(0, ValueError, r"must be an integer >= 1 or None .*got 0 \(train.images_per_forward\)", id="0"),
    ],
)
def test_an_accumulation_that_does_not_fit_names_the_key(images_per_forward, error, message):
    with pytest.raises(error, match=message):
        _one_step(images_per_forward)
