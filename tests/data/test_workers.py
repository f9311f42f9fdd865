"""Loader workers: per-sample seeds, the global RNGs left alone, forked workers that do not copy the parent's
records."""

import gc
import itertools
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from lazytrain.data import workers
from lazytrain.data.build import build_detection_test_loader, build_detection_train_loader
from lazytrain.data.workers import sample_seed
from tests.data.loader_helpers import build, make_records, take

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sample_seed_depends_on_position_not_world_size():
    assert sample_seed(3, 10) == sample_seed(3, 10) != sample_seed(3, 11)
    assert (
        len({sample_seed(0, p) for p in range(10_000)} | {sample_seed(1, p) for p in range(10_000)}) == 20_000
    )
    assert 0 <= sample_seed(2**70, 2**40) < 2**63


@pytest.mark.parametrize("num_workers", [0, 1])
def test_iterating_never_touches_the_global_rngs(num_workers):
    """Starting the loader at iteration 0 or in a resumed run must leave the trainer's random stream alone
    (torch's DataLoader draws its workers' base seed from the global RNG unless given a generator)."""
    loader = build(num_workers)
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    stream = iter(loader)
    next(stream)
    next(stream)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    del stream


def _private_kb():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))


def _collect_garbage(record):
    before = _private_kb()
    gc.collect()
    return _private_kb() - before


@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "control"])
def test_a_garbage_collection_in_a_worker_does_not_copy_the_parents_records(freeze, monkeypatch):
    if not freeze:
        monkeypatch.setattr(gc, "freeze", lambda: None)
    held = [{"file_name": f"{i}.jpg", "annotations": [{"bbox": [1.0, 2, 3, 4]}]} for i in range(100_000)]
    loader = build_detection_train_loader(
        [{}] * 2,
        mapper=_collect_garbage,
        total_batch_size=1,
        num_workers=1,
        seed=0,
        aspect_ratio_grouping=False,
    )
    growth_kb = next(iter(loader))[0]
    assert (growth_kb < 5_000) if freeze else (growth_kb > 20_000), growth_kb
    del held


PARENT_STATE = {"set_after_import": None}


def parent_state_mapper(record):
    # a forked worker sees what the parent set at run time; a spawned one re-imports this module
    return {"image_id": record["image_id"], "parent_state": PARENT_STATE["set_after_import"]}


def test_workers_are_forked_even_when_spawn_is_the_global_start_method(monkeypatch):
    monkeypatch.setitem(PARENT_STATE, "set_after_import", 1234)
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)  # what launching several processes does
    try:
        train = build_detection_train_loader(
            make_records(8), mapper=parent_state_mapper, total_batch_size=2, num_workers=1, seed=0
        )
        test = build_detection_test_loader(make_records(4), mapper=parent_state_mapper, num_workers=1)
        states = [s["parent_state"] for batch in take(train, 2) for s in batch]
        states += [s["parent_state"] for batch in test for s in batch]
    finally:
        multiprocessing.set_start_method(previous, force=True)
    assert states == [1234] * 8


def slow_image_id(record):
    time.sleep(0.02)
    return record["image_id"]


def _new_children(before: set[int]) -> list[int]:
    return [p.pid for p in multiprocessing.active_children() if p.pid not in before]


@pytest.mark.parametrize("loader", ["train", "test"])
def test_workers_outlive_a_sigterm_to_the_whole_job_and_deliver_every_batch(loader):
    """SLURM's preemption signals every process of a job, workers included: the rank must still get its
    batches, to finish its step and write the stop checkpoint (a worker killed by it failed the rank)."""
    before = {p.pid for p in multiprocessing.active_children()}
    if loader == "train":
        batches = iter(
            build_detection_train_loader(
                make_records(64), mapper=slow_image_id, total_batch_size=2, num_workers=2, seed=0
            )
        )
        expected = 32
    else:
        batches = iter(build_detection_test_loader(make_records(64), mapper=slow_image_id, num_workers=2))
        expected = 64
    received = list(itertools.islice(batches, 4))  # each worker has started
    workers = _new_children(before)
    assert len(workers) == 2
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    received += list(itertools.islice(batches, expected - 4))
    assert len(received) == expected
    if loader == "test":
        assert sorted(i for batch in received for i in batch) == list(range(64))
    assert set(_new_children(before)) == set(workers)  # all alive
    del batches


_EXIT_WITH_A_STUCK_WORKER = """
import os, signal, sys, time
from lazytrain.data.build import build_detection_test_loader
from tests.data.test_workers import stuck_after_the_first_two

batches = iter(build_detection_test_loader([{"image_id": i} for i in range(8)], mapper=stuck_after_the_first_two, num_workers=2))
next(batches), next(batches)  # each worker has started
for worker in batches._workers:
    os.kill(worker.pid, signal.SIGTERM)
time.sleep(0.3)
assert all(worker.is_alive() for worker in batches._workers)
print(" ".join(str(worker.pid) for worker in batches._workers), flush=True)
sys.exit(143)  # a rank stopping with its loader open and a worker busy
"""


def stuck_after_the_first_two(record):
    if record["image_id"] > 1:
        time.sleep(600)
    return record["image_id"]


def test_a_rank_exiting_ends_its_workers_that_outlived_a_sigterm():
    """torch's loader shutdown and Python's exit end a worker that does not stop by itself with SIGTERM, and
    wait for it: a worker that ignored SIGTERM for good hung its rank's exit."""
    command = [sys.executable, "-c", _EXIT_WITH_A_STUCK_WORKER]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 143, result.stderr[-2000:]
    for pid in map(int, result.stdout.split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_more_workers_than_cpus_are_capped_with_one_log_line(monkeypatch, caplog):
    """A recipe's 4 workers on a 2-CPU machine start 2, and the log says so once per loader and process
    (failed before: 4 workers, and only torch's warning about them)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(workers, "_reported_caps", set())
    with caplog.at_level("INFO", logger="lazytrain.data.workers"):
        train = build(4, total_batch_size=2)
        test = build_detection_test_loader(make_records(4), mapper=None, num_workers=4)
        again = build_detection_test_loader(
            make_records(4), mapper=None, num_workers=4
        )  # the next evaluation
        within = build(2, total_batch_size=2)
    assert (train.num_workers, test.num_workers, again.num_workers, within.num_workers) == (2, 2, 2, 2)
    assert [r.getMessage() for r in caplog.records] == [
        f"dataloader.{split}.num_workers=4 but this process may use 2 CPUs: starting 2 workers (set "
        f"dataloader.{split}.num_workers to choose fewer)."
        for split in ("train", "test")
    ]
