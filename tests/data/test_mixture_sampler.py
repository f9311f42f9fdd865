"""MixtureTrainingSampler: fixed per-source shares in every batch, uniform or RFS sampling inside a source,
seeding, exact resume, rank shards, argument errors, and a config using it with two registered data sets."""

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


def round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)  # only what weights_only loading accepts
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "ratios, total_batch_size, world_size, shares",
    [
        pytest.param([2, 1, 1], 16, 1, [8, 4, 4], id="2:1:1-of-16"),
        pytest.param([0.5, 0.25, 0.25], 8, 2, [2, 1, 1], id="fractions-two-ranks"),
        pytest.param([0.1, 0.2, 0.7], 10, 1, [1, 2, 7], id="decimal-ratios-as-written"),
        pytest.param([1, 1, 1], 16, 1, [6, 5, 5], id="rounded-largest-remainder"),
        pytest.param([3, 1, 1], 6, 1, [4, 1, 1], id="rounded-3.6-1.2-1.2"),
        pytest.param([1, 1, 2], 6, 1, [2, 1, 3], id="tie-goes-to-the-earlier-source"),
    ],
)
def test_every_batch_holds_the_shares(ratios, total_batch_size, world_size, shares, caplog):
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.mixture_sampler"):
        sampler = mixture(1, 0, world_size, total_batch_size, ratios)
    assert sampler.shares == shares
    assert ("rounded from" in caplog.text) == (ratios in ([1, 1, 1], [3, 1, 1], [1, 1, 2]))
    per_rank = total_batch_size // world_size
    stream = take(sampler, 300 * per_rank)
    expected = [k for k, share in enumerate(shares) for _ in range(share)]
    for step in range(300):
        assert [source_of(i) for i in stream[step * per_rank : (step + 1) * per_rank]] == expected


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


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("stop", [1, 13, 40, 333])
def test_resume_from_state_equals_continuing(world_size, stop):
    for rank in range(world_size):
        sampler = mixture(9, rank, world_size)
        stream = iter(sampler)
        head = [next(stream) for _ in range(stop)]
        state = sampler.state_dict()
        tail = [next(stream) for _ in range(200)]
        assert state["position"] == stop
        resumed = mixture(9, rank, world_size)
        resumed.load_state_dict(round_trip(state))
        assert head + take(resumed, 200) == head + tail
        positional = mixture(9, rank, world_size)
        positional.load_state_dict({"position": stop})
        assert take(positional, 200) == tail


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
        assert ranks[rank].shares == [4, 2, 2]
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
    build(sampler=mixture(total_batch_size=8), total_batch_size=8, aspect_ratio_grouping=False)


def test_check_batching_refuses_a_loader_that_breaks_the_shares():
    sampler = mixture(total_batch_size=8)
    sampler.check_batching(8, aspect_ratio_grouping=False)
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
            r"the ratios 10:1:1 give source 1, source 2 no image of the 4 each rank takes per step "
            r"\(total_batch_size=8, world_size=2\); expected at least one image of every source per rank "
            r"and step. Set total_batch_size to 18 or more",
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
        (dict(ratios=[9, 1], total_batch_size=4), r"give _mixture_val no image of the 4"),
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
