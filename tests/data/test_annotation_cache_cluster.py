"""The annotation cache on a cluster, simulated on one machine: "machines" are forked processes with their own
hostnames and their own copies of the json (other inodes, same path through a symlink); locks that raise or
hang; writers that die; files replaced while mapped; a cache folder that cannot be written."""

import copy
import errno
import fcntl
import glob
import multiprocessing
import os
import shutil
import socket
import time
import traceback

import pytest

from lazytrain.data.datasets import annotation_cache, cached_records
from lazytrain.data.datasets.cached_records import CachedRecords, load_cached_json
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.program.entrypoint import main as lazytrain_main
from tests.data.test_coco_lvis import COCO, lvis_data, write

FORK = multiprocessing.get_context("fork")  # the patches made in a test travel with the fork


pytestmark = pytest.mark.usefixtures("cache_dir")  # tests/data/conftest.py: a fresh cache folder


@pytest.fixture
def parses(tmp_path, monkeypatch):
    """A file with one line per parse of a json, in any process (the typed build or the plain loader)."""
    log = tmp_path / "parses.txt"
    log.touch()

    def counted(original):
        def parse(*args, **kwargs):
            with open(log, "a") as f:
                f.write(f"{socket.gethostname()} {os.getpid()}\n")
            time.sleep(0.3)  # the other processes arrive while this one parses
            return original(*args, **kwargs)

        return parse

    monkeypatch.setattr(cached_records, "_build", counted(cached_records._build))
    from lazytrain.data.datasets import coco, lvis

    monkeypatch.setattr(lvis, "load_lvis_json", counted(lvis.load_lvis_json))
    monkeypatch.setattr(coco, "read_json", counted(coco.read_json))
    return lambda: log.read_text().splitlines()


def _as_machine(hostname, flock, target, *args):
    """Run `target(*args)` in this forked process as machine `hostname` with `flock` as the lock call; the
    outcome (its value or the error's type and message) goes to the queue that is the last argument."""
    queue = args[-1]
    socket.gethostname = lambda: hostname
    if flock is not None:
        fcntl.flock = flock
    try:
        queue.put(("ok", target(*args[:-1])))
    except BaseException as e:
        queue.put(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))


def _run(specs, timeout=60):
    """Start (hostname, flock, target, args) processes at once; their outcomes, in order. A process that does
    not finish in `timeout` seconds is killed and reported as hung."""
    queues = [FORK.Queue() for _ in specs]
    processes = [
        FORK.Process(target=_as_machine, args=(host, flock, target, *args, queue))
        for (host, flock, target, args), queue in zip(specs, queues)
    ]
    for process in processes:
        process.start()
    outcomes = []
    for process, queue in zip(processes, queues):
        try:
            outcomes.append(queue.get(timeout=timeout))
        except Exception:
            outcomes.append(("hung",))
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()
    return outcomes


def _load(json_file):
    records = load_cached_json(json_file, "/images", lvis=True)
    return type(records).__name__, list(records), getattr(records, "cache_paths", None)


def test_two_machines_with_their_own_copy_share_one_file(tmp_path, cache_dir, parses):
    """Each node holds its own copy of the json at the same path (another inode, mtime kept as `cp -p` keeps
    it): the second node maps the first node's file instead of parsing and rewriting it."""
    for node in ("a", "b"):
        (tmp_path / node).mkdir()
    json_file = write(tmp_path / "a", lvis_data())
    shutil.copy2(json_file, tmp_path / "b" / "ann.json")
    assert os.stat(json_file).st_ino != os.stat(tmp_path / "b" / "ann.json").st_ino
    data = tmp_path / "data"
    outcomes = []
    for node in ("a", "b"):
        if data.is_symlink():
            data.unlink()
        data.symlink_to(tmp_path / node)  # the same path on both machines
        outcomes += _run([(f"node-{node}", None, _load, (str(data / "ann.json"),))])
    assert [o[0] for o in outcomes] == ["ok", "ok"]
    expected = load_lvis_json(json_file, "/images")
    assert (
        outcomes[0][1] == outcomes[1][1] == ("CachedRecords", expected, annotation_cache.list_cache_files())
    )
    assert len(annotation_cache.list_cache_files()) == 1 and [line.split()[0] for line in parses()] == [
        "node-a"
    ]


def _no_lock(error):
    def flock(fd, operation):
        raise error

    return flock


def _hanging_flock(fd, operation):
    time.sleep(3600)


@pytest.mark.parametrize(
    "flock",
    [
        pytest.param(_no_lock(NotImplementedError()), id="NotImplementedError"),  # filelock 3.x on Lustre
        pytest.param(_no_lock(OSError(errno.ENOSYS, "Function not implemented")), id="ENOSYS"),
        pytest.param(_no_lock(OSError(errno.ENOLCK, "No locks available")), id="ENOLCK"),  # NFS without lockd
    ],
)
def test_two_machines_without_locks_parse_at_once_and_publish_one_file(tmp_path, cache_dir, flock):
    json_file = write(tmp_path, lvis_data())
    outcomes = _run([(f"node-{n}", flock, _load, (json_file,)) for n in "ab"])
    expected = ("CachedRecords", load_lvis_json(json_file, "/images"), annotation_cache.list_cache_files())
    assert outcomes == [("ok", expected)] * 2 and len(expected[2]) == 1
    assert not glob.glob(str(cache_dir / ".*tmp*"))  # the loser removed its own copy


def test_a_hanging_lock_call_is_bounded_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(annotation_cache, "LOCK_CALL_S", 0.5, raising=False)
    json_file = write(tmp_path, lvis_data())
    ((status, message, *_),) = _run([("node-a", _hanging_flock, _load, (json_file,))], timeout=20)
    assert status == "error" and message.startswith("LazytrainError: The annotation cache's lock ")
    assert "did not answer in 0 s" in message and "Set LAZYTRAIN_CACHE to a folder on a local disk" in message


def test_a_lock_held_too_long_is_bounded_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(annotation_cache, "LOCK_WAIT_S", 0.5, raising=False)
    json_file = write(tmp_path, lvis_data())
    (path,) = load_cached_json(json_file, "/images", lvis=True).cache_paths
    os.remove(path)  # the next load must parse, and waits for the lock held below
    with open(path + ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        ((status, message, *_),) = _run([("node-a", None, _load, (json_file,))], timeout=20)
    assert status == "error" and message.startswith(
        "LazytrainError: Waited 0 s for the annotation cache's lock"
    )
    assert "set LAZYTRAIN_CACHE to a folder on a local disk" in message


def test_a_writer_removes_only_provably_dead_writers_temporary_files(tmp_path, cache_dir):
    json_file = write(tmp_path, lvis_data())
    (path,) = load_cached_json(json_file, "/images", lvis=True).cache_paths
    os.remove(path)  # cleared: the next load writes the same name again
    dead = FORK.Process(target=os._exit, args=(0,))
    dead.start()
    dead.join()
    namespace = os.stat("/proc/self/ns/pid").st_ino
    boot = open("/proc/sys/kernel/random/boot_id").read().strip().replace("-", "")
    name = f".{os.path.basename(path)}.tmp"
    host = socket.gethostname()
    other_machine = (
        cache_dir / f"{name}~other-node~{boot}~{namespace}~{dead.pid}~0a0b"
    )  # same pid, another host
    # The same hostname and initial pid namespace on another machine (a cloned image): another boot id.
    other_boot = cache_dir / f"{name}~{host}~{'0' * 32}~{namespace}~{dead.pid}~0e0f"
    dead_here = cache_dir / f"{name}~{host}~{boot}~{namespace}~{dead.pid}~0c0d"
    # Of other names (a json since changed, a failure record): swept by any writer in the folder.
    tag = f"{host}~{boot}~{namespace}~{dead.pid}~0a0a"
    other_name, failure = (
        cache_dir / f".old-0123.records.tmp~{tag}",
        cache_dir / f"old-0123.records.failed.tmp~{tag}",
    )
    for temporary in (other_machine, other_boot, dead_here, other_name, failure):
        temporary.write_bytes(b"half a file")
    assert load_cached_json(json_file, "/images", lvis=True).cache_paths == [path]
    assert other_machine.exists() and other_boot.exists() and not dead_here.exists()
    assert not other_name.exists() and not failure.exists()


def _read_while_replaced(json_file, started, replaced):
    records = load_cached_json(json_file, "/images", lvis=True)
    before = list(records)
    started.set()
    assert replaced.wait(timeout=60)
    return list(records) == before


def test_a_mapped_file_is_never_replaced_under_its_name(tmp_path, capsys):
    """A process maps the file; meanwhile the json changes (a new file) and the cache is cleared: the reader
    keeps reading its own records (its inode was never rewritten), and nothing took its name."""
    json_file = write(tmp_path, lvis_data())
    first = load_cached_json(json_file, "/images", lvis=True)
    old = load_lvis_json(json_file, "/images")
    (path,) = first.cache_paths
    inode = os.stat(path).st_ino
    started, replaced = FORK.Event(), FORK.Event()
    queue = FORK.Queue()
    reader = FORK.Process(
        target=_as_machine, args=("node-a", None, _read_while_replaced, json_file, started, replaced, queue)
    )
    reader.start()
    assert started.wait(timeout=60)
    data = lvis_data()
    data["images"][0]["width"] = 7
    write(tmp_path, data)
    second = load_cached_json(json_file, "/images", lvis=True)
    assert os.stat(path).st_ino == inode and second.cache_paths != [path]
    lazytrain_main(["cache", "--clear"])
    assert "SIGBUS" in capsys.readouterr().out
    replaced.set()
    assert queue.get(timeout=60) == ("ok", True)
    reader.join(timeout=10)
    assert reader.exitcode == 0 and list(first) == old


def test_an_unwritable_cache_folder_still_parses_once_per_machine(tmp_path, monkeypatch, parses):
    ranks = 3
    json_file = write(tmp_path, lvis_data())
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(blocker / "cache"))  # any write there fails (ENOTDIR)
    outcomes = _run([("node-a", None, _load, (json_file,))] * ranks)
    (path,) = glob.glob(str(tmp_path / "shm" / "lazytrain-cache-*" / "*.records"))
    assert outcomes == [("ok", ("CachedRecords", load_lvis_json(json_file, "/images"), [path]))] * ranks
    assert len(parses()) == 1


def test_no_writable_folder_stops_every_rank_before_parsing(tmp_path, monkeypatch, parses):
    json_file = write(tmp_path, lvis_data())
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(annotation_cache, "_NODE_LOCAL_ROOT", str(blocker), raising=False)
    outcomes = _run([("node-a", None, _load, (json_file,))] * 2)
    for status, message, *_ in outcomes:
        assert status == "error" and message.startswith(
            "LazytrainError: Cannot write the annotation cache of"
        )
        assert str(blocker / "cache") in message and "Set LAZYTRAIN_CACHE to a writable folder" in message
        assert "\n" not in message
    assert parses() == []


def test_a_full_cache_folder_is_refused_before_the_parse(tmp_path, cache_dir, monkeypatch, parses, caplog):
    json_file = write(tmp_path, lvis_data())
    statvfs = os.statvfs

    class Full:
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Full() if str(p).startswith(str(cache_dir)) else statvfs(p))
    records = load_cached_json(json_file, "/images", lvis=True)
    assert isinstance(records, CachedRecords) and records.cache_paths[0].startswith(str(tmp_path / "shm"))
    assert len(parses()) == 1 and not annotation_cache.list_cache_files()
    (warning,) = [
        r.getMessage() for r in caplog.records if "Cannot write the annotation cache" in r.getMessage()
    ]
    assert str(cache_dir) in warning and "MiB free" in warning and "LAZYTRAIN_CACHE" in warning


def _load_coco(json_file, delay=0.0):
    time.sleep(delay)
    return len(load_cached_json(json_file, "/images", lvis=False))


def _parse_after_waiters(tmp_path, monkeypatch, count):
    """The parse (in whichever process takes the lock) starts only once `count` other processes found the lock
    held (bounded): a rank scheduled late on a loaded machine would come after the parse, and parse again."""
    waiting = tmp_path / "waiting"
    waiting.mkdir()
    try_lock, build = annotation_cache._try_lock, cached_records._build

    def noted_try_lock(fd, lock_path):
        taken = try_lock(fd, lock_path)
        if taken is False:
            (waiting / str(os.getpid())).touch()
        return taken

    def build_after_waiters(*args, **kwargs):
        deadline = time.monotonic() + 30
        while len(os.listdir(waiting)) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return build(*args, **kwargs)

    monkeypatch.setattr(annotation_cache, "_try_lock", noted_try_lock)
    monkeypatch.setattr(cached_records, "_build", build_after_waiters)


def test_a_bad_json_is_parsed_once_and_the_ranks_that_waited_get_its_error(tmp_path, monkeypatch, parses):
    data = copy.deepcopy(COCO)
    data["annotations"][1]["category_id"] = 99
    json_file = write(tmp_path, data)
    _parse_after_waiters(tmp_path, monkeypatch, 2)
    # The third rank starts late, as on a loaded CI machine: it still waits for the first parse.
    outcomes = _run([("node-a", None, _load_coco, (json_file, delay)) for delay in (0, 0, 0.5)])
    assert [outcome[:2] for outcome in outcomes] == [outcomes[0][:2]] * 3, outcomes
    assert outcomes[0][0] == "error" and "category_id 99" in outcomes[0][1]
    assert len({line.split()[1] for line in parses()}) == 1  # one process parsed
    with pytest.raises(ValueError, match="category_id 99"):  # a later job parses again
        load_cached_json(json_file, "/images", lvis=False)
