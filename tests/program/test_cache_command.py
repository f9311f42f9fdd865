"""``python -m lazytrain cache``: where a data set's annotation cache file is, its state, and clearing it."""

import os
import subprocess
import sys
import time

import pytest

from lazytrain.data.datasets import annotation_cache
from lazytrain.data.datasets.annotation_cache import list_cache_files
from lazytrain.data.datasets.cached_records import load_cached_json
from lazytrain.program import cache_command
from lazytrain.program.entrypoint import main as lazytrain_main
from tests.data.test_coco_lvis import COCO, lvis_data, write


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A built-in lvis_v1_val under $LAZYTRAIN_DATASETS and a user's COCO json, both loaded once."""
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(annotation_cache, "_NODE_LOCAL_ROOT", str(tmp_path / "shm"), raising=False)
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path / "datasets"))
    (tmp_path / "datasets" / "lvis").mkdir(parents=True)
    lvis = write(tmp_path / "datasets" / "lvis", lvis_data(), "lvis_v1_val.json")
    coco = write(tmp_path, COCO, "custom.json")
    load_cached_json(lvis, str(tmp_path / "datasets" / "coco"), lvis=True)
    load_cached_json(coco, "/images", lvis=False)
    return {"lvis": lvis, "coco": coco, "cache": str(tmp_path / "cache")}


def _cache(capsys, *argv):
    lazytrain_main(["cache", *argv])
    return capsys.readouterr().out


def test_lists_every_cache_file_with_its_json_and_state(files, capsys):
    out = _cache(capsys)
    assert out.splitlines()[0] == f"cache folder: {files['cache']}"
    lines = out.splitlines()[1:]
    assert len(lines) == 2 and all(line.endswith("current") for line in lines)
    assert any(f"json={files['lvis']}" in line and "  lvis  " in line for line in lines)
    assert any(f"json={files['coco']}" in line and "3 images  coco" in line for line in lines)


def test_by_name_or_json_and_not_this_machines_json_after_a_change(files, capsys):
    (line,) = _cache(capsys, "lvis_v1_val").splitlines()[1:]
    assert f"json={files['lvis']}" in line and line.endswith("current")
    time.sleep(0.01)
    with open(files["coco"], "a") as f:
        f.write(" ")
    (line,) = _cache(capsys, files["coco"]).splitlines()[1:]
    assert f"json={files['coco']}" in line and line.endswith("not this machine's json")
    (line,) = _cache(capsys, "lvis_v1_train").splitlines()[1:]
    assert line.startswith("lvis_v1_train: no cache file yet (it will be ") and files["cache"] in line


def test_a_missing_json_is_an_error_in_one_line(files, capsys, tmp_path, monkeypatch):
    """A json path that is neither there nor the json of a cache file exits 1 with one line naming it (failed
    before: 'no cache file yet', exit 0); the cache file of a json removed since is still listed and cleared."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        lazytrain_main(["cache", "nonexist.json", "--clear"])
    out, err = capsys.readouterr()
    assert stopped.value.code == 1 and out == ""
    assert err == (
        f"lazytrain cache: nonexist.json: no such json file ({tmp_path / 'nonexist.json'}) and no cache file of "
        "one at that path; check the path, or run 'python -m lazytrain cache' to list every cache file with its "
        "json\n"
    )
    assert len(list_cache_files()) == 2  # nothing cleared
    os.remove(files["coco"])
    (line,) = _cache(capsys, files["coco"]).splitlines()[1:]
    assert f"json={files['coco']}" in line and line.endswith("json missing here")
    assert "removed " in _cache(capsys, files["coco"], "--clear") and len(list_cache_files()) == 1


def test_clear_one_then_all(files, capsys):
    out = _cache(capsys, "lvis_v1_val", "--clear")
    assert "removed " in out and len(list_cache_files()) == 1
    assert "json=" + files["coco"] in _cache(capsys, files["coco"])
    _cache(capsys, "--clear")
    assert list_cache_files() == [] and _cache(capsys).splitlines()[1:] == ["no cache files"]


def test_clear_says_what_it_does_to_running_jobs_and_removes_leftovers(files, capsys):
    (path, _) = list_cache_files()
    aside, temporary, failure_temporary = (
        path + ".damaged-host~1~2~ab",
        os.path.join(files["cache"], ".x.records.tmp~host~1~2~ab"),
        path + ".failed.tmp~host~1~2~ab",
    )
    for leftover in (aside, temporary, failure_temporary):
        with open(leftover, "wb") as f:
            f.write(b"\0" * 2**20)
    listing = _cache(capsys)
    for leftover in (aside, temporary, failure_temporary):  # a dead writer's file on another node: listed
        assert f"leftover {leftover}  1.0 MiB  (--clear removes it)" in listing
    out = _cache(capsys, "--clear")
    assert all(f"removed {leftover}" in out for leftover in (aside, temporary, failure_temporary))
    assert not os.listdir(files["cache"])
    assert out.splitlines()[-1] == (
        "Jobs that mapped a removed file keep reading it on a local disk; on NFS and other network file systems "
        "they can fail (SIGBUS, ESTALE): clear only when no job uses these files."
    )
    assert "SIGBUS" in _cache(capsys, "--help")


def test_a_reader_that_stops_early_is_no_error(files):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that has already exited
    done = subprocess.run(
        [sys.executable, "-m", "lazytrain", "cache"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(write_end)
    assert done.stderr == "" and done.returncode == 0


def test_errors_are_one_line(files, capsys):
    with pytest.raises(SystemExit) as exit_info:
        lazytrain_main(["cache", "my_registered_set"])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert error.startswith("lazytrain cache: 'my_registered_set' is neither a built-in data set name")
    assert "give its json_file" in error and len(error.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        lazytrain_main(["cache", "--wipe"])
    assert "unknown option --wipe" in capsys.readouterr().err
    lazytrain_main(["cache", "--help"])
    assert "python -m lazytrain cache lvis_v1_train --clear" in capsys.readouterr().out
    assert os.path.isdir(files["cache"])


def test_a_coco_json_read_by_the_lvis_loader_is_listed_as_coco(files, capsys, tmp_path):
    load_cached_json(files["coco"], "/other", lvis=True)  # register_json_dataset reads every json so
    lines = _cache(capsys, files["coco"]).splitlines()[1:]
    assert sorted(line.split("images  ")[1].split("  json=")[0] for line in lines) == [
        "coco",
        "coco (read by the lvis loader)",
    ]


class _ClosedAfterOneLine:
    """stdout of ``| head -1``: the second write finds the pipe closed."""

    def __init__(self, fileno):
        self.lines, self._fileno = [], fileno

    def write(self, text):
        if self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append(text)

    def flush(self):
        pass

    def fileno(self):
        return self._fileno


def test_clear_into_a_pipe_closed_early_removes_everything(files, tmp_path, monkeypatch):
    with open(tmp_path / "stdout", "w") as out:
        monkeypatch.setattr(sys, "stdout", _ClosedAfterOneLine(out.fileno()))
        cache_command._cache_to_a_pipe(["--clear"])
    assert list_cache_files() == [] and not os.listdir(files["cache"])


def test_another_users_fallback_folder_is_left_alone(files, tmp_path, capsys):
    planted = tmp_path / "shm" / f"lazytrain-cache-{os.getuid()}"
    planted.mkdir(parents=True, mode=0o777)
    os.chmod(planted, 0o777)  # anyone could have written it
    (planted / "x.records").write_bytes(b"")
    out = _cache(capsys, "--clear")
    assert f"left alone: {planted} (mode 777: other users may read or write it" in out
    assert (planted / "x.records").exists()
