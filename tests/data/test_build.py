import gc
import io
import itertools
import json
import logging
import os
import random
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch.utils.data import DistributedSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from lazytrain.config import LazyCall as L
from lazytrain.config import LazyConfig, instantiate
from lazytrain.data import build as build_module
from lazytrain.data.build import (
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
    sample_seed,
)
from lazytrain.data.catalog import DatasetCatalog
from lazytrain.data.common import DatasetFromList
from lazytrain.data.samplers import InferenceSampler, RepeatFactorTrainingSampler, TrainingSampler
from lazytrain.errors import LazytrainError
from lazytrain.utils import comm

CALLS = {"make_records": 0}


def make_records(n=40):
    CALLS["make_records"] += 1
    rng = random.Random(0)
    return [
        {
            "file_name": f"{i}.jpg",
            "image_id": i,
            "width": rng.choice([60, 100]),
            "height": rng.choice([60, 100]) + 1,
            "annotations": [{"category_id": 0 if i % 7 else 1 + i % 3}],
        }
        for i in range(n)
    ]


def noisy_mapper(record):
    # draws from the global RNGs like random augmentations do
    return {
        "image_id": record["image_id"],
        "landscape": record["width"] > record["height"],
        "noise": (random.random(), float(np.random.rand()), torch.rand(1).item()),
    }


class NoisyMapper:
    def __call__(self, record):
        return noisy_mapper(record)


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_batches_are_grouped_by_orientation():
    loader = build_detection_train_loader(make_records(), mapper=noisy_mapper, total_batch_size=4, seed=0)
    batches = take(loader, 30)
    assert all(len(batch) == 4 and len({item["landscape"] for item in batch}) == 1 for batch in batches)
    assert {batch[0]["landscape"] for batch in batches} == {True, False}


def test_grouping_reads_sizes_from_a_dataset_from_list():
    loader = build_detection_train_loader(
        DatasetFromList(make_records()), mapper=noisy_mapper, total_batch_size=4, seed=0
    )
    assert all(len({item["landscape"] for item in batch}) == 1 for batch in take(loader, 20))


def test_grouping_without_sizes_warns(caplog):
    records = [{"image_id": i} for i in range(8)]
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.build"):
        loader = build_detection_train_loader(records, mapper=None, total_batch_size=2, seed=0)
    assert "aspect_ratio_grouping needs records with 'width' and 'height'" in caplog.text
    assert [r["image_id"] for b in take(loader, 4) for r in b] == take(TrainingSampler(8, seed=0), 8)


def test_batch_size_must_divide_world_size(monkeypatch):
    monkeypatch.setattr(comm, "get_world_size", lambda: 2)
    with pytest.raises(
        ValueError,
        match=r"total_batch_size=3\) must be a positive multiple of the world size 2; set "
        r"dataloader.train.total_batch_size to a multiple of 2",
    ):
        build_detection_train_loader(make_records(), mapper=noisy_mapper, total_batch_size=3, seed=0)


def build(num_workers, records=None, **kwargs):
    kwargs.setdefault("total_batch_size", 4)
    return build_detection_train_loader(
        records or make_records(), mapper=noisy_mapper, seed=3, num_workers=num_workers, **kwargs
    )


def round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("consumed", [1, 5])
def test_resumed_loader_yields_the_same_batches(num_workers, consumed):
    reference = take(build(0), 12)
    first = build(num_workers)
    stream = iter(first)
    head = [next(stream) for _ in range(consumed)]
    state = round_trip(first.state_dict())  # workers have prefetched more than `consumed` batches by now
    assert state["batches"] == consumed
    del stream
    resumed = build(num_workers)
    resumed.load_state_dict(state)
    assert head + take(resumed, 12 - consumed) == reference  # same images, same augmentation draws


@pytest.mark.parametrize("num_workers", [0, 1])
def test_iterating_never_touches_the_global_rngs(num_workers):
    """Starting the loader at iteration 0 or in a resumed run must leave the trainer's random stream alone
    (issue 17: torch's DataLoader drew its base seed from the global RNG at the first batch)."""
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


def test_state_is_the_consumed_one_and_iterating_again_continues():
    loader = build(2)
    reference = take(build(0), 6)
    assert take(loader, 2) == reference[:2]
    assert loader.state_dict()["batches"] == 2
    assert take(loader, 4) == reference[2:]


def test_resume_with_another_worker_count_and_a_rfs_sampler():
    def rfs_loader(num_workers):
        records = make_records()
        sampler = RepeatFactorTrainingSampler.from_dataset_dicts(records, 0.5, seed=1, rank=0, world_size=1)
        return build(num_workers, records=records, sampler=sampler)

    reference = take(rfs_loader(0), 8)
    first = rfs_loader(2)
    assert take(first, 3) == reference[:3]
    resumed = rfs_loader(0)
    resumed.load_state_dict(round_trip(first.state_dict()))
    assert take(resumed, 5) == reference[3:]


def test_sample_seed_depends_on_position_not_world_size():
    assert sample_seed(3, 10) == sample_seed(3, 10) != sample_seed(3, 11)
    assert (
        len({sample_seed(0, p) for p in range(10_000)} | {sample_seed(1, p) for p in range(10_000)}) == 20_000
    )
    assert 0 <= sample_seed(2**70, 2**40) < 2**63


def test_sampler_built_for_another_dataset_is_an_error():
    sampler = RepeatFactorTrainingSampler.from_dataset_dicts(
        make_records(30), 0.5, seed=1, rank=0, world_size=1
    )
    with pytest.raises(ValueError, match=r"samples 30 images but the dataset has 40"):
        build(0, sampler=sampler)


FINITE_SAMPLERS = [
    pytest.param(lambda: RandomSampler(range(6)), id="random"),
    pytest.param(lambda: WeightedRandomSampler([0.1, 0.9, 0.5, 1, 1, 1], 5), id="weighted"),
    pytest.param(lambda: SubsetRandomSampler([2, 4, 5]), id="subset"),
    pytest.param(lambda: DistributedSampler(range(6), num_replicas=2, rank=1, seed=3), id="distributed"),
]


@pytest.mark.parametrize("finite", FINITE_SAMPLERS)
def test_finite_torch_sampler_becomes_an_infinite_resumable_stream(finite):
    def loader():
        return build(
            0, records=make_records(6), sampler=finite(), total_batch_size=2, aspect_ratio_grouping=False
        )

    reference = take(loader(), 10)  # more batches than one pass of the sampler
    first = loader()
    assert take(first, 4) == reference[:4]
    resumed = loader()
    resumed.load_state_dict(round_trip(first.state_dict()))
    assert take(resumed, 6) == reference[4:]


def test_unsupported_sampler_is_a_type_error():
    with pytest.raises(TypeError, match=r"sampler=\) must be a lazytrain training sampler"):
        build(0, sampler=iter(range(5)))


def test_recipe_sampler_node_shares_the_dataset_and_takes_overrides():
    cfg = OmegaConf.create(
        {
            "train": L(build_detection_train_loader)(
                dataset=L(make_records)(n=40),
                mapper=L(NoisyMapper)(),
                sampler=L(RepeatFactorTrainingSampler.from_dataset_dicts)(
                    dataset_dicts="${..dataset}", repeat_thresh=0.5, sqrt=True, instance_aware=False, seed=2
                ),
                total_batch_size=2,
                seed=2,
            )
        }
    )
    LazyConfig.apply_overrides(cfg, ["train.sampler.repeat_thresh=0"])
    CALLS["make_records"] = 0
    loader = instantiate(cfg.train)
    assert CALLS["make_records"] == 1  # one records object for the loader and the sampler
    assert loader.batch_sampler.sampler.repeat_factors.unique().tolist() == [1.0]  # uniform at t=0


def test_test_loader_covers_every_image_once():
    records = make_records(7)
    assert [b[0]["image_id"] for b in build_detection_test_loader(records, mapper=noisy_mapper)] == list(
        range(7)
    )
    shards = [
        [
            r["image_id"]
            for b in build_detection_test_loader(records, mapper=None, sampler=s, batch_size=2)
            for r in b
        ]
        for s in (InferenceSampler(7, rank=r, world_size=3) for r in range(3))
    ]
    assert shards == [[0, 1, 2], [3, 4], [5, 6]]


def test_test_loader_does_not_replace_an_unreadable_image():
    def mapper(record):
        if record["image_id"] == 2:
            raise FileNotFoundError("no such file")
        return record

    with pytest.raises(LazytrainError, match=r"the last was 2.jpg \(FileNotFoundError: no such file\)"):
        list(build_detection_test_loader(make_records(4), mapper=mapper))


@pytest.fixture
def two_datasets():
    DatasetCatalog.register("_build_a", lambda: make_records(3))
    DatasetCatalog.register("_build_b", lambda: [dict(r, annotations=[]) for r in make_records(2)])
    yield
    DatasetCatalog.remove("_build_a")
    DatasetCatalog.remove("_build_b")


def test_get_detection_dataset_dicts(two_datasets):
    assert len(get_detection_dataset_dicts("_build_a")) == 3
    assert len(get_detection_dataset_dicts(["_build_a", "_build_b"], filter_empty=False)) == 5
    assert len(get_detection_dataset_dicts(["_build_a", "_build_b"])) == 3
    with pytest.raises(KeyError, match=r"'_build_c' is not registered.*Registered names.*_build_a"):
        get_detection_dataset_dicts(["_build_a", "_build_c"])
    with pytest.raises(ValueError, match=r"no images in \['_build_b'\] with annotations"):
        get_detection_dataset_dicts("_build_b")


# ----------------------------------------------------------------------------------------------------------
# Two processes (gloo): the ranks' train loaders read disjoint positions of one stream.


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record_rank(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        result = {}
        for grouping in (False, True):
            loader = build_detection_train_loader(
                make_records(),
                mapper=noisy_mapper,
                total_batch_size=4,
                aspect_ratio_grouping=grouping,
                seed=None,
            )
            items = [[item["image_id"], item["noise"][0]] for b in take(loader, 15) for item in b]
            result[str(grouping)] = {"seed": loader.batch_sampler.seed, "items": items}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()  # no rank tears gloo down while the other still uses it (seen: SIGABRT, rarely)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_read_disjoint_shards_of_one_stream(tmp_path):
    mp.start_processes(_record_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    seed = ranks[0]["False"]["seed"]
    assert ranks[1]["False"]["seed"] == seed  # seed=None: drawn on rank 0, shared
    # Without grouping rank r takes the global positions r, r+2, ...: one process sees the same items.
    single = build_detection_train_loader(
        make_records(), mapper=noisy_mapper, total_batch_size=2, seed=seed, aspect_ratio_grouping=False
    )
    expected = [[item["image_id"], item["noise"][0]] for b in take(single, 30) for item in b]
    assert ranks[0]["False"]["items"] == expected[0::2] and ranks[1]["False"]["items"] == expected[1::2]
    # With grouping the batches differ, but the positions (and so the augmentation draws) stay disjoint.
    draws = [{noise for _, noise in r["True"]["items"]} for r in ranks]
    assert len(draws[0]) == len(draws[1]) == 30 and not draws[0] & draws[1]


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
        monkeypatch.setattr(build_module.gc, "freeze", lambda: None)
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


def tensor_mapper(record):
    generator = torch.Generator().manual_seed(record["image_id"])
    image = torch.randint(
        0, 255, (3, record["height"], record["width"]), dtype=torch.uint8, generator=generator
    )
    return {
        "image": image,
        "instances": {
            "boxes": torch.rand(2, 4, generator=generator),
            "classes": torch.tensor([record["image_id"], 1]),
            "masks": image[:2] > 128,  # bool
            "empty": torch.zeros(0, 4, dtype=torch.float64),
        },
        "transposed": (torch.arange(6.0).view(2, 3).t(), "text", 7),  # not contiguous
        "image_id": record["image_id"],
    }


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys() and all(assert_same(a[k], b[k]) is None for k in a)
    elif isinstance(a, (list, tuple)):
        assert (
            type(a) is type(b) and len(a) == len(b) and all(assert_same(x, y) is None for x, y in zip(a, b))
        )
    else:
        assert a == b


@pytest.mark.parametrize("ring_bytes", [None, 1_000_000])
def test_worker_batches_arrive_intact_through_the_packed_buffer(ring_bytes, monkeypatch):
    # 40 batches: each worker refills each of its ring slots several times while the test holds every batch;
    # with 1 MB for the whole ring (100 kB per slot) some batches do not fit and travel in their own segment
    if ring_bytes is not None:
        monkeypatch.setattr(build_module, "_RING_BYTES", ring_bytes)

    def loader(num_workers):
        return build_detection_train_loader(
            make_records(), mapper=tensor_mapper, total_batch_size=3, num_workers=num_workers, seed=1
        )

    received = take(loader(2), 40)
    assert_same(received, take(loader(0), 40))
    if ring_bytes is not None:
        sizes = [sum(5 * item["image"][0].numel() for item in batch) for batch in received]  # image + masks
        assert min(sizes) < 100_000 < max(sizes)  # both paths were taken


PARENT_STATE = {"set_after_import": None}


def parent_state_mapper(record):
    # a forked worker sees what the parent set at run time; a spawned one re-imports this module
    return {"image_id": record["image_id"], "parent_state": PARENT_STATE["set_after_import"]}


def test_workers_are_forked_even_when_spawn_is_the_global_start_method(monkeypatch):
    import multiprocessing

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
