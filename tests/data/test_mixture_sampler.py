"""MixtureTrainingSampler: fixed per-source shares in every step's global batch, split over the ranks, uniform
or RFS sampling inside a source, seeding, exact resume (another world size too), rank shards, argument errors,
and a config using it with two registered data sets."""

import collections
import functools
import io
import itertools
import logging
import os

import pytest
import torch
from omegaconf import OmegaConf

from lazytrain.config import LazyCall as L
from lazytrain.config import LazyConfig, instantiate, validate
from lazytrain.data.build import build_detection_train_loader, get_detection_dataset_dicts
from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.data.datasets.custom import register_json_dataset
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.data.mixture_sampler import MixtureTrainingSampler, _source_seed
from lazytrain.data.repeat_factors import repeat_factors_from_category_frequency
from lazytrain.data.samplers import RepeatFactorTrainingSampler, TrainingSampler

SIZES = [30, 11, 7]
FACTORS = torch.tensor([1.0, 2.5, 4.0, 1.25, 1.0, 1.0, 1.0])  # source 2's RFS factors


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def mixture(seed=0, rank=0, world_size=1, total_batch_size=16, ratios=(2, 1, 1), **kwargs):
    kwargs.setdefault("repeat_factors", [None, None, FACTORS])
    return MixtureTrainingSampler(
        SIZES, ratios, total_batch_size, seed=seed, rank=rank, world_size=world_size, **kwargs
    )


def source_of(index):
    return 0 if index < 30 else 1 if index < 41 else 2


def global_batches(steps, world_size, sizes=SIZES, **kwargs):
    """Each step's batch over all ranks (rank 0's items, then rank 1's, ...), and the rank samplers."""
    ranks = [
        MixtureTrainingSampler(sizes, rank=rank, world_size=world_size, **kwargs)
        for rank in range(world_size)
    ]
    per_rank = kwargs["total_batch_size"] // world_size
    shards = [take(sampler, steps * per_rank) for sampler in ranks]
    batches = [sum((shard[s * per_rank : (s + 1) * per_rank] for shard in shards), []) for s in range(steps)]
    return batches, ranks


def round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)  # only what weights_only loading accepts
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "ratios, total_batch_size, world_size, shares",
    [
        pytest.param([2, 1, 1], 16, 1, [8, 4, 4], id="2:1:1-of-16"),
        pytest.param([0.5, 0.25, 0.25], 8, 2, [4, 2, 2], id="fractions-two-ranks"),
        pytest.param([0.1, 0.2, 0.7], 10, 1, [1, 2, 7], id="decimal-ratios-as-written"),
        pytest.param([1, 1, 1], 16, 1, [6, 5, 5], id="rounded-largest-remainder"),
        pytest.param([3, 1, 1], 6, 1, [4, 1, 1], id="rounded-3.6-1.2-1.2"),
        pytest.param([1, 1, 2], 6, 1, [2, 1, 3], id="tie-goes-to-the-earlier-source"),
        pytest.param([1, 1, 1], 12, 4, [4, 4, 4], id="per-rank-3-of-3-sources"),
    ],
)
def test_every_batch_holds_the_shares(ratios, total_batch_size, world_size, shares, caplog):
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.mixture_sampler"):
        sampler = mixture(1, 0, world_size, total_batch_size, ratios)
    assert sampler.shares == shares
    assert ("rounded from" in caplog.text) == (
        ratios in ([1, 1, 1], [3, 1, 1], [1, 1, 2]) and world_size == 1
    )
    per_rank = total_batch_size // world_size
    stream = take(sampler, 300 * per_rank)
    expected = [k for k, share in enumerate(shares) for _ in range(share // world_size)]
    for step in range(300):
        assert [source_of(i) for i in stream[step * per_rank : (step + 1) * per_rank]] == expected


@pytest.mark.parametrize(
    "ratios, shares, rank_mixes",
    [
        # 10.67/5.33 rounded to 11/5: 3 ranks take 2 of source 0 and 5 take one of each, the three moving on
        # by one rank per step.
        pytest.param([2, 1], [11, 5], {(2, 0): 3, (1, 1): 5}, id="2:1-is-11/5-not-8/8"),
        # README's [3, 1] at LVIS's 2 images per GPU: per rank it rounded source 1 to no image (an error).
        pytest.param([3, 1], [12, 4], {(2, 0): 4, (1, 1): 4}, id="3:1-at-2-per-rank"),
    ],
)
def test_the_shares_hold_over_the_global_batch_of_eight_ranks(ratios, shares, rank_mixes):
    sizes, steps = [1000, 500], 40
    kwargs = dict(ratios=ratios, total_batch_size=16, seed=21)
    batches, ranks = global_batches(steps, 8, sizes, **kwargs)
    assert all(rank.shares == shares for rank in ranks)
    streams = [
        take(TrainingSampler(size, seed=_source_seed(21, k), rank=0, world_size=1), 1000)
        for k, size in enumerate(sizes)
    ]
    for step, batch in enumerate(batches):
        # the next items of each source's one stream, each taken by one rank
        assert sorted(i for i in batch if i < 1000) == sorted(
            streams[0][step * shares[0] : (step + 1) * shares[0]]
        )
        assert sorted(i - 1000 for i in batch if i >= 1000) == sorted(
            streams[1][step * shares[1] : (step + 1) * shares[1]]
        )
        mixes = [tuple(r.get_rank_shares(step)) for r in ranks]
        assert collections.Counter(mixes) == rank_mixes
        assert [sum(i < 1000 for i in batch[2 * r : 2 * r + 2]) for r in range(8)] == [m[0] for m in mixes]
    # every 8 steps each rank has taken the global mix: 11 (12) of source 0 and 5 (4) of source 1
    for rank in range(8):
        for start in range(0, steps - 8):
            window = [tuple(ranks[rank].get_rank_shares(s)) for s in range(start, start + 8)]
            assert [sum(m[k] for m in window) for k in range(2)] == shares


def test_uniform_source_draws_shuffled_epochs_of_its_own_images():
    stream = take(mixture(2), 16 * 30)
    source_0 = [i for i in stream if source_of(i) == 0]  # 8 per step: 240 = 8 epochs of 30
    epochs = [sorted(source_0[e * 30 : (e + 1) * 30]) for e in range(8)]
    assert all(epoch == list(range(30)) for epoch in epochs)
    assert source_0[:30] != source_0[30:60]
    source_1 = [i for i in stream if source_of(i) == 1]
    assert sorted(source_1[:11]) == list(range(30, 41))


def test_each_source_stream_is_its_own_sampler_with_a_derived_seed():
    stream = take(mixture(3), 16 * 100)
    source_2 = [i - 41 for i in stream if source_of(i) == 2]
    rfs = RepeatFactorTrainingSampler(FACTORS, seed=_source_seed(3, 2), rank=0, world_size=1)
    assert source_2 == take(rfs, len(source_2))
    source_0 = [i for i in stream if source_of(i) == 0]
    assert source_0 == take(TrainingSampler(30, seed=_source_seed(3, 0), rank=0, world_size=1), len(source_0))
    assert len({_source_seed(3, k) for k in range(3)} | {_source_seed(4, k) for k in range(3)}) == 6


def test_rfs_inside_a_source_follows_its_repeat_factors():
    draws = 4000  # source 2 takes 4 of 16 per step
    stream = take(mixture(5), 16 * draws // 4)
    counts = torch.bincount(torch.tensor([i - 41 for i in stream if source_of(i) == 2]), minlength=7)
    # ~457 epochs of 8.75 expected draws: image i appears floor(r_i) or ceil(r_i) times per epoch, a Bernoulli
    # of std <= 0.5, so its count over E epochs has std <= 0.5 sqrt(E) ~ 11 (0.0027 of the draws). The epochs'
    # random lengths (std 0.66 each) move how many epochs 4000 draws cover by ~1.5, i.e. image i's count by
    # ~1.5 r_i <= 6 (0.0015); the partial last epoch adds at most ceil(r_i) = 4 (0.001). 0.015 is over 4
    # combined standard deviations plus that; seeds 0-7 stay within 0.0034.
    assert (counts / draws).tolist() == pytest.approx((FACTORS / FACTORS.sum()).tolist(), abs=0.015)


def test_same_seed_same_stream_other_seed_differs():
    assert take(mixture(7), 500) == take(mixture(7), 500)
    assert take(mixture(7), 500) != take(mixture(8), 500)
    # Where the ranks divide the shares, the streams are those of before the shares held over the global batch
    # (these are 4dfff16's).
    assert take(mixture(31), 12) == [8, 13, 16, 18, 10, 6, 1, 4, 36, 35, 37, 38]
    assert take(mixture(31, 1, 2), 12) == [13, 18, 6, 4, 35, 38, 43, 42, 29, 17, 0, 12]
    assert take(mixture(31, 3, 4, 12, [1, 1, 1]), 12) == [18, 38, 42, 4, 30, 42, 17, 30, 41, 12, 36, 43]


@pytest.mark.parametrize("world_size, ratios", [(1, [2, 1, 1]), (2, [2, 1, 1]), (8, [3, 2, 1])])
@pytest.mark.parametrize("stop", [1, 13, 40, 333])
def test_resume_from_state_equals_continuing(world_size, ratios, stop):
    for rank in range(world_size):
        sampler = mixture(9, rank, world_size, ratios=ratios)
        stream = iter(sampler)
        head = [next(stream) for _ in range(stop)]
        state = sampler.state_dict()
        tail = [next(stream) for _ in range(200)]
        assert state["position"] == stop
        resumed = mixture(9, rank, world_size, ratios=ratios)
        resumed.load_state_dict(round_trip(state))
        assert head + take(resumed, 200) == head + tail
        positional = mixture(9, rank, world_size, ratios=ratios)
        positional.load_state_dict({"position": stop})
        assert take(positional, 200) == tail


def test_a_state_saved_on_eight_ranks_continues_the_global_batches_on_two_or_one(caplog):
    sizes, kwargs = [1000, 500], dict(ratios=[2, 1], total_batch_size=16, seed=23)
    uninterrupted, _ = global_batches(12, 8, sizes, **kwargs)
    states = []
    for rank in range(8):  # stopped after 5 steps, where the train loader saves
        sampler = MixtureTrainingSampler(sizes, rank=rank, world_size=8, **kwargs)
        take(sampler, 5 * 2)
        states.append(round_trip(sampler.state_dict()))
    for state in states[1:]:  # at a step boundary the state is every rank's
        torch.testing.assert_close(state, states[0], rtol=0, atol=0)
    assert states[0]["position"] == 10 and [s["position"] for s in states[0]["sources"]] == [55, 25]
    for world_size in (2, 1):
        ranks = [
            MixtureTrainingSampler(sizes, rank=r, world_size=world_size, **kwargs) for r in range(world_size)
        ]
        for sampler in ranks:
            sampler.load_state_dict(states[0])
        shards = [take(sampler, 7 * 16 // world_size) for sampler in ranks]
        per_rank = 16 // world_size
        resumed = [sum((shard[s * per_rank : (s + 1) * per_rank] for shard in shards), []) for s in range(7)]
        assert [sorted(batch) for batch in resumed] == [sorted(batch) for batch in uninterrupted[5:]]
    # In the middle of a step only the same world size and batch are exact; another restarts the step.
    sampler = MixtureTrainingSampler(sizes, rank=0, world_size=8, **kwargs)
    take(sampler, 5 * 2 + 1)
    one = MixtureTrainingSampler(sizes, rank=0, world_size=1, **kwargs)
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.mixture_sampler"):
        one.load_state_dict(sampler.state_dict())
    assert "that step starts again" in caplog.text
    assert sorted(take(one, 16)) == sorted(uninterrupted[5])


def test_a_state_saved_with_per_rank_shares_resumes_from_its_step():
    # What this sampler saved when shares were per rank (sources sharded per rank): where the shares are the
    # same the stream continues exactly; where they changed, with a warning.
    expected = take(mixture(25, 1, 2), 8 * 30)
    resumed = mixture(0, 1, 2)
    sharded = [{"position": 99, "seed": 1}] * 3
    resumed.load_state_dict({"seed": 25, "position": 8 * 12, "shares": [4, 2, 2], "sources": sharded})
    assert take(resumed, 8 * 18) == expected[8 * 12 :]


def test_a_state_saved_with_per_rank_shares_continues_the_sources_the_old_run_drew(caplog):
    # Rank 0 of 8 before the shares were global: [2, 1] of 16 gave every rank [1, 1] (1:1), and after 10 steps
    # the run had drawn 10 * 8 of each source's global stream. The sources continue there, with the new shares.
    sizes, kwargs = [1000, 1000], dict(ratios=[2, 1], total_batch_size=16, seed=5)
    sharded = [{"position": 10}, {"position": 10}]
    legacy = {"seed": 5, "position": 20, "shares": [1, 1], "sources": sharded}
    ranks = [MixtureTrainingSampler(sizes, rank=r, world_size=8, **kwargs) for r in range(8)]
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.mixture_sampler"):
        for sampler in ranks:
            sampler.load_state_dict(round_trip(legacy))
    assert [source.state_dict()["position"] for source in ranks[0].sources] == [80, 80]
    assert "saved with shares [8, 8] per step (per rank [1, 1] on 8 ranks) into shares [11, 5]" in caplog.text
    step = sorted(sum((take(sampler, 2) for sampler in ranks), []))
    streams = [take(TrainingSampler(1000, seed=_source_seed(5, k), rank=0, world_size=1), 91) for k in (0, 1)]
    assert step == sorted(streams[0][80:91] + [1000 + i for i in streams[1][80:85]])


def test_reshard_state_dict_gives_the_same_step_at_another_world_size_or_none():
    sizes, kwargs = [1000, 1000], dict(ratios=[2, 1], seed=5)
    saved = MixtureTrainingSampler(sizes, total_batch_size=16, rank=3, world_size=8, **kwargs)
    take(saved, 5 * 2)
    two = MixtureTrainingSampler(sizes, total_batch_size=16, rank=1, world_size=2, **kwargs)
    state = two.reshard_state_dict(saved.state_dict(), 8)
    assert (
        state["position"] == 5 * 8
        and state["world_size"] == 2
        and state["sources"] == saved.state_dict()["sources"]
    )
    other_batch = MixtureTrainingSampler(sizes, total_batch_size=8, rank=1, world_size=2, **kwargs)
    assert other_batch.reshard_state_dict(saved.state_dict(), 8) is None
    take(saved, 1)
    assert two.reshard_state_dict(saved.state_dict(), 8) is None  # in the middle of a step
    # Before the shares were global: rank 0 of 8 at step 10 with per-rank shares [1, 1].
    legacy = {"seed": 5, "position": 20, "shares": [1, 1], "sources": [{"position": 10}] * 2}
    state = two.reshard_state_dict(legacy, 8)
    assert state["position"] == 10 * 8 and [source["position"] for source in state["sources"]] == [80, 80]
    assert two.reshard_state_dict({"position": 20}, 8) is None


def test_state_after_resume_matches_an_uninterrupted_run_and_carries_the_seed():
    sampler = mixture(11)
    expected = take(sampler, 300)
    resumed = mixture(12)
    resumed.load_state_dict({"position": 100, "seed": 11})
    assert resumed.seed == 11 and take(resumed, 150) == expected[100:250]
    again = mixture(0)
    again.load_state_dict(resumed.state_dict())
    assert again.state_dict()["position"] == 250 and take(again, 50) == expected[250:]


def test_two_ranks_cover_the_global_batch_with_the_shares_and_no_overlap():
    sizes, total = [1000, 500, 300], 16
    one = MixtureTrainingSampler(sizes, [2, 1, 1], total, seed=13, rank=0, world_size=1)
    ranks = [MixtureTrainingSampler(sizes, [2, 1, 1], total, seed=13, rank=r, world_size=2) for r in range(2)]
    full = take(one, total * 20)
    shards = [take(sampler, total // 2 * 20) for sampler in ranks]
    for rank, shard in enumerate(shards):
        assert ranks[rank].shares == [8, 4, 4] and ranks[rank].get_rank_shares(7) == [4, 2, 2]
        assert shard == full[rank::2]  # rank r takes positions r, r + 2, ... of every source's stream
    for step in range(20):  # all within each source's first epoch: no image twice in a step
        batch = shards[0][step * 8 : (step + 1) * 8] + shards[1][step * 8 : (step + 1) * 8]
        assert len(set(batch)) == 16
        assert [sum(i < 1000 for i in batch), sum(1000 <= i < 1500 for i in batch)] == [8, 4]


def test_the_train_loader_batches_keep_the_shares_and_resume():
    def loader():
        sampler = mixture(15, total_batch_size=4, ratios=[2, 1, 1])
        records = [{"image_id": i} for i in range(sum(SIZES))]
        return build_detection_train_loader(
            records, mapper=None, sampler=sampler, total_batch_size=4, aspect_ratio_grouping=False, seed=15
        )

    first = loader()
    batches = [[r["image_id"] for r in batch] for batch in itertools.islice(iter(first), 30)]
    assert all([source_of(i) for i in batch] == [0, 0, 1, 2] for batch in batches)
    resumed = loader()
    resumed.load_state_dict(round_trip(first.state_dict()))
    assert [[r["image_id"] for r in b] for b in itertools.islice(iter(resumed), 5)] == [
        [r["image_id"] for r in b] for b in itertools.islice(iter(first), 5)
    ]


def test_the_train_loader_refuses_settings_that_break_the_shares():
    records = [{"image_id": i, "width": 2, "height": 1} for i in range(sum(SIZES))]
    build = functools.partial(build_detection_train_loader, records, mapper=None, seed=0)
    with pytest.raises(ValueError, match=r"aspect_ratio_grouping=True would form batches of landscape or"):
        build(sampler=mixture(total_batch_size=8), total_batch_size=8, aspect_ratio_grouping=True)
    with pytest.raises(ValueError, match=r"dataloader.train.total_batch_size=16 but the sampler's shares"):
        build(sampler=mixture(total_batch_size=8), total_batch_size=16, aspect_ratio_grouping=False)
    with pytest.raises(ValueError, match=r"world size is 1 but the sampler was built for world_size=2"):
        build(
            sampler=mixture(world_size=2, total_batch_size=8), total_batch_size=8, aspect_ratio_grouping=False
        )
    build(sampler=mixture(total_batch_size=8), total_batch_size=8, aspect_ratio_grouping=False)


def test_check_batching_refuses_a_loader_that_breaks_the_shares():
    sampler = mixture(total_batch_size=8)
    sampler.check_batching(8, aspect_ratio_grouping=False, world_size=1)
    with pytest.raises(ValueError, match=r"world size is 2 but the sampler was built for world_size=1"):
        sampler.check_batching(8, aspect_ratio_grouping=False, world_size=2)
    with pytest.raises(
        ValueError, match=r"total_batch_size=16 but the sampler's shares are for total_batch_size=8"
    ):
        sampler.check_batching(16, aspect_ratio_grouping=False)
    with pytest.raises(ValueError, match=r"aspect_ratio_grouping=True would form batches .* set dataloader"):
        sampler.check_batching(8, aspect_ratio_grouping=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param(dict(ratios=[1, 1]), r"ratios=\) needs one ratio per source \(3: source 0", id="length"),
        pytest.param(
            dict(ratios=[1, 0, 1]), r"ratios=\) must be finite numbers > 0; got \[1, 0, 1\]", id="zero"
        ),
        pytest.param(dict(ratios=[1, -1, 1]), r"must be finite numbers > 0", id="negative"),
        pytest.param(dict(ratios=[1, float("nan"), 1]), r"must be finite numbers > 0", id="nan"),
        pytest.param(dict(ratios="211"), r"needs one ratio per source", id="string"),
        pytest.param(
            dict(ratios=[10, 1, 1], total_batch_size=8, world_size=2),
            r"the ratios 10:1:1 give source 2 no image of the 8 per step \(total_batch_size=8 over "
            r"world_size=2\); expected at least one image of every source in every step's batch. "
            r"total_batch_size=10 is enough",
            id="share-rounds-to-zero",
        ),
        pytest.param(
            dict(total_batch_size=6, world_size=4),
            r"total_batch_size=\) must be a positive multiple",
            id="batch",
        ),
        pytest.param(
            dict(repeat_factors=[None, None]), r"repeat_factors=\) must hold one entry per", id="factors"
        ),
        pytest.param(
            dict(repeat_factors=[None, None, torch.ones(6)]),
            r"expected lengths \[30, 11, 7\], got \[None, None, 6\]",
            id="factor-length",
        ),
    ],
)
def test_bad_arguments_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mixture(**kwargs)


def test_bad_sizes_and_states_are_value_errors():
    with pytest.raises(ValueError, match=r"sizes=\) must be a non-empty list of positive ints.*got \[3, 0\]"):
        MixtureTrainingSampler([3, 0], [1, 1], 2, seed=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"load_state_dict: the state needs a 'position'"):
        mixture().load_state_dict({})
    with pytest.raises(
        ValueError, match=r"get_rank_shares\(rank=\) must be in \[0, 2\), the sampler's world"
    ):
        mixture(world_size=2, total_batch_size=8).get_rank_shares(0, rank=2)
    with pytest.raises(ValueError, match=r"the state holds 2 sources, this sampler has 3"):
        mixture().load_state_dict({"position": 3, "sources": [{"position": 1}] * 2})


@pytest.fixture
def two_sources(tmp_path):
    """The demo's tiny synthetic set registered as two sources (its 24 train and its 12 val images) with a
    loader that records each load."""
    root = generate_synthetic_lt(
        str(tmp_path / "synthetic"), num_train=24, num_val=12, size_range=(64, 96), val_images_per_category=2
    )
    loads = []
    for split in ("train", "val"):
        name = f"_mixture_{split}"
        json_file = os.path.join(root, f"lvis_v1_{split}.json")
        DatasetCatalog.register(
            name, lambda j=json_file, n=name: loads.append(n) or load_lvis_json(j, root, n)
        )
    yield loads
    for split in ("train", "val"):
        DatasetCatalog.remove(f"_mixture_{split}")


@pytest.fixture
def two_cached_sources(two_sources, tmp_path, monkeypatch):
    """The same two sources registered as a user's json files, read through the annotation cache."""
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(tmp_path / "cache"))
    root = str(tmp_path / "synthetic")
    train_json = os.path.join(root, "lvis_v1_train.json")
    for split in ("train", "val"):
        DatasetCatalog.remove(f"_mixture_{split}")
        json_file = os.path.join(root, f"lvis_v1_{split}.json")
        register_json_dataset(f"_mixture_{split}", json_file, root, train_json_file=train_json)
    yield
    for split in ("train", "val"):
        MetadataCatalog.remove(f"_mixture_{split}")


def test_from_dataset_names_checks_arguments_before_loading(two_sources):
    names = ["_mixture_train", "_mixture_val"]
    for kwargs, message in [
        (dict(ratios=[1]), r"needs one ratio per source \(2: _mixture_train, _mixture_val\)"),
        (dict(ratios=[9, 1], total_batch_size=4), r"give _mixture_val no image of the 4 per step"),
        (dict(repeat_thresh=[0.1]), r"repeat_thresh=\) must be None, a number >= 0.*got \[0.1\]"),
        (dict(repeat_thresh=-1), r"repeat_thresh=\) must be None"),
    ]:
        arguments = dict(ratios=[1, 1], total_batch_size=4, seed=0, rank=0, world_size=1) | kwargs
        with pytest.raises(ValueError, match=message):
            MixtureTrainingSampler.from_dataset_names(names, **arguments)
    assert two_sources == []


@pytest.mark.parametrize("sources", ["two_sources", "two_cached_sources"])
def test_a_config_mixes_two_registered_data_sets(sources, request):
    request.getfixturevalue(sources)
    cfg = OmegaConf.create(
        {
            "train": L(build_detection_train_loader)(
                dataset=L(get_detection_dataset_dicts)(names=["_mixture_train", "_mixture_val"]),
                mapper=None,
                sampler=L(MixtureTrainingSampler.from_dataset_names)(
                    names="${..dataset.names}",
                    ratios=[1, 1],
                    total_batch_size="${..total_batch_size}",
                    repeat_thresh=[0.3, None],
                    seed=5,
                ),
                total_batch_size=4,
                aspect_ratio_grouping=False,
                seed=5,
            )
        }
    )
    LazyConfig.apply_overrides(cfg, ["train.sampler.ratios=[3,1]"])
    validate(cfg)  # the target imports and every argument name exists
    loader = instantiate(cfg.train)
    sampler = loader.batch_sampler.sampler
    assert sampler.sizes == [24, 12] and sampler.shares == [3, 1]
    train_records = get_detection_dataset_dicts("_mixture_train")
    assert isinstance(train_records, CachedRecords) == (sources == "two_cached_sources")
    assert torch.equal(
        sampler.sources[0].repeat_factors, repeat_factors_from_category_frequency(train_records, 0.3)
    )
    assert isinstance(sampler.sources[1], TrainingSampler)
    splits = [
        [r["file_name"].split(os.sep)[-2] for r in batch] for batch in itertools.islice(iter(loader), 12)
    ]
    assert splits == [["train"] * 3 + ["val"]] * 12
