import itertools
import math
import random

import pytest
import torch
from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from lazytrain.data.samplers import (
    CategoryIndex,
    InferenceSampler,
    IterationBasedSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from tests.data.rfs_reference import reference_repeat_factors, reference_stream


def make_dicts(num_images, num_categories=20, seed=0):
    rng = random.Random(seed)
    records = []
    for i in range(num_images):
        count = rng.choice([0, 1, 1, 2, 3])
        # power-law-ish category popularity
        cats = [min(int(rng.paretovariate(1.0)) - 1, num_categories - 1) for _ in range(count)]
        records.append({"image_id": i, "annotations": [{"category_id": c} for c in cats]})
    return records


RECORDS = make_dicts(300)


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


SAMPLER_FACTORIES = [
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
]


@pytest.mark.parametrize("factory", SAMPLER_FACTORIES)
class TestTrainingSamplerContract:
    def test_same_seed_same_order_different_seed_differs(self, factory):
        assert take(factory(1, 0, 1), 400) == take(factory(1, 0, 1), 400)
        assert take(factory(1, 0, 1), 400) != take(factory(2, 0, 1), 400)

    def test_rank_shards_are_disjoint_and_cover_the_stream(self, factory):
        full = take(factory(3, 0, 1), 600)
        shard0, shard1 = take(factory(3, 0, 2), 300), take(factory(3, 1, 2), 300)
        assert shard0 == full[0::2] and shard1 == full[1::2]

    def test_epochs_differ(self, factory):
        stream = take(factory(5, 0, 1), 100)
        assert stream[:50] != stream[50:]

    @pytest.mark.parametrize("world_size", [1, 2])
    def test_resume_at_position_equals_continuing(self, factory, world_size):
        for rank in range(world_size):
            full = take(factory(7, rank, world_size), 700)
            resumed = factory(7, rank, world_size)
            resumed.load_state_dict({"position": 523})
            assert take(resumed, 177) == full[523:]


def test_rfs_formula_hand_computed():
    records = [
        {"annotations": [{"category_id": 0}, {"category_id": 1}]},
        {"annotations": [{"category_id": 0}]},
        {"annotations": []},
    ]
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, 0.5)
    # f_0 = 2/3 -> r_0 = 1; f_1 = 1/3 -> r_1 = sqrt(1.5)
    assert factors.tolist() == pytest.approx([math.sqrt(1.5), 1.0, 1.0])
    no_sqrt = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, 0.5, sqrt=False)
    assert no_sqrt.tolist() == pytest.approx([1.5, 1.0, 1.0])


def test_irfs_formula_hand_computed():
    records = [
        {"annotations": [{"category_id": 0}] * 3 + [{"category_id": 1}]},
        {"annotations": [{"category_id": 0}]},
    ]
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
        records, 0.9, instance_aware=True
    )
    f1 = math.sqrt((1 / 2) * (1 / 5))  # image freq 1/2, instance freq 1/5
    f0 = math.sqrt((2 / 2) * (4 / 5))
    expected0 = max(1.0, math.sqrt(0.9 / f0), math.sqrt(0.9 / f1))
    assert factors.tolist() == pytest.approx([expected0, max(1.0, math.sqrt(0.9 / f0))])


def test_zero_threshold_is_uniform_and_negative_is_error():
    assert RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
        RECORDS, 0.0
    ).unique().tolist() == [1.0]
    with pytest.raises(
        ValueError,
        match=r"repeat_thresh=\) must be >= 0.*got -0\.1.*dataloader\.train\.sampler\.repeat_thresh",
    ):
        RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(RECORDS, -0.1)


@pytest.mark.parametrize("seed", [0, 1, 42])
@pytest.mark.parametrize("thresh", [0.01, 0.3])
def test_vectorized_stream_equals_loop_reference_bit_for_bit(seed, thresh):
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(RECORDS, thresh)
    reference = reference_repeat_factors(RECORDS, thresh)
    assert torch.equal(factors, reference)
    expected = reference_stream(reference, seed, num_epochs=3)
    sampler = RepeatFactorTrainingSampler(factors, seed=seed, rank=0, world_size=1)
    assert take(sampler, len(expected)) == expected


def test_epoch_length_matches_sum_of_factors():
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(RECORDS, 0.3)
    sampler = RepeatFactorTrainingSampler(factors, seed=0, rank=0, world_size=1)
    generator = torch.Generator().manual_seed(0)
    lengths = [len(sampler._epoch(generator)) for _ in range(200)]
    expected = factors.sum().item()
    # variance of the length is sum p(1-p) over fractional parts; 200 epochs -> tight mean
    std = math.sqrt(sum(f * (1 - f) for f in (factors - factors.trunc()).tolist()) / 200)
    assert abs(sum(lengths) / 200 - expected) < 4 * std + 1e-6
    assert expected > len(RECORDS)


def test_category_index_accepts_prebuilt_csr():
    index = CategoryIndex.from_dataset_dicts(RECORDS)
    assert torch.equal(
        RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(index, 0.1),
        RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(RECORDS, 0.1),
    )


@pytest.mark.parametrize(
    "size, world_size, expected",
    [(16, 2, [list(range(0, 8)), list(range(8, 16))]), (2, 3, [[0], [1], []]), (5, 2, [[0, 1, 2], [3, 4]])],
)
def test_inference_sampler_shards(size, world_size, expected):
    assert [
        list(InferenceSampler(size, rank=r, world_size=world_size)) for r in range(world_size)
    ] == expected


@pytest.mark.parametrize(
    "finite",
    [
        pytest.param(
            lambda: RandomSampler(range(7), generator=torch.Generator().manual_seed(0)), id="random"
        ),
        pytest.param(
            lambda: WeightedRandomSampler([0.1, 0.9, 0.5], 5, generator=torch.Generator().manual_seed(0)),
            id="weighted",
        ),
        pytest.param(
            lambda: SubsetRandomSampler([2, 4, 6], generator=torch.Generator().manual_seed(0)), id="subset"
        ),
        pytest.param(
            lambda: torch.utils.data.DistributedSampler(range(8), num_replicas=2, rank=1, seed=3),
            id="distributed",
        ),
    ],
)
def test_finite_samplers_become_infinite_streams(finite):
    stream = take(IterationBasedSampler(finite(), rank=0, world_size=1), 40)
    assert len(stream) == 40
    resumed = IterationBasedSampler(finite(), rank=0, world_size=1)
    resumed.load_state_dict({"position": 17})
    assert take(resumed, 23) == stream[17:]


def test_distributed_sampler_epochs_change_via_set_epoch():
    stream = take(
        IterationBasedSampler(
            torch.utils.data.DistributedSampler(range(8), num_replicas=2, rank=0, seed=3),
            rank=0,
            world_size=1,
        ),
        8,
    )
    assert sorted(stream[:4]) == sorted(set(stream[:4])) and stream[:4] != stream[4:]
