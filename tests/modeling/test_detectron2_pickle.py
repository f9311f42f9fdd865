"""The unpickler of detectron2 zoo files (`read_detectron2_pickle`): numeric numpy arrays of every pickle protocol
and of Python 2 are read; object and structured arrays, and arrays larger than the file, are refused in one line
before numpy builds them."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from lazytrain.errors import CheckpointError
from lazytrain.modeling.detectron2_weights import read_detectron2_pickle

KEY = b"backbone.bottom_up.stem.conv1.weight"


def _global(module: bytes, name: bytes) -> bytes:
    """Protocol 4's STACK_GLOBAL of module.name."""
    return b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name + b"\x93"


def _object_array_short_list() -> bytes:
    """{"model": {KEY: an object array of shape (4,) whose pickled element list is empty}}: numpy's own
    ``__setstate__`` reads past the list (a segmentation fault)."""
    reconstruct = _global(b"numpy.core.multiarray", b"_reconstruct") + _global(b"numpy", b"ndarray")
    reconstruct += b"(K\x00tC\x01b\x87R"
    object_dtype = _global(b"numpy", b"dtype") + b"\x8c\x02O8\x89\x88\x87R"
    object_dtype += b"(K\x03\x8c\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tb"
    array = reconstruct + b"(K\x01(K\x04t" + object_dtype + b"\x89]tb"
    return b"\x80\x04}\x8c\x05model}\x8c" + bytes([len(KEY)]) + KEY + array + b"ss."


def _write(tmp_path, data: bytes) -> str:
    path = tmp_path / "model_final_x.pkl"
    path.write_bytes(data)
    return str(path)


def test_an_object_array_whose_list_is_shorter_than_its_shape_is_refused_not_run(tmp_path):
    # In a child process: before the fix numpy read out of bounds and crashed the interpreter.
    path = _write(tmp_path, _object_array_short_list())
    code = (
        "import sys\nfrom lazytrain.modeling.detectron2_weights import read_detectron2_pickle\n"
        "try:\n    read_detectron2_pickle(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    result = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("CheckpointError load_init_weights: refused to read")
    assert "dtype 'O8'; only numeric and bool arrays are read" in result.stdout
    assert len(result.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "array, refusal",
    [
        (np.array([1, "x", {"k": 2}], dtype=object), "dtype 'O8'"),
        (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i8")]), "dtype 'V12'"),
        (np.array(["ab", "c"]), "dtype 'U2'"),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), "dtype 'M8'"),
    ],
    ids=["object", "structured", "unicode", "datetime"],
)
@pytest.mark.parametrize("protocol", [2, 5])
def test_arrays_of_other_than_numeric_dtypes_are_refused_in_one_line(tmp_path, array, refusal, protocol):
    path = _write(tmp_path, pickle.dumps({"model": {KEY.decode(): array}}, protocol=protocol))
    with pytest.raises(CheckpointError) as error:
        read_detectron2_pickle(path)
    assert f"refused to read {path} as a detectron2 pickle: an array of {refusal}" in str(error.value)
    assert "\n" not in str(error.value)


def _huge_array_without_data(elements: int) -> bytes:
    """An array that names `elements` bytes and gives none (numpy would allocate them lazily)."""
    out = b"\x80\x04}\x8c\x05model}\x8c" + bytes([len(KEY)]) + KEY
    out += _global(b"numpy.core.multiarray", b"_reconstruct") + _global(b"numpy", b"ndarray")
    out += b"(\x8a\x08" + elements.to_bytes(8, "little") + b"tC\x01b\x87R"
    return out + b"ss."


class _SharedBuffer:
    """Pickles as numpy's protocol 5 array of a buffer that the pickle stores once and reuses (its memo)."""

    buffer = bytes(1 << 16)

    def __reduce__(self):
        numeric = np._core.numeric if hasattr(np, "_core") else np.core.numeric  # numpy 2 / numpy 1
        return numeric._frombuffer, (self.buffer, np.dtype("u1"), (len(self.buffer),), "C")


@pytest.mark.parametrize("case", ["no data", "no data, 1e12 elements", "one buffer reused"])
def test_arrays_larger_than_the_file_are_refused_before_they_are_allocated(tmp_path, case):
    if case == "one buffer reused":
        data = pickle.dumps({"model": {f"k{i}": _SharedBuffer() for i in range(64)}}, protocol=4)
        assert len(data) < 2 << 16  # 64 arrays of 64 KiB from a file of one
        expected = "beyond the file's size"
    else:
        data = _huge_array_without_data(10**12 if "1e12" in case else 800_000_000)
        expected = "an array without its data"
    path = _write(tmp_path, data)
    with pytest.raises(CheckpointError, match=f"refused to read .* as a detectron2 pickle: .*{expected}"):
        read_detectron2_pickle(path)


def test_a_bytes_object_longer_than_the_file_is_one_line_not_an_uncaught_error(tmp_path):
    # BINBYTES8 claiming 100 GB: the unpickler allocates it (MemoryError) or finds the file truncated.
    path = _write(tmp_path, b"\x80\x04\x8e" + (10**11).to_bytes(8, "little") + b"abc")
    with pytest.raises(
        CheckpointError, match=r"is not a readable pickle: (MemoryError|pickle data was truncated)"
    ):
        read_detectron2_pickle(path)


@pytest.mark.parametrize("protocol", range(6))
def test_numeric_arrays_load_at_every_pickle_protocol(tmp_path, protocol):
    model = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.asfortranarray(np.arange(6, dtype=">f8").reshape(2, 3)),
        "c": np.array([True, False]),
        "d": np.arange(4, dtype=np.int64),
        "s": np.float32(2.5),
    }
    path = _write(tmp_path, pickle.dumps({"model": model, "__author__": "zoo"}, protocol=protocol))
    loaded = read_detectron2_pickle(path)
    assert loaded["__author__"] == "zoo"
    for key, value in model.items():
        assert loaded["model"][key].dtype == value.dtype and np.array_equal(loaded["model"][key], value), key


def _text(value: bytes) -> bytes:
    """Python 2's str in a pickle (SHORT_BINSTRING)."""
    return b"U" + bytes([len(value)]) + value


def _python2_pickle(values: np.ndarray) -> bytes:
    """What Python 2's cPickle (protocol 2) writes for {"model": {"w": values}} with float32 `values`: GLOBAL
    opcodes, str (SHORT_BINSTRING) keys, dtype and data, the data's bytes as a str of the same characters."""
    dtype = b"cnumpy\ndtype\n" + b"(" + _text(b"f4") + b"K\x00K\x01tR"
    dtype += b"(K\x03" + _text(b"<") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    data = values.astype("<f4").tobytes()
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\n"
        + b"cnumpy\nndarray\n"
        + b"K\x00\x85"
        + _text(b"b")
        + b"\x87R"
    )
    array += b"(K\x01" + b"(" + b"".join(b"K" + bytes([n]) for n in values.shape) + b"t"
    array += dtype + b"\x89" + _text(data) + b"tb"
    return b"\x80\x02}(" + _text(b"model") + b"}(" + _text(b"w") + array + b"uu."


def test_a_python2_pickle_loads_with_its_str_data_read_as_latin1(tmp_path):
    values = np.array([[-1.5, 2.0, 3.25], [1e-3, -7.0, 0.0]], dtype=np.float32)
    data = _python2_pickle(values)
    assert any(byte >= 0x80 for byte in values.tobytes())  # characters beyond ASCII in the str
    assert struct.pack("<f", -1.5) in data
    loaded = read_detectron2_pickle(_write(tmp_path, data))
    assert loaded["model"]["w"].dtype == np.float32 and np.array_equal(loaded["model"]["w"], values)


@pytest.mark.parametrize(
    "payload, refusal",
    [
        (
            b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00abX\x05\x00\x00\x00utf-8\x86R.",
            "_codecs.encode of a str",
        ),
        (b"\x80\x02cnumpy\nndarray\n(K\x01\x85U\x01btR.", "not callable"),
    ],
    ids=["codecs other than latin1", "ndarray called"],
)
def test_allowed_names_are_refused_with_other_arguments(tmp_path, payload, refusal):
    with pytest.raises(CheckpointError, match=refusal):
        read_detectron2_pickle(_write(tmp_path, payload))
