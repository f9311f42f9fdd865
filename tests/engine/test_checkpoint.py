import os
import pickle

import pytest
import torch

from lazytrain.engine import checkpoint as checkpoint_module
from lazytrain.engine.checkpoint import Checkpointer, load_model_state
from tests.engine import toy


def test_save_load_round_trip_with_checkpointables(tmp_path):
    model = toy.ToyRegressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(toy_batch())["loss_mse"].backward()
    optimizer.step()
    Checkpointer(model, str(tmp_path), optimizer=optimizer).save("model_0000001", iteration=1)
    other = toy.ToyRegressor()
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    extra = Checkpointer(other, str(tmp_path), optimizer=other_opt).load(str(tmp_path / "model_0000001.pth"))
    assert extra == {"iteration": 1}
    assert torch.equal(other.linear.weight, model.linear.weight)
    assert other_opt.state_dict()["state"][0]["momentum_buffer"].equal(
        optimizer.state_dict()["state"][0]["momentum_buffer"]
    )
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def toy_batch():
    return torch.randn(8, 4), torch.randn(8)


def test_interrupted_write_never_corrupts_last_checkpoint(tmp_path, monkeypatch):
    model = toy.ToyRegressor()
    checkpointer = Checkpointer(model, str(tmp_path))
    checkpointer.save("model_0000004", iteration=4)

    real_save = torch.save

    def dying_save(obj, f):
        real_save(obj, f)
        f.truncate(100)  # half-written file
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(checkpoint_module.torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save("model_0000009", iteration=9)
    monkeypatch.undo()
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "model_0000009.pth").exists()
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]
    assert (
        Checkpointer(toy.ToyRegressor(), str(tmp_path)).load(checkpointer.get_checkpoint_file())["iteration"]
        == 4
    )


def test_unwritable_dir_error_names_path_and_keeps_previous(tmp_path, monkeypatch):
    checkpointer = Checkpointer(toy.ToyRegressor(), str(tmp_path))
    checkpointer.save("model_a", iteration=1)

    def full_disk(obj, f):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", full_disk)
    with pytest.raises(OSError, match=r"could not write checkpoint .*model_b\.pth.*No space left"):
        checkpointer.save("model_b", iteration=2)
    monkeypatch.undo()
    assert checkpointer.load(checkpointer.get_checkpoint_file())["iteration"] == 1


class _Evil:
    def __reduce__(self):
        return (open, ("/tmp/lazytrain_evil_marker", "w"))


def test_weights_only_refuses_code_running_pickle(tmp_path):
    marker = "/tmp/lazytrain_evil_marker"
    if os.path.exists(marker):
        os.remove(marker)
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"model": {}, "payload": _Evil()}, f)
    with pytest.raises(ValueError, match="needs arbitrary unpickling.*allow_unsafe=True"):
        Checkpointer(toy.ToyRegressor()).load(str(path))
    assert not os.path.exists(marker)


def test_missing_checkpoint_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.pth"):
        Checkpointer(toy.ToyRegressor()).load(str(tmp_path / "nothere.pth"))


def test_non_strict_load_reports_mismatches():
    model = toy.ToyRegressor(dim=4)
    state = toy.ToyRegressor(dim=3).state_dict()
    state = {f"module.{k}": v for k, v in state.items()}
    state["module.extra.weight"] = torch.zeros(1)
    del state["module.linear.bias"]
    report = load_model_state(model, state)
    assert ("linear.weight", (1, 3), (1, 4)) in report.shape_mismatched
    assert "linear.bias" in report.missing and "linear.weight" not in report.missing
    assert report.unexpected == ["extra.weight"]
    assert "shape mismatch" in str(report)
