"""Run in each of 2 gloo processes: the image ids this rank's train loader yields."""

import json
import os

from lazytrain.data.build import build_detection_train_loader
from lazytrain.data.samplers import RepeatFactorTrainingSampler
from lazytrain.utils import comm


def record_shard(out_dir: str) -> None:
    records = [
        {"image_id": i, "width": 10, "height": 10, "annotations": [{"category_id": i % 4}]} for i in range(40)
    ]
    sampler = RepeatFactorTrainingSampler.from_dataset_dicts(records, 0.3, seed=5)
    loader = build_detection_train_loader(
        records, mapper=lambda r: r["image_id"], sampler=sampler, total_batch_size=4
    )
    ids = []
    for batch in loader:
        ids.extend(batch)
        if len(ids) >= 20:
            break
    with open(os.path.join(out_dir, f"rank{comm.get_rank()}.json"), "w") as f:
        json.dump({"ids": ids, "world_size": comm.get_world_size()}, f)
