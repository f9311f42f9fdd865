"""The model's copies of its inputs to its device are non-blocking (they overlap with the GPU's work when the loader
pins its batches) and, on the CPU, no copies at all."""

import torch

from tests.modeling.helpers import build_model, make_record


def _record_copies(monkeypatch):
    """Every ``Tensor.to`` call to a device: (address of the tensor's data, positional args, keyword args)."""
    calls = []
    original = torch.Tensor.to

    def recording(self, *args, **kwargs):
        if "device" in kwargs or (args and isinstance(args[0], (torch.device, str))):
            calls.append((self.data_ptr(), args, kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recording)
    return calls


def test_inputs_are_copied_without_blocking(monkeypatch):
    model = build_model().train()
    record = make_record(96, 128)
    inputs = {"image": record["image"], **record["instances"]}
    calls = _record_copies(monkeypatch)
    losses = model([record])
    monkeypatch.undo()
    assert torch.isfinite(sum(losses.values()))
    for name, tensor in inputs.items():
        copies = [(args, kwargs) for pointer, args, kwargs in calls if pointer == tensor.data_ptr()]
        assert copies == [((torch.device("cpu"),), {"non_blocking": True})], name


def test_on_the_cpu_the_targets_are_the_inputs(monkeypatch):
    model = build_model().train()
    record = make_record(64, 80)
    target = model._to_target(record, torch.device("cpu"))
    instances = record["instances"]
    assert target["boxes"].data_ptr() == instances["boxes"].data_ptr()  # no copy
    assert target["masks"] is instances["masks"]
    assert torch.equal(target["labels"], instances["classes"] + 1) and target["labels"].dtype == torch.int64
    assert torch.equal(instances["classes"], make_record(64, 80)["instances"]["classes"])  # left as it was
