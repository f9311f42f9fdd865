import itertools
import random

import pytest
import torch

from lazytrain.data.build import build_detection_test_loader, build_detection_train_loader
from lazytrain.data.samplers import RepeatFactorTrainingSampler


def make_records(n=40):
    rng = random.Random(0)
    return [
        {
            "image_id": i,
            "width": rng.choice([60, 100]),
            "height": rng.choice([60, 100]) + 1,
            "annotations": [{"category_id": i % 3}],
        }
        for i in range(n)
    ]


def noisy_mapper(record):
    # draws from the global RNG like a random augmentation does
    return {
        "image_id": record["image_id"],
        "landscape": record["width"] > record["height"],
        "noise": torch.rand(1).item(),
        "r": random.random(),
    }


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_batches_are_grouped_by_orientation():
    loader = build_detection_train_loader(make_records(), mapper=noisy_mapper, total_batch_size=4, seed=0)
    for batch in take(loader, 20):
        assert len(batch) == 4
        assert len({item["landscape"] for item in batch}) == 1


def test_batch_size_must_divide_world_size(monkeypatch):
    from lazytrain.utils import comm

    monkeypatch.setattr(comm, "get_world_size", lambda: 2)
    with pytest.raises(
        ValueError, match=r"total_batch_size=3\) must be a positive multiple of the world size 2"
    ):
        build_detection_train_loader(make_records(), mapper=noisy_mapper, total_batch_size=3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumed_loader_yields_the_same_batches(num_workers):
    records = make_records()
    reference = take(
        build_detection_train_loader(
            records, mapper=noisy_mapper, total_batch_size=4, seed=3, num_workers=num_workers
        ),
        12,
    )
    first = build_detection_train_loader(
        records, mapper=noisy_mapper, total_batch_size=4, seed=3, num_workers=num_workers
    )
    stream = iter(first)
    consumed = [next(stream) for _ in range(5)]
    state = first.state_dict()
    assert state["batches"] == 5
    del stream
    resumed = build_detection_train_loader(
        records, mapper=noisy_mapper, total_batch_size=4, seed=3, num_workers=num_workers
    )
    resumed.load_state_dict(state)
    assert consumed + take(resumed, 7) == reference


def test_rfs_sampler_plugs_into_loader():
    records = make_records()
    sampler = RepeatFactorTrainingSampler.from_dataset_dicts(records, 0.5, seed=1, rank=0, world_size=1)
    loader = build_detection_train_loader(records, mapper=noisy_mapper, sampler=sampler, total_batch_size=2)
    assert len(take(loader, 3)) == 3


def test_finite_torch_sampler_becomes_infinite():
    records = make_records(6)
    sampler = torch.utils.data.RandomSampler(range(6), generator=torch.Generator().manual_seed(0))
    loader = build_detection_train_loader(
        records, mapper=noisy_mapper, sampler=sampler, total_batch_size=2, aspect_ratio_grouping=False
    )
    assert len(take(loader, 10)) == 10  # more batches than one pass of the sampler


def test_test_loader_covers_every_image_once():
    records = make_records(7)
    loader = build_detection_test_loader(records, mapper=noisy_mapper)
    assert [b[0]["image_id"] for b in loader] == list(range(7))
