"""MixtureTrainingSampler in two gloo processes: rank and world size from the live process group, the train
loader's batches, and the shares over the step's batch of both ranks."""

import itertools
import json
import os

import pytest

from lazytrain.data.build import build_detection_train_loader
from lazytrain.data.mixture_sampler import MixtureTrainingSampler, _source_seed
from lazytrain.data.samplers import TrainingSampler
from lazytrain.launch.launch import launch
from lazytrain.utils import comm

SIZES, STEPS = [40, 20], 12


def record_mixture_batches(out_dir: str) -> None:
    """Run in each process: the image ids of this rank's first batches."""
    records = [{"image_id": i} for i in range(sum(SIZES))]
    sampler = MixtureTrainingSampler(SIZES, [2, 1], total_batch_size=4, seed=3)
    loader = build_detection_train_loader(
        records,
        mapper=lambda r: r["image_id"],
        sampler=sampler,
        total_batch_size=4,
        aspect_ratio_grouping=False,
    )
    batches = list(itertools.islice(iter(loader), STEPS))
    with open(os.path.join(out_dir, f"rank{comm.get_rank()}.json"), "w") as f:
        json.dump({"batches": batches, "world_size": comm.get_world_size()}, f)


@pytest.mark.slow
def test_two_processes_take_the_shares_over_their_joint_batch(tmp_path):
    launch(record_mixture_batches, 2, use_gpu=False, args=(str(tmp_path),))
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert [rank["world_size"] for rank in ranks] == [2, 2]
    streams = [
        list(itertools.islice(TrainingSampler(size, seed=_source_seed(3, k), rank=0, world_size=1), 60))
        for k, size in enumerate(SIZES)
    ]
    for step in range(STEPS):
        batch = ranks[0]["batches"][step] + ranks[1]["batches"][step]
        # [2, 1] of 4 is 3:1 over both ranks (per rank it was 1:1, i.e. 2:2): the next 3 and 1 of each source
        assert sorted(i for i in batch if i < 40) == sorted(streams[0][3 * step : 3 * step + 3])
        assert [i - 40 for i in batch if i >= 40] == streams[1][step : step + 1]
        # the rank with two of source 0 alternates
        assert [sum(i < 40 for i in ranks[r]["batches"][step]) for r in (0, 1)] == [[2, 1], [1, 2]][step % 2]
