import os
import pickle
import subprocess
import sys

import pytest
import torch
from iopath.common.file_io import PathHandler
from pytest import param

from lazytrain.engine import checkpoint as checkpoint_module
from lazytrain.engine.checkpoint import Checkpointer, get_last_checkpoint, load_model_state
from lazytrain.errors import CheckpointError
from tests.engine import toy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def test_get_last_checkpoint_reads_what_save_names_and_none_without_it(tmp_path):
    assert get_last_checkpoint(str(tmp_path)) is None and get_last_checkpoint("") is None
    checkpointer = Checkpointer(toy.ToyRegressor(), str(tmp_path))
    assert not checkpointer.has_checkpoint() and checkpointer.get_checkpoint_file() == ""
    checkpointer.save("model_0000002", iteration=2)
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "model_0000002.pth")
    assert checkpointer.has_checkpoint() and checkpointer.get_checkpoint_file() == str(
        tmp_path / "model_0000002.pth"
    )


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
        return (open, (EVIL_MARKER, "w"))


class _TrustedBlob:
    """A custom object: fine to unpickle, but not a weights-only type."""

    def __init__(self, value):
        self.value = value


EVIL_MARKER = "/tmp/lazytrain_evil_marker"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning:torch")
@pytest.mark.parametrize("writer", [param(torch.save, id="torch.save"), param(pickle.dump, id="raw-pickle")])
def test_weights_only_refuses_code_running_pickle(tmp_path, writer):
    if os.path.exists(EVIL_MARKER):
        os.remove(EVIL_MARKER)
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        writer({"model": {}, "payload": _Evil()}, f)
    assert not os.path.exists(EVIL_MARKER)
    with pytest.raises(
        ValueError, match=r"refused to load .*evil\.pth: it needs arbitrary unpickling.*allow_unsafe=True"
    ):
        Checkpointer(toy.ToyRegressor()).load(str(path))
    assert not os.path.exists(EVIL_MARKER)


def test_allow_unsafe_loads_a_trusted_file(tmp_path):
    model = toy.ToyRegressor()
    path = tmp_path / "trusted.pth"
    torch.save({"model": model.state_dict(), "note": _TrustedBlob(3)}, path)
    with pytest.raises(ValueError, match="arbitrary unpickling"):
        Checkpointer(toy.ToyRegressor()).load(str(path))
    extra = Checkpointer(toy.ToyRegressor(), allow_unsafe=True).load(str(path))
    assert extra["note"].value == 3


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        param(lambda data: data[: len(data) // 2], "a truncated or damaged torch file", id="truncated"),
        param(lambda data: b"# README\nnot weights\n", r"not a torch file \(neither a zip", id="text"),
        param(lambda data: b"", "empty", id="empty"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_says_so(tmp_path, content, reason):
    Checkpointer(toy.ToyRegressor(), str(tmp_path)).save("model_a", iteration=1)
    (tmp_path / "bad.pth").write_bytes(content((tmp_path / "model_a.pth").read_bytes()))
    with pytest.raises(
        CheckpointError, match=rf"Checkpointer: .*bad\.pth is not a checkpoint: {reason}"
    ) as error:
        Checkpointer(toy.ToyRegressor()).load(str(tmp_path / "bad.pth"))
    assert "unpickling" not in str(error.value)


def test_sigkill_during_save_leaves_last_checkpoint_loadable(tmp_path):
    code = (
        "import os, signal, sys, torch\n"
        "from lazytrain.engine import checkpoint\n"
        "from tests.engine.toy import ToyRegressor\n"
        "c = checkpoint.Checkpointer(ToyRegressor(), sys.argv[1])\n"
        "c.save('model_0000001', iteration=1)\n"
        "real = torch.save\n"
        "def dying(obj, f):\n"
        "    f.write(b'partial bytes')\n"
        "    f.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "checkpoint.torch.save = dying\n"
        "c.save('model_0000002', iteration=2)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, timeout=120
    )
    assert result.returncode == -9, result.stderr
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"
    assert not (tmp_path / "model_0000002.pth").exists()
    checkpointer = Checkpointer(toy.ToyRegressor(), str(tmp_path))
    assert checkpointer.load(checkpointer.get_checkpoint_file())["iteration"] == 1


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


def test_module_prefix_handled_both_ways(tmp_path):
    plain = toy.ToyRegressor()
    # With exactly one GPU visible, DataParallel moves its module to cuda:0; only the wrapper matters here (the
    # module is never run through it), so it goes back to the CPU, where `plain` and the loaded files are.
    wrapped = torch.nn.DataParallel(toy.ToyRegressor()).cpu()
    assert wrapped.module.linear.weight.device.type == "cpu"
    Checkpointer(wrapped, str(tmp_path / "w")).save("m")
    saved = torch.load(tmp_path / "w" / "m.pth", weights_only=True)["model"]
    assert not any(key.startswith("module.") for key in saved)  # wrapper keys never reach the file
    Checkpointer(plain).load(str(tmp_path / "w" / "m.pth"))
    assert torch.equal(plain.linear.weight, wrapped.module.linear.weight)
    torch.save(
        {"model": {f"module.{k}": v for k, v in plain.state_dict().items()}}, tmp_path / "prefixed.pth"
    )
    report = load_model_state(wrapped, torch.load(tmp_path / "prefixed.pth", weights_only=True)["model"])
    assert str(report) == "all keys matched"
    assert torch.equal(wrapped.module.linear.weight, plain.linear.weight)


class _DirectoryHandler(PathHandler):
    """iopath handler mapping ``lazytrain-test://NAME`` to a local directory."""

    PREFIX = "lazytrain-test://"

    def __init__(self, root):
        super().__init__()
        self.root = root

    def _get_supported_prefixes(self):
        return [self.PREFIX]

    def _get_local_path(self, path, **kwargs):
        return os.path.join(self.root, path[len(self.PREFIX) :])

    def _open(self, path, mode="r", **kwargs):
        return open(self._get_local_path(path), mode)


def test_load_through_an_iopath_uri(tmp_path):
    model = toy.ToyRegressor()
    Checkpointer(model, str(tmp_path)).save("remote", iteration=7)
    checkpoint_module.PathManager.register_handler(_DirectoryHandler(str(tmp_path)), allow_override=True)
    other = toy.ToyRegressor()
    assert Checkpointer(other).load("lazytrain-test://remote.pth")["iteration"] == 7
    assert torch.equal(other.linear.weight, model.linear.weight)


def test_resume_or_load(tmp_path, caplog):
    model = toy.ToyRegressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(toy_batch())["loss_mse"].backward()
    optimizer.step()
    Checkpointer(model, str(tmp_path / "run"), optimizer=optimizer).save("model_0000003", iteration=3)

    fresh_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731
    other = toy.ToyRegressor()
    resumed = Checkpointer(other, str(tmp_path / "run"), optimizer=fresh_opt(other))
    assert resumed.resume_or_load("", resume=True) == {"iteration": 3}
    assert resumed.checkpointables["optimizer"].state_dict()["state"]  # momentum restored

    other = toy.ToyRegressor()
    weights_only = Checkpointer(other, str(tmp_path / "new"), optimizer=fresh_opt(other))
    weights_only.resume_or_load(str(tmp_path / "run" / "model_0000003.pth"), resume=True)  # nothing to resume
    assert torch.equal(other.linear.weight, model.linear.weight)
    assert not weights_only.checkpointables["optimizer"].state_dict()["state"]  # weights only

    with caplog.at_level("WARNING", logger="lazytrain.engine.checkpoint"):
        Checkpointer(toy.ToyRegressor(), trainer=toy.RecordingHook()).load(
            str(tmp_path / "run" / "model_0000003.pth")
        )
    assert "has no 'trainer' state; it is not restored" in caplog.text
