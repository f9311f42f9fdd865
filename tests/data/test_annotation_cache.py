"""The annotation cache: records from the cache file equal the plain loaders', one parse shared by processes
(a lock), a new file when the json's content changes (even with its size and time kept), nothing half-written
read after a kill, a planted or damaged file never run nor crashing (moved aside, rebuilt), and the arrays the
samplers and the aspect grouping read equal to what they computed from the records.

The shared-file-system cases (several machines, locks that fail or hang, full or read-only folders) are in
test_annotation_cache_cluster.py."""

import copy
import glob
import hashlib
import json
import logging
import math
import multiprocessing
import os
import pickle
import signal
import struct
import time
import zlib

import numpy as np
import pytest

from lazytrain.data import build
from lazytrain.data.aspect_grouping import get_aspect_groups
from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.common import DatasetFromList
from lazytrain.data.datasets import annotation_cache, cached_records
from lazytrain.data.datasets.cache_file import CacheFileError
from lazytrain.data.datasets.cached_records import CachedRecords, load_cached_json
from lazytrain.data.datasets.coco import load_coco_json
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.data.repeat_factors import CategoryIndex, repeat_factors_from_category_frequency
from lazytrain.engine.plot_writer import summarize_records
from lazytrain.errors import LazytrainError
from tests.data.test_coco_lvis import COCO, lvis_data, write

PLAIN = {False: load_coco_json, True: load_lvis_json}

# Crowd RLE (compressed and uncompressed counts), polygons (one dropped: 2 points; one annotation left without
# any), a degenerate box, float boxes, an annotation without iscrowd or segmentation, an image without any.
RICH = copy.deepcopy(COCO)
RICH["images"].append({"id": 4, "file_name": "sub/d.jpg", "width": 20, "height": 60})
RICH["annotations"] += [
    {"id": 30, "image_id": 4, "category_id": 3, "bbox": [1.5, 2.25, 4.0, 5.5], "iscrowd": 1,
     "segmentation": {"size": [60, 20], "counts": [0, 10, 1190]}},
    {"id": 31, "image_id": 1, "category_id": 3, "bbox": [0, 0, 0, 5], "segmentation": [[0, 0, 1, 1, 0, 2]]},
    {"id": 32, "image_id": 4, "category_id": 7, "bbox": [1, 1, 2, 2], "segmentation": [[0, 0, 1, 1]]},
    {"id": 33, "image_id": 4, "category_id": 7, "bbox": [1, 1, 3, 3]},
    {"id": 34, "image_id": 1, "category_id": 3, "bbox": [2, 3, 4, 5], "iscrowd": 0,
     "segmentation": [[2, 3, 6, 3, 6, 8, 2, 8], [1, 1, 2, 2, 1, 3]]},
]  # fmt: skip


def _lvis_rich():
    """RICH as LVIS: one image named by file_name, one without neg_category_ids, one with an unknown one."""
    data = lvis_data()
    data["images"].append(
        {"id": 4, "file_name": "sub/d.jpg", "width": 20, "height": 60, "neg_category_ids": [3]}
    )
    del data["images"][1]["neg_category_ids"]
    data["annotations"] = copy.deepcopy(RICH["annotations"])
    return data


pytestmark = pytest.mark.usefixtures("cache_dir")  # tests/data/conftest.py: a fresh cache folder


def read_table(path):
    """The JSON table at the end of a cache file (its key and arrays)."""
    data = open(path, "rb").read()
    _, offset, length, _ = struct.unpack_from("<8sQQ32s", data, 0)
    return json.loads(data[offset : offset + length])


def write_layout(path, key, arrays):
    """A file in the cache's layout (header, 64-byte aligned arrays, JSON table), every sha256 right:
    name -> (dtype, bytes)."""
    out, table = bytearray(64), {}
    for name, (dtype, data) in arrays.items():
        out += bytes(-len(out) % 64)
        table[name] = [
            dtype,
            len(data) // np.dtype(dtype).itemsize,
            len(out),
            hashlib.sha256(data).hexdigest(),
        ]
        out += data
    blob = json.dumps({"key": key, "arrays": table}).encode()
    out[:56] = struct.pack("<8sQQ32s", b"LZTCACHE", len(out), len(blob), hashlib.sha256(blob).digest())
    with open(path, "wb") as f:
        f.write(out + blob)


@pytest.fixture
def names():
    used = []
    yield used
    for name in used:
        MetadataCatalog.remove(name)
        DatasetCatalog.remove(name)


def _metadata(name):
    return {k: v for k, v in MetadataCatalog.get(name).as_dict().items() if k != "name"}


def _check_equal(json_file, image_root, lvis, names):
    names += ["plain", "cached"]
    plain = PLAIN[lvis](json_file, image_root, "plain")
    cached = load_cached_json(json_file, image_root, "cached", lvis=lvis)
    assert isinstance(cached, CachedRecords) and len(cached) == len(plain)
    assert list(cached) == plain and cached[-1] == plain[-1] and cached[1:3] == plain[1:3]
    assert _metadata("cached") == _metadata("plain")
    again = load_cached_json(json_file, image_root, lvis=lvis)  # warm: read from the file
    assert list(again) == plain
    factors = repeat_factors_from_category_frequency(again, 0.5)  # from the arrays, without a warning
    assert factors.tolist() == repeat_factors_from_category_frequency(plain, 0.5).tolist()
    # The run header's and plots' counts, from the arrays (directly or through DatasetFromList) and the records.
    assert summarize_records(again) == summarize_records(DatasetFromList(again)) == summarize_records(plain)
    return cached, plain


@pytest.mark.parametrize("lvis", [False, True], ids=["coco", "lvis"])
def test_synthetic_demo_records_equal(tmp_path, lvis, names):
    root = generate_synthetic_lt(str(tmp_path / "synthetic"), num_train=24, num_val=6)
    for split in ("train", "val"):
        _check_equal(os.path.join(root, f"lvis_v1_{split}.json"), root, lvis, names)


@pytest.mark.parametrize(
    "data, lvis",
    [
        pytest.param(RICH, False, id="coco"),
        pytest.param(lvis_data(), True, id="lvis"),
        pytest.param(_lvis_rich(), True, id="lvis-rich"),
        pytest.param({**RICH, "annotations": {}}, False, id="no-annotations"),
        # ids of other types and a missing annotation id: valid for the plain loader, read as it reads them
        pytest.param(
            {"images": [{"id": "x", "file_name": "x.jpg", "width": 3, "height": 4}],
             "categories": [{"id": 5, "name": "a"}],
             "annotations": [{"image_id": "x", "category_id": 5, "bbox": [0, 0, 1, 1], "iscrowd": None}]},
            False,
            id="string-ids",
        ),
    ],
)  # fmt: skip
def test_hand_built_records_equal(tmp_path, data, lvis, names, caplog):
    json_file = write(tmp_path, data)
    with caplog.at_level(logging.WARNING):
        _check_equal(json_file, "/images", lvis, names)
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) in (0, 2) and len(set(dropped)) <= 1  # the same warning from both loaders


@pytest.mark.parametrize(
    "mutate, message",
    [
        pytest.param(lambda d: d["annotations"][1].update(category_id=99), "category_id 99", id="category"),
        pytest.param(lambda d: d["annotations"][2].update(image_id=42), "image_id 42", id="image"),
        pytest.param(lambda d: d["annotations"][2].update(id=10), "duplicate annotation id 10", id="dup"),
        pytest.param(lambda d: d["annotations"][2].update(bbox=None), "not subscriptable", id="bbox"),
        pytest.param(lambda d: d["images"][0].pop("file_name"), "has no 'file_name'", id="file-name"),
    ],
)
@pytest.mark.parametrize("lvis", [False, True], ids=["coco", "lvis"])
def test_bad_files_raise_the_plain_error_and_write_nothing(tmp_path, cache_dir, mutate, message, lvis):
    data = copy.deepcopy(COCO)
    mutate(data)
    json_file = write(tmp_path, data)
    with pytest.raises((ValueError, TypeError)) as plain:
        PLAIN[lvis](json_file, "/images")
    with pytest.raises(type(plain.value)) as cached:
        load_cached_json(json_file, "/images", lvis=lvis)
    assert str(cached.value) == str(plain.value) and message in str(cached.value)
    assert not annotation_cache.list_cache_files() and not list(cache_dir.glob(".*tmp*"))


def test_malformed_and_missing_json_errors(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"images": [\n  {"id": 1,, "file_name": "a.jpg"}]}')
    with pytest.raises(ValueError, match=r"malformed JSON in .*bad\.json, line 2 column 12"):
        load_cached_json(str(path), "/images", lvis=True)
    with pytest.raises(FileNotFoundError, match="annotation file not found"):
        load_cached_json(str(tmp_path / "none.json"), "/images", lvis=True)
    assert not annotation_cache.list_cache_files()


def test_changed_json_gets_a_new_file_and_the_old_name_is_never_replaced(tmp_path):
    json_file = write(tmp_path, COCO)
    first = load_cached_json(json_file, "/images", lvis=False)
    (old_path,) = first.cache_paths
    old_inode = os.stat(old_path).st_ino
    blob = pickle.dumps(first)  # what a loader worker started later receives
    data = copy.deepcopy(COCO)
    data["images"][0]["width"] = 51
    time.sleep(0.01)
    write(tmp_path, data)
    second = load_cached_json(json_file, "/images", lvis=False)
    assert first[0]["width"] == 50 and second[0]["width"] == 51  # the old map still serves its holder
    assert second.cache_paths != [old_path] and len(annotation_cache.list_cache_files()) == 2
    assert os.stat(old_path).st_ino == old_inode  # a name, once written, is never rewritten or replaced
    assert pickle.loads(blob)[0]["width"] == 50  # a worker reopening the old file reads the same records


def test_a_rewrite_with_size_and_time_kept_is_not_served_stale(tmp_path):
    json_file = write(tmp_path, COCO)
    stat = os.stat(json_file)
    assert load_cached_json(json_file, "/images", lvis=False)[0]["width"] == 50
    text = open(json_file).read().replace('"width": 50', '"width": 51')
    with open(json_file, "w") as f:  # in place: same inode, same size (cp -p, rsync -t, an archive again)
        f.write(text)
    os.utime(json_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(json_file).st_size == stat.st_size and os.stat(json_file).st_ino == stat.st_ino
    assert load_cached_json(json_file, "/images", lvis=False)[0]["width"] == 51


def test_a_machine_hashes_a_json_once_until_it_changes(tmp_path, monkeypatch):
    json_file = write(tmp_path, COCO)
    hashed = []
    original = annotation_cache.hash_file
    monkeypatch.setattr(annotation_cache, "hash_file", lambda path: hashed.append(path) or original(path))
    # Changed within _RACY_S: its ctime could hide a change, so no memo; hashed before and after the parse. Set,
    # not measured: a loaded machine may take longer than the real _RACY_S to get here.
    monkeypatch.setattr(annotation_cache, "_RACY_S", math.inf)
    load_cached_json(json_file, "/images", lvis=False)
    load_cached_json(json_file, "/images", lvis=False)
    assert len(hashed) == 3
    monkeypatch.setattr(annotation_cache, "_RACY_S", -math.inf)  # never racy, whatever the clocks say
    load_cached_json(json_file, "/images", lvis=False)
    assert load_cached_json(json_file, "/images", lvis=False)[0]["width"] == 50 and len(hashed) == 4
    stat = os.stat(json_file)
    time.sleep(0.05)  # past the clock's granularity: the rewrite gets a new ctime
    text = open(json_file).read().replace('"width": 50', '"width": 51')
    with open(json_file, "w") as f:
        f.write(text)
    os.utime(json_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_cached_json(json_file, "/images", lvis=False)[0]["width"] == 51 and len(hashed) == 5


class _RunsCode:
    """Pickled, it runs a shell command when unpickled (what a planted pickle cache file could do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _planted(path, key, marker):
    """A file with the cache's layout and `key` whose record and metadata are pickles that run code."""
    record = pickle.dumps(_RunsCode(marker))
    write_layout(
        path,
        key,
        {
            "record_bytes": ("|u1", record),
            "record_offsets": ("<i8", np.array([0, len(record)], np.int64).tobytes()),
            "record_crcs": ("<u4", np.array([zlib.crc32(record)], np.uint32).tobytes()),
            "annotation_counts": ("<i8", np.zeros(1, np.int64).tobytes()),
            "category_offsets": ("<i8", np.zeros(2, np.int64).tobytes()),
            "categories": ("<i4", b""),
            "instances": ("<i4", b""),
            "heights": ("<f8", np.ones(1).tobytes()),
            "widths": ("<f8", np.ones(1).tobytes()),
            "metadata": ("|u1", pickle.dumps({"categories": [_RunsCode(marker)]})),
        },
    )


def _is_cache_file_warning(record: logging.LogRecord) -> bool:
    # Warnings only: a test that ran earlier in the process may have set the library logger to DEBUG (the
    # program's setup_logger), and then "Wrote the cache file" (INFO) is captured too.
    return record.levelno >= logging.WARNING and "cache file" in record.getMessage()


def test_a_planted_pickle_runs_nothing_and_is_moved_aside(tmp_path, caplog):
    json_file = write(tmp_path, COCO)
    (path,) = load_cached_json(json_file, "/images", lvis=False).cache_paths
    marker = tmp_path / "code_ran"
    _planted(path + ".new", read_table(path)["key"], marker)
    os.replace(path + ".new", path)  # planted by anyone who can write the cache folder
    with caplog.at_level(logging.WARNING):
        records = load_cached_json(json_file, "/images", lvis=False)
        assert list(records) == load_coco_json(json_file, "/images")
    assert not marker.exists()
    (warning,) = [r.getMessage() for r in caplog.records if _is_cache_file_warning(r)]
    assert warning.startswith(f"{path} is not a valid annotation cache file") and "Moved it to" in warning
    (aside,) = glob.glob(path + ".damaged-*")
    assert aside in warning and records.cache_paths == [path]


def _offset_past_end(path):
    blob = open(path, "rb").read()
    _, offset, _, _ = struct.unpack_from("<8sQQ32s", blob, 0)
    table = json.loads(blob[offset:])
    table["arrays"]["categories"][2] = len(blob) * 2
    text = json.dumps(table).encode()
    header = struct.pack("<8sQQ32s", b"LZTCACHE", offset, len(text), hashlib.sha256(text).digest())
    with open(path, "wb") as f:
        f.write(header + blob[56:offset] + text)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_offset_past_end, id="offset-past-the-end"),
        pytest.param(lambda p: os.truncate(p, os.path.getsize(p) // 2), id="truncated"),
        pytest.param(lambda p: open(p, "wb").write(os.urandom(4096)), id="foreign"),
        pytest.param(lambda p: open(p, "wb").close(), id="empty"),
    ],
)
def test_a_damaged_file_is_one_warning_then_rebuilt(tmp_path, damage, caplog):
    json_file = write(tmp_path, COCO)
    (path,) = load_cached_json(json_file, "/images", lvis=False).cache_paths
    damage(path)
    with caplog.at_level(logging.WARNING):
        records = load_cached_json(json_file, "/images", lvis=False)
    assert list(records) == load_coco_json(json_file, "/images")
    warnings = [r.getMessage() for r in caplog.records if _is_cache_file_warning(r)]
    assert len(warnings) == 1 and warnings[0].startswith(path) and "parsing" in warnings[0]
    assert load_cached_json(json_file, "/images", lvis=False).cache_paths == [path]  # good again, no warning
    assert len([r for r in caplog.records if _is_cache_file_warning(r)]) == 1


def _load_and_report(json_file, barrier, results):
    barrier.wait()
    records = load_cached_json(json_file, "/images", lvis=True)
    results.put((os.getpid(), [r["image_id"] for r in records], records.cache_paths))


def _counting_build(marker, original):
    def build(*args, **kwargs):
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # the others arrive while this one parses
        return original(*args, **kwargs)

    return build


def test_concurrent_processes_parse_once(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    marker = tmp_path / "parses.txt"
    monkeypatch.setattr(cached_records, "_build", _counting_build(marker, cached_records._build))
    context = multiprocessing.get_context("fork")  # the patch travels with the fork
    barrier, results = context.Barrier(4), context.Queue()
    processes = [
        context.Process(target=_load_and_report, args=(json_file, barrier, results)) for _ in range(4)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert len(marker.read_text().split()) == 1
    assert all(report[1:] == reports[0][1:] for report in reports) and reports[0][1] == [1, 2, 3]


def _write_until_killed(json_file, ready):
    original = annotation_cache.CacheWriter.write

    def stall(self, records, *args):
        def slow():
            for index, record in enumerate(records):
                if index == 2:
                    ready.set()
                    time.sleep(60)
                yield record

        original(self, slow(), *args)

    annotation_cache.CacheWriter.write = stall
    load_cached_json(json_file, "/images", lvis=True)


def test_kill_during_write_leaves_nothing_read_later(tmp_path, cache_dir):
    json_file = write(tmp_path, lvis_data())
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    writer = context.Process(target=_write_until_killed, args=(json_file, ready))
    writer.start()
    assert ready.wait(timeout=60)
    assert list(cache_dir.glob(".*.tmp*")) and not annotation_cache.list_cache_files()  # only the temporary
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    records = load_cached_json(json_file, "/images", lvis=True)  # the lock was released with the process
    assert list(records) == load_lvis_json(json_file, "/images")
    assert not list(
        cache_dir.glob(".*.tmp*")
    )  # the dead writer's temporary file removed (this host, pid gone)


def test_read_only_data_folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    json_file = write(data, COCO)
    data.chmod(0o555)
    try:
        records = load_cached_json(json_file, str(data), lvis=False)
        assert isinstance(records, CachedRecords) and os.listdir(data) == ["ann.json"]
    finally:
        data.chmod(0o755)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv("LAZYTRAIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert annotation_cache.get_cache_dir() == str(tmp_path / "xdg" / "lazytrain")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert annotation_cache.get_cache_dir() == str(tmp_path / "home" / ".cache" / "lazytrain")
    json_file = write(tmp_path, COCO, "lvis_v1_train.json")
    key = annotation_cache.get_cache_key(json_file, "/coco", lvis=True)
    path = annotation_cache.get_cache_path(key)
    assert os.path.basename(path).startswith("lvis_v1_train-") and path.endswith(".records")
    assert path != annotation_cache.get_cache_path({**key, "lvis": False})
    assert path == annotation_cache.get_cache_path({**key, "json_file": "/elsewhere/lvis_v1_train.json"})


def _two_files(tmp_path):
    first = load_cached_json(write(tmp_path, RICH, "a.json"), "/a", lvis=False)
    second = load_cached_json(write(tmp_path, lvis_data(), "b.json"), "/b", lvis=True)
    return first, second


@pytest.mark.parametrize("filter_empty", [False, True])
def test_concatenated_arrays_equal_records(tmp_path, filter_empty):
    first, second = _two_files(tmp_path)
    records = CachedRecords.concatenate([first, second], filter_empty)
    expected = [r for r in [*first, *second] if r["annotations"] or not filter_empty]
    assert list(records) == expected
    arrays, reference = CategoryIndex.from_dataset_dicts(records), CategoryIndex.from_dataset_dicts(expected)
    for name in ("offsets", "categories", "instances"):
        np.testing.assert_array_equal(getattr(arrays, name), getattr(reference, name))
        assert getattr(arrays, name).flags.writeable  # torch.from_numpy warns about read-only arrays
    for kwargs in ({"repeat_thresh": 0.9}, {"repeat_thresh": 0.6, "sqrt": False, "instance_aware": True}):
        factors = repeat_factors_from_category_frequency(records, **kwargs)
        assert factors.tolist() == repeat_factors_from_category_frequency(expected, **kwargs).tolist()
        assert len(set(factors.tolist())) > 1
    groups = get_aspect_groups(records)
    np.testing.assert_array_equal(groups, get_aspect_groups(expected))
    np.testing.assert_array_equal(get_aspect_groups(DatasetFromList(records)), groups)
    assert records.annotation_counts.tolist() == [len(r["annotations"]) for r in expected]
    assert records.image_sizes.tolist() == [[r["height"], r["width"]] for r in expected]


def test_pickled_records_are_paths_and_keys(tmp_path):
    first, second = _two_files(tmp_path)
    records = CachedRecords.concatenate([first, second], filter_empty=True)
    blob = pickle.dumps(records)
    assert len(blob) < 2000
    assert list(pickle.loads(blob)) == list(records)
    os.remove(records.cache_paths[0])
    with pytest.raises(Exception, match="went away or changed while a run used it"):
        pickle.loads(blob)


def test_get_detection_dataset_dicts_keeps_json_sets_in_their_files(tmp_path, names):
    first = write(tmp_path, RICH, "a.json")
    second = write(tmp_path, lvis_data(), "b.json")
    names += ["cache_a", "cache_b", "in_memory"]
    DatasetCatalog.register("cache_a", lambda: load_cached_json(first, "/a", "cache_a", lvis=False))
    DatasetCatalog.register("cache_b", lambda: load_cached_json(second, "/b", "cache_b", lvis=True))
    DatasetCatalog.register("in_memory", lambda: load_coco_json(first, "/a"))
    records = build.get_detection_dataset_dicts(["cache_a", "cache_b"])
    assert isinstance(records, CachedRecords) and len(records) == 5
    assert list(records) == build.get_detection_dataset_dicts(["in_memory", "cache_b"])
    assert len(build.get_detection_dataset_dicts("cache_a", filter_empty=False)) == 4
    loader = build.build_detection_train_loader(records, mapper=None, total_batch_size=2, seed=0)
    assert loader.dataset.dataset is records  # served from the file, not serialized again
    batch = next(iter(loader))
    assert all(record in list(records) for record in batch)


def test_record_file_is_compact(tmp_path):
    json_file = write(tmp_path, json.loads(json.dumps(RICH)))
    records = load_cached_json(json_file, "/images", lvis=False)
    path = records.cache_paths[0]
    assert os.path.getsize(path) < 8192 and annotation_cache.read_cache_file(path).key["size"] > 0


def test_a_damaged_record_names_the_cache_file_and_how_to_clear_it(tmp_path):
    root = generate_synthetic_lt(str(tmp_path / "synthetic"), num_train=8, num_val=2)
    json_file = os.path.join(root, "lvis_v1_train.json")
    damaged = load_cached_json(json_file, root, lvis=True)  # writes the file and maps it
    (path,) = glob.glob(os.path.join(os.environ["LAZYTRAIN_CACHE"], "lvis_v1_train-*.records"))
    _, _, record_start, _ = read_table(path)["arrays"]["record_bytes"]
    with open(path, "r+b") as f:  # the bytes of a record changed after the file was checked and mapped
        f.seek(record_start + 1)
        f.write(bytes([f.read(1)[0] ^ 1]))  # one bit of a string: still valid msgpack
    with pytest.raises(
        LazytrainError, match=r"annotation cache file .*lvis_v1_train-.*\.records is damaged"
    ) as e:
        [damaged[i] for i in range(len(damaged))]
    assert f"python -m lazytrain cache {os.path.realpath(json_file)} --clear" in str(e.value)


def _flip_bit(path, position):
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize(
    "region",
    ["header", "table", "record_bytes", "record_offsets", "record_crcs", "annotation_counts", "categories",
     "instances", "heights", "widths", "aspect_groups", "metadata"],
)  # fmt: skip
def test_one_flipped_bit_anywhere_is_caught_before_use_and_rebuilt(tmp_path, region, caplog):
    json_file = write(tmp_path, lvis_data())
    (path,) = load_cached_json(json_file, "/images", lvis=True).cache_paths
    good = open(path, "rb").read()
    table = read_table(path)
    if region == "header":
        position = 30  # the table's sha256
    elif region == "table":  # the json's path, which only the listing reads
        position = good.rindex(b"ann.json")
    else:
        dtype, count, offset, _ = table["arrays"][region]
        position = offset + count * np.dtype(dtype).itemsize // 2
    _flip_bit(path, position)
    with caplog.at_level(logging.WARNING):
        records = load_cached_json(json_file, "/images", lvis=True)
        assert list(records) == load_lvis_json(json_file, "/images")
    (warning,) = [r.getMessage() for r in caplog.records if _is_cache_file_warning(r)]
    assert warning.startswith(f"{path} is not a valid annotation cache file") and "Moved it to" in warning
    assert open(path, "rb").read() == good and len(glob.glob(path + ".damaged-*")) == 1


def test_record_bytes_are_checked_once_per_machine_and_file(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    hashed = []
    original = annotation_cache._hash_descriptor

    def counting(fd, *region):  # the json's hash reads it whole, the record bytes' check a region
        hashed.extend([region] if region else [])
        return original(fd, *region)

    monkeypatch.setattr(annotation_cache, "_hash_descriptor", counting)
    records = load_cached_json(
        json_file, "/images", lvis=True
    )  # the writer hashed its bytes as it wrote them
    monkeypatch.setattr(annotation_cache, "_CHECKED", set())  # another process of this machine: the memo
    load_cached_json(json_file, "/images", lvis=True)
    pickle.loads(pickle.dumps(records))  # a spawned loader worker
    assert hashed == []
    for memo in glob.glob(os.path.join(os.environ["LAZYTRAIN_CACHE"], ".sha256", "*")):
        os.remove(memo)
    monkeypatch.setattr(annotation_cache, "_CHECKED", set())
    load_cached_json(json_file, "/images", lvis=True)  # another machine
    assert len(hashed) == 1


def test_record_bytes_of_a_read_only_cache_folder_are_checked_once_per_machine(tmp_path, monkeypatch):
    json_file = write(tmp_path, lvis_data())
    load_cached_json(json_file, "/images", lvis=True)
    memos = os.path.join(os.environ["LAZYTRAIN_CACHE"], ".sha256")
    for memo in glob.glob(os.path.join(memos, "*")):
        os.remove(memo)
    os.rmdir(memos)
    open(memos, "w").close()  # no memo can be written there, as in a team's read-only folder
    hashed = []
    original = annotation_cache._hash_descriptor

    def counting(fd, *region):
        hashed.extend([region] if region else [])
        return original(fd, *region)

    monkeypatch.setattr(annotation_cache, "_hash_descriptor", counting)
    for _ in range(2):  # two processes of this machine
        monkeypatch.setattr(annotation_cache, "_CHECKED", set())
        load_cached_json(json_file, "/images", lvis=True)
    assert len(hashed) == 1 and glob.glob(str(tmp_path / "shm" / "lazytrain-cache-*" / ".sha256" / "*.json"))


def test_a_file_of_an_older_format_is_named_so(tmp_path):
    json_file = write(tmp_path, lvis_data())
    (path,) = load_cached_json(json_file, "/images", lvis=True).cache_paths
    with open(path, "r+b") as f:  # format 2's header: no table sha256
        f.seek(24)
        f.write(bytes(32))
    with pytest.raises(CacheFileError, match="an older format .* reads version 3"):
        annotation_cache.read_cache_file(path)
