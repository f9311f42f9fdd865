"""Weight files named by URL: downloaded once per machine into torch hub's cache, verified, reused.

Every URL here is served from 127.0.0.1 (the file_server fixture in tests/conftest.py); nothing leaves the
machine.
"""

import hashlib
import os
import socket
import time

import pytest
import torch

from lazytrain.errors import CheckpointError, ConfigError
from lazytrain.modeling.download import download_to_cache, get_cache_path, get_hash_prefix
from tests.modeling.helpers import log_messages
from tests.warm_command import start_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"conv1.weight": torch.arange(12.0).reshape(1, 3, 2, 2), "bn1.running_var": torch.ones(1)}


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """A fresh torch hub folder; files land in its checkpoints/."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    return tmp_path / "torch" / "hub"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed: connection refused


def _leftovers(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".partial"))


@pytest.mark.parametrize(
    "name, prefix",
    [
        pytest.param("resnet50-0676ba61.pth", "0676ba61", id="torchvision"),
        pytest.param("v1.2-abcdef0123.tar.gz", "abcdef0123", id="dots-before-the-dash"),
        pytest.param("model_final_f10217.pkl", None, id="detectron2-underscore"),
        pytest.param("mask-rcnn-a.pth", None, id="short-hex-is-a-word"),
        pytest.param("deadbeef.pth", None, id="no-dash"),
        pytest.param("resnet50-0676BA61.pth", None, id="upper-case-is-not-torch-hub"),
    ],
)
def test_hash_prefix_follows_torch_hub_naming(name, prefix):
    assert get_hash_prefix(name) == prefix


def _files_but_locks(folder) -> list[str]:
    """The folder's files but the download locks: filelock 3.x removes ``<file>.lock`` on release, 4.x keeps it."""
    return sorted(name for name in os.listdir(folder) if not name.endswith(".lock"))


def test_download_lands_in_the_hub_cache_and_is_reused(file_server, hub_dir):
    url = file_server.add_weights(TINY, "tiny")
    name = url.rsplit("/", 1)[1]
    path = download_to_cache(url)
    assert path == str(hub_dir / "checkpoints" / name) == get_cache_path(url)
    assert open(path, "rb").read() == (file_server.root / name).read_bytes()
    assert torch.equal(torch.load(path, weights_only=True)["conv1.weight"], TINY["conv1.weight"])
    assert download_to_cache(url) == path
    assert file_server.requests == {f"/{name}": 1}
    assert _files_but_locks(hub_dir / "checkpoints") == [name]


def test_two_processes_at_once_download_once(file_server, hub_dir, tmp_path):
    url = file_server.add_weights(TINY, "tiny")
    name = url.rsplit("/", 1)[1]
    file_server.delay = 2.0  # the first download is still running when the other process asks
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=REPO)  # TORCH_HOME from hub_dir
    args = ["-m", "tests.modeling.download_worker", url, str(go)]
    with start_warm(args, REPO, env) as first, start_warm(args, REPO, env) as second:
        workers = [first, second]
        deadline = time.monotonic() + 60
        while not all(worker.read_output()[0] == "ready\n" for worker in workers):
            ended = [worker.read_output() for worker in workers if worker.poll() is not None]
            assert not ended and time.monotonic() < deadline, ended
            time.sleep(0.01)
        go.touch()
        for worker in workers:
            worker.wait(timeout=120)
        outputs = [worker.read_output() for worker in workers]
    outputs = [(stdout.removeprefix("ready\n"), stderr) for stdout, stderr in outputs]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    expected = str(hub_dir / "checkpoints" / name)
    assert [stdout for stdout, _ in outputs] == [f"{expected}\n", f"{expected}\n"]
    assert file_server.requests == {f"/{name}": 1}
    logs = [stderr for _, stderr in outputs]
    assert sorted(f"Downloading {url} to {expected}" in log for log in logs) == [False, True], logs
    assert sorted(f"Waiting for another process to download {url}" in log for log in logs) == [False, True]
    assert open(expected, "rb").read() == (file_server.root / name).read_bytes()
    assert _leftovers(hub_dir / "checkpoints") == []


def test_a_download_with_the_wrong_hash_is_discarded_and_nothing_else_changes(file_server, hub_dir):
    url = file_server.add_weights(TINY, "tiny")
    data = (file_server.root / url.rsplit("/", 1)[1]).read_bytes()
    assert not hashlib.sha256(data).hexdigest().startswith("deadbeef")
    (file_server.root / "tiny-deadbeef.pth").write_bytes(data)
    checkpoints = hub_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "other-01234567.pth").write_bytes(b"another cached file")
    bad_url = file_server.url("tiny-deadbeef.pth")
    with pytest.raises(CheckpointError) as error:
        download_to_cache(bad_url)
    assert str(error.value) == (
        f"train.init_checkpoint={bad_url}: the downloaded file has sha256 "
        f"{hashlib.sha256(data).hexdigest()[:16]}..., not starting with deadbeef as its name says; it was "
        f"discarded and {checkpoints / 'tiny-deadbeef.pth'} left as it was. Check the URL, or download the file "
        "yourself and set train.init_checkpoint=PATH."
    )
    assert _files_but_locks(checkpoints) == ["other-01234567.pth"]
    assert (checkpoints / "other-01234567.pth").read_bytes() == b"another cached file"


def test_a_wrong_file_in_the_cache_is_removed_then_the_right_one_downloaded(file_server, hub_dir):
    url = file_server.add_weights(TINY, "tiny")
    name = url.rsplit("/", 1)[1]
    cached = hub_dir / "checkpoints" / name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"not the published file")  # copied by hand under the right name
    with pytest.raises(CheckpointError, match=f"the cached file {cached} is not the published file") as error:
        download_to_cache(url)
    assert 'train.init_checkpoint=""' in str(error.value) and "was removed" in str(error.value)
    assert not cached.exists() and file_server.requests == {}
    assert download_to_cache(url) == str(cached)
    assert cached.read_bytes() == (file_server.root / name).read_bytes()
    assert file_server.requests == {f"/{name}": 1}


def test_an_unreachable_url_says_where_to_put_the_file_and_how_to_go_without(hub_dir):
    url = f"http://127.0.0.1:{_closed_port()}/models/resnet50-0676ba61.pth"
    cache = hub_dir / "checkpoints" / "resnet50-0676ba61.pth"
    with pytest.raises(ConfigError) as error:
        download_to_cache(url)
    assert str(error.value) == (
        f"train.init_checkpoint={url}: could not download it ([Errno 111] Connection refused). Without internet, "
        f"copy the file to {cache} (this machine's torch hub cache, looked at first), or set "
        'train.init_checkpoint=PATH to a local copy, or train.init_checkpoint="" to start from random weights.'
    )
    assert not cache.exists() and _leftovers(cache.parent) == []


def test_an_http_error_is_named(file_server, hub_dir):
    url = file_server.url("missing-0676ba61.pth")
    with pytest.raises(
        ConfigError, match=r"could not download it \(HTTP 404 File not found\)\. Without internet"
    ):
        download_to_cache(url)
    assert file_server.requests == {"/missing-0676ba61.pth": 1}


def test_a_server_that_stops_answering_times_out_with_the_same_advice(file_server, hub_dir):
    url = file_server.add_weights(TINY, "tiny")
    file_server.delay = 3.0
    with pytest.raises(ConfigError, match=r"could not download it \(timed out\)\. Without internet, copy"):
        download_to_cache(url, timeout=0.5)
    assert _leftovers(hub_dir / "checkpoints") == []


def test_a_name_without_hash_is_downloaded_unverified(file_server, hub_dir):
    url = file_server.url("weights.pth")
    (file_server.root / "weights.pth").write_bytes(b"payload")
    with log_messages("lazytrain.modeling.download") as messages:
        path = download_to_cache(url)
    assert open(path, "rb").read() == b"payload"
    assert messages[0] == f"Downloading {url} to {path}"
    assert messages[-1].startswith(f"Downloaded {url} (0.0 MB in ")
    assert messages[-1].endswith(" s, not verified: its name carries no sha256 prefix)")


@pytest.mark.parametrize(
    "url, message",
    [
        pytest.param(
            "s3://bucket/r50-0676ba61.pth", "only http:// and https:// URLs are downloaded", id="s3"
        ),
        pytest.param("https://example.com/models/", "the URL names no file", id="no-file-name"),
    ],
)
def test_urls_that_cannot_be_cached_are_refused_before_any_request(url, message, hub_dir):
    with pytest.raises(ConfigError, match=message):
        download_to_cache(url)


def test_without_file_locks_the_download_still_lands(file_server, hub_dir, monkeypatch):
    """Some network file systems refuse locks (ENOLCK): each process then installs a complete file itself."""
    import errno

    import filelock

    def refuse(self, *args, **kwargs):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(filelock.FileLock, "acquire", refuse)
    url = file_server.add_weights(TINY, "tiny")
    path = download_to_cache(url)
    assert torch.equal(torch.load(path, weights_only=True)["conv1.weight"], TINY["conv1.weight"])


def test_a_cache_folder_that_cannot_be_made_is_named_with_the_fixes(file_server, hub_dir):
    hub_dir.parent.mkdir(parents=True)
    hub_dir.write_text("a file where torch hub's folder should be")
    url = file_server.add_weights(TINY, "tiny")
    with pytest.raises(ConfigError, match=r"cannot write torch hub's cache folder .*Set TORCH_HOME"):
        download_to_cache(url)
    assert file_server.requests == {}
