"""Samplers: the contract every training sampler keeps, Repeat Factor Sampling's stream against the loop
reference, inference shards, finite samplers made infinite."""

import io
import itertools
import math

import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from lazytrain.data.repeat_factors import repeat_factors_from_category_frequency
from lazytrain.data.samplers import (
    InferenceSampler,
    IterationBasedSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from tests.data.rfs_reference import RECORDS, loop_repeat_factors, loop_stream


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def seeded(sampler_class, *args, seed=0):
    return sampler_class(*args, generator=torch.Generator().manual_seed(seed))


TRAINING_SAMPLERS = [
    pytest.param(
        lambda seed, rank, ws: TrainingSampler(50, seed=seed, rank=rank, world_size=ws), id="training"
    ),
    pytest.param(
        lambda seed, rank, ws: RepeatFactorTrainingSampler.from_dataset_dicts(
            RECORDS, 0.1, seed=seed, rank=rank, world_size=ws
        ),
        id="repeat-factor",
    ),
    pytest.param(
        lambda seed, rank, ws: RepeatFactorTrainingSampler.from_dataset_dicts(
            RECORDS, 0.1, instance_aware=True, seed=seed, rank=rank, world_size=ws
        ),
        id="instance-aware-repeat-factor",
    ),
    pytest.param(
        lambda seed, rank, ws: IterationBasedSampler(
            seeded(RandomSampler, range(37), seed=seed), rank=rank, world_size=ws
        ),
        id="iteration-based-random",
    ),
]


@pytest.mark.parametrize("factory", TRAINING_SAMPLERS)
class TestTrainingSamplerContract:
    def test_same_seed_same_order_different_seed_differs(self, factory):
        assert take(factory(1, 0, 1), 400) == take(factory(1, 0, 1), 400)
        assert take(factory(1, 0, 1), 400) != take(factory(2, 0, 1), 400)

    @pytest.mark.parametrize("world_size", [2, 3])
    def test_rank_shards_are_disjoint_and_cover_the_stream(self, factory, world_size):
        full = take(factory(3, 0, 1), 600)
        shards = [take(factory(3, rank, world_size), 600 // world_size) for rank in range(world_size)]
        # rank r holds exactly the stream positions r, r + W, ...: disjoint, and together all of them
        for rank, shard in enumerate(shards):
            assert shard == full[rank::world_size]

    def test_epochs_differ(self, factory):
        stream = take(factory(5, 0, 1), 400)
        assert stream[:30] != stream[100:130] != stream[200:230]

    @pytest.mark.parametrize("world_size", [1, 2])
    @pytest.mark.parametrize("stop", [1, 37, 400])
    def test_resume_from_state_equals_continuing(self, factory, world_size, stop):
        for rank in range(world_size):
            sampler = factory(7, rank, world_size)
            stream = iter(sampler)
            head = [next(stream) for _ in range(stop)]
            state = sampler.state_dict()
            tail = [next(stream) for _ in range(150)]
            assert state["position"] == stop
            buffer = io.BytesIO()
            torch.save(state, buffer)  # only what weights_only loading accepts
            buffer.seek(0)
            resumed = factory(7, rank, world_size)
            resumed.load_state_dict(torch.load(buffer, weights_only=True))
            assert head + take(resumed, 150) == head + tail
            positional = factory(7, rank, world_size)
            positional.load_state_dict({"position": stop})
            assert take(positional, 150) == tail

    def test_a_state_saved_at_another_world_size_reshards_to_the_same_global_position(self, factory):
        if not hasattr(factory(1, 0, 1), "reshard_state_dict"):
            pytest.skip("IterationBasedSampler may wrap a DistributedSampler, whose shards are its own")
        full = take(factory(11, 0, 1), 400)
        saved = factory(11, 0, 4)
        take(saved, 37)  # every rank of 4 has taken 37: global position 148
        for world_size in (1, 2, 4):
            ranks = [factory(0, rank, world_size) for rank in range(world_size)]
            for sampler in ranks:
                sampler.load_state_dict(sampler.reshard_state_dict(saved.state_dict(), 4))
            shards = [take(sampler, 60 // world_size) for sampler in ranks]
            assert [shards[i % world_size][i // world_size] for i in range(60)] == full[148:208]
        assert factory(0, 0, 3).reshard_state_dict(saved.state_dict(), 4) is None  # 148 is no multiple of 3

    def test_state_after_resume_matches_an_uninterrupted_run(self, factory):
        sampler = factory(9, 0, 1)
        take(sampler, 250)
        resumed = factory(9, 0, 1)
        resumed.load_state_dict({"position": 100})
        take(resumed, 150)
        assert resumed.state_dict()["position"] == sampler.state_dict()["position"] == 250
        again = factory(9, 0, 1)
        again.load_state_dict(resumed.state_dict())
        assert take(again, 50) == take(sampler, 300)[250:]


@pytest.mark.parametrize("sampler_class", [TrainingSampler, RepeatFactorTrainingSampler])
def test_resume_regenerates_one_epoch_only(sampler_class, monkeypatch):
    sampler = (
        TrainingSampler(40, seed=0, rank=0, world_size=1)
        if sampler_class is TrainingSampler
        else RepeatFactorTrainingSampler.from_dataset_dicts(RECORDS[:40], 0.3, seed=0, rank=0, world_size=1)
    )
    stream = iter(sampler)
    for _ in range(40 * 25 + 3):  # ~20 epochs in
        next(stream)
    resumed = (
        TrainingSampler(40, seed=0, rank=0, world_size=1)
        if sampler_class is TrainingSampler
        else RepeatFactorTrainingSampler.from_dataset_dicts(RECORDS[:40], 0.3, seed=0, rank=0, world_size=1)
    )
    resumed.load_state_dict(sampler.state_dict())
    calls = []
    original = resumed._epoch
    monkeypatch.setattr(resumed, "_epoch", lambda g: calls.append(1) or original(g))
    assert take(resumed, 50) == [next(stream) for _ in range(50)]
    assert len(calls) <= 2  # the epoch of the state, and maybe the next one


def test_resumed_state_carries_the_seed():
    sampler = TrainingSampler(30, seed=11, rank=0, world_size=1)
    take(sampler, 45)
    other = TrainingSampler(30, seed=12, rank=0, world_size=1)
    other.load_state_dict(sampler.state_dict())
    assert other.seed == 11 and take(other, 10) == take(sampler, 55)[45:]


def test_unshuffled_training_sampler_repeats_the_range():
    assert take(TrainingSampler(4, shuffle=False, seed=0, rank=1, world_size=2), 5) == [1, 3, 1, 3, 1]


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match=r"TrainingSampler\(size=\) must be a positive int.*got 0"):
        TrainingSampler(0, seed=0)
    with pytest.raises(ValueError, match=r"TrainingSampler\(rank=, world_size=\).*got rank=2, world_size=2"):
        TrainingSampler(5, seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"repeat_factors=\) must be finite and >= 0"):
        RepeatFactorTrainingSampler(torch.tensor([1.0, -1.0]), seed=0)


def test_seed_none_is_shared_random_seed(monkeypatch):
    from lazytrain.utils import comm

    monkeypatch.setattr(comm, "shared_random_seed", lambda: 1234)
    assert TrainingSampler(5, rank=0, world_size=1).seed == 1234


# ----------------------------------------------------------------------------------------------------------
# Repeat factor sampling


@pytest.mark.parametrize("seed", [0, 1, 42, 2**40 + 3])
@pytest.mark.parametrize("thresh", [0.01, 0.3, 2.0])
def test_stream_equals_the_loop_reference_bit_for_bit(seed, thresh):
    factors = loop_repeat_factors(RECORDS, thresh)
    expected = loop_stream(factors, seed, num_epochs=3)
    sampler = RepeatFactorTrainingSampler(factors, seed=seed, rank=0, world_size=1)
    assert take(sampler, len(expected)) == expected


def test_epoch_length_matches_sum_of_factors():
    factors = repeat_factors_from_category_frequency(RECORDS, 0.3)
    sampler = RepeatFactorTrainingSampler(factors, seed=0, rank=0, world_size=1)
    generator = torch.Generator().manual_seed(0)
    num_epochs = 200
    lengths = [len(sampler._epoch(generator)) for _ in range(num_epochs)]
    fractions = (factors - factors.trunc()).double()
    # the length is a sum of independent Bernoulli(frac) over images: std of the mean over epochs
    std = math.sqrt(float((fractions * (1 - fractions)).sum()) / num_epochs)
    assert abs(sum(lengths) / num_epochs - float(factors.double().sum())) < 4 * std
    assert float(factors.sum()) > 1.2 * len(RECORDS)


def test_each_image_appears_as_often_as_its_factor():
    factors = torch.tensor([1.0, 2.5, 4.0, 1.25])
    sampler = RepeatFactorTrainingSampler(factors, seed=0, rank=0, world_size=1)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(400):
        epoch = sampler._epoch(generator)
        assert epoch.dtype == torch.int32
        counts += torch.bincount(epoch, minlength=4)
    assert (counts / 400).tolist() == pytest.approx(factors.tolist(), abs=0.1)


def test_from_dataset_dicts_is_the_config_facing_constructor():
    sampler = RepeatFactorTrainingSampler.from_dataset_dicts(
        RECORDS, repeat_thresh=0.3, sqrt=True, instance_aware=False, seed=4, rank=0, world_size=1
    )
    factors = loop_repeat_factors(RECORDS, 0.3)
    assert torch.equal(sampler.repeat_factors, factors)
    assert take(sampler, 200) == loop_stream(factors, 4, num_epochs=1)[:200]


# ----------------------------------------------------------------------------------------------------------
# Inference sampler


@pytest.mark.parametrize(
    "size, world_size, expected",
    [
        pytest.param(16, 2, [list(range(0, 8)), list(range(8, 16))], id="16/2"),
        pytest.param(2, 3, [[0], [1], []], id="2/3"),
        pytest.param(5, 2, [[0, 1, 2], [3, 4]], id="5/2"),
        pytest.param(0, 2, [[], []], id="0/2"),
    ],
)
def test_inference_sampler_shards(size, world_size, expected):
    shards = [list(InferenceSampler(size, rank=r, world_size=world_size)) for r in range(world_size)]
    assert shards == expected
    assert [len(InferenceSampler(size, rank=r, world_size=world_size)) for r in range(world_size)] == [
        len(s) for s in expected
    ]


# ----------------------------------------------------------------------------------------------------------
# Finite samplers made infinite


FINITE_SAMPLERS = [
    pytest.param(lambda: seeded(RandomSampler, range(7)), id="random"),
    pytest.param(lambda: RandomSampler(range(7), replacement=True, num_samples=5), id="random-replacement"),
    pytest.param(lambda: seeded(WeightedRandomSampler, [0.1, 0.9, 0.5], 5), id="weighted"),
    pytest.param(lambda: SubsetRandomSampler([2, 4, 6]), id="subset"),
    pytest.param(lambda: DistributedSampler(range(8), num_replicas=2, rank=1, seed=3), id="distributed"),
]


@pytest.mark.parametrize("finite", FINITE_SAMPLERS)
def test_finite_samplers_become_resumable_infinite_streams(finite):
    sampler = IterationBasedSampler(finite(), seed=0, rank=0, world_size=1)
    stream = iter(sampler)
    head = [next(stream) for _ in range(17)]
    state = sampler.state_dict()
    tail = [next(stream) for _ in range(23)]
    resumed = IterationBasedSampler(finite(), seed=0, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert take(resumed, 23) == tail
    assert len(head) == 17


def test_finite_sampler_without_generator_is_seeded_so_ranks_agree():
    shards = [
        take(IterationBasedSampler(RandomSampler(range(10)), seed=5, rank=r, world_size=2), 15)
        for r in (0, 1)
    ]
    full = take(IterationBasedSampler(RandomSampler(range(10)), seed=5, rank=0, world_size=1), 30)
    assert shards == [full[0::2], full[1::2]]
    assert sorted(shards[0][:5] + shards[1][:5]) == list(range(10))


def test_distributed_sampler_is_not_resharded_and_gets_set_epoch():
    stream = take(
        IterationBasedSampler(
            DistributedSampler(range(8), num_replicas=2, rank=0, seed=3), rank=1, world_size=2
        ),
        12,
    )
    assert len(set(stream[:4])) == 4 and stream[:4] != stream[4:8]
    assert set(stream[:4]) == set(DistributedSampler(range(8), num_replicas=2, rank=0, seed=3))
