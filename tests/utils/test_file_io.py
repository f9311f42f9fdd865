import os
import subprocess
import sys

import pytest
import torch

from lazytrain.errors import CheckpointError
from lazytrain.utils import file_io
from lazytrain.utils.file_io import atomic_write, get_non_checkpoint_reason, load_torch_file


class _Opaque:
    """Pickled by reference: loading it needs arbitrary unpickling."""


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_reasons_for_files_that_are_not_checkpoints(tmp_path):
    saved = str(tmp_path / "model.pth")
    torch.save({"w": torch.ones(2)}, saved)
    with open(saved, "rb") as f:
        whole = f.read()
    assert get_non_checkpoint_reason(saved) is None
    assert get_non_checkpoint_reason(_write(tmp_path / "legacy.pkl", b"\x80\x02}q\x00.")) is None
    assert get_non_checkpoint_reason(_write(tmp_path / "empty.pth", b"")) == "empty"
    assert get_non_checkpoint_reason(_write(tmp_path / "half.pth", whole[: len(whole) // 2])) == (
        "a truncated or damaged torch file"
    )
    assert get_non_checkpoint_reason(_write(tmp_path / "page.pth", b"<html>404</html>")) == (
        "not a torch file (neither a zip archive nor a pickle)"
    )
    reason = get_non_checkpoint_reason(str(tmp_path / "absent.pth"))
    assert reason.startswith("cannot be read (") and "No such file" in reason


def test_load_torch_file_reads_weights_on_cpu(tmp_path):
    path = str(tmp_path / "model.pth")
    torch.save({"model": {"w": torch.arange(3.0)}, "iteration": 7}, path)
    data = load_torch_file(path, path, allow_unsafe=False, reader="test")
    assert data["iteration"] == 7 and data["model"]["w"].device.type == "cpu"
    assert torch.equal(data["model"]["w"], torch.arange(3.0))


def test_load_torch_file_errors_name_the_reader_and_the_file(tmp_path):
    damaged = _write(tmp_path / "damaged.pth", b"PK\x03\x04 cut short")
    with pytest.raises(CheckpointError, match=r"^reader: .*damaged\.pth is not a checkpoint: a truncated"):
        load_torch_file(damaged, damaged, allow_unsafe=False, reader="reader")
    unsafe = str(tmp_path / "unsafe.pth")
    torch.save({"object": _Opaque()}, unsafe)
    with pytest.raises(CheckpointError, match=r"refused to load .*unsafe\.pth.*allow_unsafe=True"):
        load_torch_file(unsafe, unsafe, allow_unsafe=False, reader="reader")
    assert isinstance(load_torch_file(unsafe, unsafe, allow_unsafe=True, reader="reader")["object"], _Opaque)


def test_atomic_write_replaces_whole_files_and_leaves_nothing_when_writing_fails(tmp_path):
    path = str(tmp_path / "last_checkpoint")
    atomic_write(path, lambda f: f.write(b"model_0000001.pth"))
    atomic_write(path, lambda f: f.write(b"model_0000002.pth"))

    def fail(f):
        f.write(b"model_00")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail)
    with open(path, "rb") as f:
        assert f.read() == b"model_0000002.pth"
    assert os.listdir(tmp_path) == ["last_checkpoint"]


def test_every_layer_reads_files_through_the_one_path_manager():
    from lazytrain.data import mappers
    from lazytrain.data.datasets import coco
    from lazytrain.engine import checkpoint

    assert checkpoint.PathManager is coco.PathManager is mappers.PathManager is file_io.PathManager


def test_importing_file_io_does_not_import_torch():
    code = "import sys, lazytrain.utils.file_io; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
