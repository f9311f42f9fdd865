import json

import pytest
import torch

from lazytrain.data.repeat_factors import repeat_factors_from_category_frequency
from lazytrain.data.samplers import RepeatFactorTrainingSampler
from lazytrain.launch.launch import launch
from tests.data.dist_worker import record_shard


@pytest.mark.slow
def test_two_processes_read_disjoint_positions_of_one_stream(tmp_path):
    launch(record_shard, 2, use_gpu=False, args=(str(tmp_path),))
    shards = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert all(s["world_size"] == 2 for s in shards)
    records = [{"annotations": [{"category_id": i % 4}]} for i in range(40)]
    factors = repeat_factors_from_category_frequency(records, 0.3)
    stream = RepeatFactorTrainingSampler(factors, seed=5, rank=0, world_size=1)
    expected = []
    for index in stream:
        expected.append(index)
        if len(expected) >= 200:
            break
    # each rank batches 2 images per step from its positions r, r+2, ... (one orientation group here)
    assert shards[0]["ids"][:20] == expected[0::2][:20]
    assert shards[1]["ids"][:20] == expected[1::2][:20]
    assert torch.tensor(shards[0]["ids"]).shape == torch.tensor(shards[1]["ids"]).shape
