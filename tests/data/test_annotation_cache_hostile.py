"""The annotation cache against what other users, other programs and odd file systems do: a planted fallback
folder, a json changed during its parse, a cache folder this user cannot write, a FIFO or a symbolic link at a
cache file's name, a read-only lock file on NFS, a file system without hard links."""

import errno
import fcntl
import glob
import json
import logging
import os
import stat

import pytest

from lazytrain.data.datasets import annotation_cache, cached_records
from lazytrain.data.datasets.annotation_cache import get_cache_key, get_cache_path, write_cache_file
from lazytrain.data.datasets.cached_records import load_cached_json
from lazytrain.data.datasets.lvis import load_lvis_json
from tests.data.test_annotation_cache_cluster import _run
from tests.data.test_coco_lvis import lvis_data, write

pytestmark = pytest.mark.usefixtures("cache_dir")  # tests/data/conftest.py: a fresh cache folder


def _plant(tmp_path, json_file, folder):
    """A valid cache file of `json_file` in `folder` whose every label is wrong (category 2)."""
    key = get_cache_key(json_file, "/images", lvis=True)
    records = load_lvis_json(json_file, "/images")
    for record in records:
        for annotation in record["annotations"]:
            annotation["category_id"] = 2
    metadata = {"categories": lvis_data()["categories"], "class_image_count": []}
    folder.mkdir(exist_ok=True)
    write_cache_file(get_cache_path(key, str(folder)), records, metadata, key)


def _load(json_file):
    """load_cached_json in a forked process: (type, records, cache paths, its warnings about cache files)."""
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda r: warnings.append(r.getMessage()) if "Moved it to" in r.getMessage() else None
    logging.getLogger("lazytrain").addHandler(handler)
    records = load_cached_json(json_file, "/images", lvis=True)
    return type(records).__name__, list(records), records.cache_paths, warnings


def _labels(records):
    return [a["category_id"] for record in records for a in record["annotations"]]


def test_a_planted_fallback_folder_is_not_read_while_the_cache_folder_works(tmp_path, cache_dir):
    json_file = write(tmp_path, lvis_data())
    _plant(tmp_path, json_file, tmp_path / "shm" / f"lazytrain-cache-{os.getuid()}")
    records = load_cached_json(json_file, "/images", lvis=True)
    assert _labels(records) == _labels(load_lvis_json(json_file, "/images"))
    assert records.cache_paths[0].startswith(str(cache_dir))


def _other_users_folder(folder, monkeypatch):
    """`folder` made by another user: this process's uid made another one (no root needed)."""
    uid = os.getuid() + 1
    monkeypatch.setattr(annotation_cache.os, "getuid", lambda: uid)
    return folder.parent / f"lazytrain-cache-{uid}"


@pytest.mark.parametrize(
    "kind, problem",
    [
        pytest.param("open", "mode 777: other users may read or write it", id="writable-by-others"),
        pytest.param("owner", "owned by uid", id="another-owner"),
        pytest.param("symlink", "a symbolic link", id="symlink"),
    ],
)
def test_a_fallback_folder_of_another_user_is_refused_with_a_warning(
    tmp_path, monkeypatch, kind, problem, caplog
):
    json_file = write(tmp_path, lvis_data())
    planted = tmp_path / "shm" / f"lazytrain-cache-{os.getuid()}"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        _plant(tmp_path, json_file, tmp_path / "elsewhere")
        planted.symlink_to(tmp_path / "elsewhere")
    else:
        _plant(tmp_path, json_file, planted)
        os.chmod(planted, 0o777 if kind == "open" else 0o700)
        if kind == "owner":
            planted.rename(_other_users_folder(planted, monkeypatch))
            planted = _other_users_folder(planted, monkeypatch)
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv(
        "LAZYTRAIN_CACHE", str(blocker / "cache")
    )  # the cache folder fails: the fallback is tried
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(Exception, match="Cannot write the annotation cache"),
    ):
        load_cached_json(json_file, "/images", lvis=True)
    (warning,) = [r.getMessage() for r in caplog.records if "Not using" in r.getMessage()]
    assert warning.startswith(f"Not using {planted} for the annotation cache: ") and problem in warning


def test_a_fresh_fallback_folder_is_private(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(blocker / "cache"))
    os.umask(umask := os.umask(0))  # the most open umask
    try:
        (path,) = load_cached_json(json_file, "/images", lvis=True).cache_paths
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_a_json_changed_during_its_parse_is_never_cached_under_the_old_content(tmp_path, monkeypatch, caplog):
    json_file = write(tmp_path, lvis_data())
    first = get_cache_key(json_file, "/images", lvis=True)
    fewer = lvis_data()
    fewer["annotations"] = fewer["annotations"][:1]
    original = cached_records._parse_typed

    def rewritten_meanwhile(*args, **kwargs):  # a copy finishing while rank 0 waited for the lock
        with open(json_file, "w") as f:
            json.dump(fewer, f)
        monkeypatch.setattr(cached_records, "_parse_typed", original)
        return original(*args, **kwargs)

    monkeypatch.setattr(cached_records, "_parse_typed", rewritten_meanwhile)
    with caplog.at_level(logging.WARNING):
        records = load_cached_json(json_file, "/images", lvis=True)
    assert list(records) == load_lvis_json(json_file, "/images")  # the json as it is now
    assert not os.path.exists(get_cache_path(first))  # nothing under the first content's name
    assert any("changed while it was parsed; parsing it again" in r.getMessage() for r in caplog.records)


def test_a_json_changed_and_changed_back_during_its_parse_is_parsed_again(tmp_path, monkeypatch, caplog):
    json_file = write(tmp_path, lvis_data())
    text = open(json_file).read()
    fewer = lvis_data()
    fewer["annotations"] = fewer["annotations"][:1]
    original = cached_records._parse_typed

    def changed_and_back(*args, **kwargs):  # B read by the parse, A again before the check (a retried copy)
        with open(json_file, "w") as f:
            json.dump(fewer, f)
        decoded, metadata = original(*args, **kwargs)
        records = list(decoded.records())
        with open(json_file, "w") as f:
            f.write(text)
        monkeypatch.setattr(cached_records, "_parse_typed", original)
        return type(
            "Decoded", (), {"dropped": decoded.dropped, "records": lambda self: iter(records)}
        )(), metadata

    monkeypatch.setattr(cached_records, "_parse_typed", changed_and_back)
    with caplog.at_level(logging.WARNING):
        records = load_cached_json(json_file, "/images", lvis=True)
    assert list(records) == load_lvis_json(json_file, "/images")  # A's records, not B's
    assert any("changed while it was parsed; parsing it again" in r.getMessage() for r in caplog.records)


def test_a_json_half_rewritten_during_its_parse_is_parsed_again_not_recorded_as_bad(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    original = cached_records._parse_typed

    def half_written(*args, **kwargs):  # the parse reads a copy in progress: malformed JSON
        with open(json_file) as f:
            text = f.read()
        with open(json_file, "w") as f:
            f.write(text[: len(text) // 2])
        with open(json_file, "w") as f:
            f.write(text)
        monkeypatch.setattr(cached_records, "_parse_typed", original)
        raise ValueError("malformed JSON")

    monkeypatch.setattr(cached_records, "_parse_typed", half_written)
    records = load_cached_json(json_file, "/images", lvis=True)
    assert list(records) == load_lvis_json(json_file, "/images")
    assert not glob.glob(str(tmp_path / "cache" / "*.failed"))  # no failure kept for this content


def test_a_change_just_before_a_slow_hash_is_not_memoized(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    now = [os.stat(json_file).st_mtime]  # the hash starts as the json is written (1 s timestamps, same tick)
    monkeypatch.setattr(annotation_cache, "time", type("Clock", (), {"time": staticmethod(lambda: now[0])}))
    original = annotation_cache.hash_file

    def slow_hash(path):  # ... and takes 10 s on a loaded machine
        digest = original(path)
        now[0] += 10.0
        return digest

    monkeypatch.setattr(annotation_cache, "hash_file", slow_hash)
    get_cache_key(json_file, "/images", lvis=True)
    assert not glob.glob(str(tmp_path / "cache" / ".sha256" / "*"))  # racy at its start: no memo


def test_a_cache_folder_this_user_cannot_write_falls_back(tmp_path, cache_dir, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    cache_dir.mkdir()
    real_open = os.open

    def no_writes_in_the_cache_folder(path, flags, *args, **kwargs):  # EACCES as a non-root user gets it
        if str(path).startswith(str(cache_dir)) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_writes_in_the_cache_folder)
    records = load_cached_json(json_file, "/images", lvis=True)
    assert records.cache_paths[0].startswith(str(tmp_path / "shm")) and list(records) == load_lvis_json(
        json_file, "/images"
    )


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_fifo_or_a_symlink_at_the_cache_name_is_moved_aside(tmp_path, cache_dir, kind, caplog):
    json_file = write(tmp_path, lvis_data())
    path = get_cache_path(get_cache_key(json_file, "/images", lvis=True))
    cache_dir.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        _plant(tmp_path, json_file, tmp_path / "elsewhere")
        (planted,) = glob.glob(str(tmp_path / "elsewhere" / "*.records"))
        os.symlink(planted, path)
    with caplog.at_level(logging.WARNING):
        # In a forked process: a FIFO opened for reading waits for a writer forever.
        (outcome,) = _run([("node-a", None, _load, (json_file,))], timeout=30)
        assert outcome[0] == "ok", outcome
        records = load_cached_json(json_file, "/images", lvis=True)
    assert list(records) == load_lvis_json(json_file, "/images") and records.cache_paths == [path]
    (warning,) = outcome[1][3]
    assert warning.startswith(f"{path} is not a valid annotation cache file: cannot be read (")
    assert ("a FIFO" if kind == "fifo" else "a symbolic link") in warning


def test_a_read_only_lock_file_on_nfs_parses_without_the_lock(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())

    def nfs_flock(fd, operation):  # NFS: an exclusive POSIX lock on a read-only descriptor
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", nfs_flock)
    records = load_cached_json(json_file, "/images", lvis=True)
    assert list(records) == load_lvis_json(json_file, "/images")


def test_without_hard_links_a_published_name_is_never_replaced(tmp_path, cache_dir, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    (path,) = load_cached_json(json_file, "/images", lvis=True).cache_paths
    inode = os.stat(path).st_ino

    def no_hard_links(source, target, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    key, records = get_cache_key(json_file, "/images", lvis=True), load_lvis_json(json_file, "/images")
    monkeypatch.setattr(os, "link", no_hard_links)
    monkeypatch.setattr(os.path, "exists", lambda p: False)  # the other writer published after the check
    monkeypatch.setattr(os.path, "lexists", lambda p: False)
    assert write_cache_file(path, records, {"categories": []}, key) is False
    assert os.stat(path).st_ino == inode


def test_a_cache_folder_that_cannot_be_created_falls_back(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    monkeypatch.setenv("LAZYTRAIN_CACHE", "/proc/lazytrain-cache")  # makedirs: ENOENT, not EROFS
    records = load_cached_json(json_file, "/images", lvis=True)
    assert records.cache_paths[0].startswith(str(tmp_path / "shm"))


def test_a_symlink_at_the_lock_name_is_not_followed(tmp_path, cache_dir, caplog):
    json_file = write(tmp_path, lvis_data())
    path = get_cache_path(get_cache_key(json_file, "/images", lvis=True))
    cache_dir.mkdir()
    victim = tmp_path / "victim"  # any file this user may write; O_CREAT through the link would make it
    os.symlink(victim, path + ".lock")
    with caplog.at_level(logging.WARNING):
        records = load_cached_json(json_file, "/images", lvis=True)
    assert list(records) == load_lvis_json(json_file, "/images") and records.cache_paths == [path]
    assert not os.path.lexists(victim)
    (warning,) = [r.getMessage() for r in caplog.records if "lock file" in r.getMessage()]
    assert f"lock file {path}.lock is a symbolic link: not following it" in warning
