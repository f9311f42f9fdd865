"""Batch transport: worker batches arrive intact through the packed ring buffers; pinned batches are asked for
with a bool or the training device, only with CUDA, without changing the batches or the resume state. This
machine has no CUDA: pinning is replaced by a recording copy."""

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from pytest import param

from lazytrain.config import LazyConfig
from lazytrain.data import batch_transport
from lazytrain.data.build import build_detection_test_loader, build_detection_train_loader
from tests.data.loader_helpers import assert_same, make_records, round_trip, take, tensor_mapper


def _train_loader(num_workers, pin_memory):
    return build_detection_train_loader(
        make_records(), mapper=tensor_mapper, total_batch_size=3, num_workers=num_workers, seed=1,
        pin_memory=pin_memory,
    )  # fmt: skip


@pytest.mark.parametrize("ring_bytes", [None, 1_000_000])
def test_worker_batches_arrive_intact_through_the_packed_buffer(ring_bytes, monkeypatch):
    # 40 batches: each worker refills each of its ring slots several times while the test holds every batch;
    # with 1 MB for the whole ring (100 kB per slot) some batches do not fit and travel in their own segment
    if ring_bytes is not None:
        monkeypatch.setattr(batch_transport, "_RING_BYTES", ring_bytes)

    def loader(num_workers):
        return build_detection_train_loader(
            make_records(), mapper=tensor_mapper, total_batch_size=3, num_workers=num_workers, seed=1
        )

    received = take(loader(2), 40)
    assert_same(received, take(loader(0), 40))
    if ring_bytes is not None:
        sizes = [sum(5 * item["image"][0].numel() for item in batch) for batch in received]  # image + masks
        assert min(sizes) < 100_000 < max(sizes)  # both paths were taken


@pytest.mark.parametrize(
    ("pin_memory", "cuda", "pinned"),
    [
        param(True, True, True, id="true"),
        param("cuda", True, True, id="cuda"),
        param("cuda:1", True, True, id="cuda-1"),
        param(torch.device("cuda", 0), True, True, id="torch-device"),
        param("cpu", True, False, id="cpu"),
        param(False, True, False, id="false"),
        param(True, False, False, id="true-without-cuda"),
        param("cuda", False, False, id="cuda-without-cuda"),
    ],
)
def test_pin_memory_follows_the_device_and_needs_cuda(monkeypatch, pin_memory, cuda, pinned):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert _train_loader(0, pin_memory).pin_memory is pinned
    assert (
        build_detection_test_loader(make_records(4), mapper=None, pin_memory=pin_memory).pin_memory is pinned
    )


@pytest.mark.parametrize(
    ("pin_memory", "error", "message"),
    [
        param(
            "gpu",
            ValueError,
            r"\(pin_memory=\) must be a bool or a device such as 'cuda' or 'cpu'; got 'gpu'",
            id="str",
        ),
        param(1, TypeError, r"\(pin_memory=\) must be a bool or a device .*; got int 1", id="int"),
    ],
)
def test_pin_memory_must_be_a_bool_or_a_device(pin_memory, error, message):
    with pytest.raises(error, match="build_detection_train_loader" + message):
        _train_loader(0, pin_memory)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nothing_changes_on_a_machine_without_cuda(num_workers):
    assert not torch.cuda.is_available(), "this test is about CPU-only machines"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's DataLoader warns when asked to pin without an accelerator
        pinned = take(_train_loader(num_workers, "cuda"), 6)
        tested = list(build_detection_test_loader(make_records(4), mapper=None, pin_memory=True))
    assert_same(pinned, take(_train_loader(0, False), 6))
    assert [record["image_id"] for batch in tested for record in batch] == [0, 1, 2, 3]


class _RecordingPinner:
    """Stands in for pinning on a machine without CUDA: plain copies, remembered by address."""

    def __init__(self):
        self.buffers = []

    def empty(self, nbytes):
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        self.buffers.append(buffer)
        return buffer

    def pin(self, tensor):
        copy = tensor.clone()
        self.buffers.append(copy)
        return copy

    def holds(self, tensor):
        start = tensor.untyped_storage().data_ptr()
        return any(
            b.data_ptr() <= start < b.data_ptr() + max(b.untyped_storage().nbytes(), 1) for b in self.buffers
        )


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    return [tensor for value in values for tensor in _tensors(value)]


@pytest.mark.parametrize("num_workers", [param(0, id="no-workers"), param(2, id="workers")])
def test_pinned_batches_are_the_same_and_resume_exactly(monkeypatch, num_workers):
    reference_loader = _train_loader(num_workers, False)
    stream = iter(reference_loader)
    reference = [next(stream) for _ in range(5)]
    reference_state = reference_loader.state_dict()
    del stream

    pinner = _RecordingPinner()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(batch_transport, "_pinned_empty", pinner.empty)
    monkeypatch.setattr(batch_transport, "_pin", pinner.pin)
    loader = _train_loader(num_workers, "cuda")
    stream = iter(loader)
    pinned = [next(stream) for _ in range(5)]
    state = round_trip(loader.state_dict())
    del stream
    assert_same(pinned, reference)
    assert_same(state, round_trip(reference_state))
    assert state["batches"] == 5
    tensors = [t for batch in pinned for t in _tensors(batch)]
    assert len(tensors) == 5 * 3 * 6  # image, boxes, classes, masks, empty, transposed per image
    assert all(pinner.holds(t) for t in tensors), "every tensor of a batch lives in pinned memory"
    # With workers: one pinned buffer per batch (the copy out of the ring slot), none per tensor.
    assert len(pinner.buffers) == (5 if num_workers else len(tensors))

    resumed = _train_loader(num_workers, "cuda")
    resumed.load_state_dict(state)
    assert_same(take(resumed, 3), take(_train_loader(0, False), 8)[5:])


def test_recipes_pin_when_training_on_cuda():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for recipe in ("coco", "lvis_v1", "synthetic_lt", "custom"):
        loaders = OmegaConf.to_container(
            LazyConfig.load(str(root / "recipes" / "data" / f"{recipe}.py")).dataloader, resolve=False
        )
        assert loaders["train"]["pin_memory"] == loaders["test"]["pin_memory"] == "${train.device}", recipe
