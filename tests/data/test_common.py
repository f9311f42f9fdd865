import logging

import pytest
import torch

from lazytrain.data.common import DatasetFromList, MapDataset


def test_dataset_from_list_round_trips_serialized_records():
    records = [{"file_name": f"{i}.jpg", "annotations": [{"category_id": i % 3}]} for i in range(100)]
    dataset = DatasetFromList(records)
    assert len(dataset) == 100 and dataset[42] == records[42]
    assert dataset[42] is not records[42]


def flaky_mapper(record):
    if record["file_name"].startswith("missing"):
        raise FileNotFoundError(f"image file not found: {record['file_name']}")
    return record["file_name"]


def test_map_dataset_skips_a_missing_image_with_a_warning(caplog):
    records = [{"file_name": "missing0.jpg"}] + [{"file_name": f"ok{i}.jpg"} for i in range(300)]
    dataset = MapDataset(DatasetFromList(records), flaky_mapper)
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.common"):
        result = dataset[0]
    assert result.startswith("ok")
    assert "Skipping missing0.jpg (FileNotFoundError: image file not found: missing0.jpg)" in caplog.text


def test_map_dataset_stops_when_failures_exceed_the_fraction():
    records = [{"file_name": f"missing{i}.jpg"} for i in range(10)] + [{"file_name": "ok.jpg"}]
    dataset = MapDataset(DatasetFromList(records), flaky_mapper, max_failure_fraction=0.01)
    with pytest.raises(RuntimeError, match=r"items failed to map \(more than max_failure_fraction=0.01\)"):
        for index in range(10):
            dataset[index]


def test_seeded_items_map_deterministically():
    import random

    dataset = MapDataset(DatasetFromList([{"file_name": "a"}]), lambda r: random.random())
    assert dataset[(0, 123)] == dataset[(0, 123)] != dataset[(0, 124)]


def _private_dirty_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))


class _TouchAll(torch.utils.data.Dataset):
    """Worker-side probe: read every record of the wrapped dataset, report private memory growth."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return 1

    def __getitem__(self, _):
        before = _private_dirty_kb()
        for index in range(len(self.dataset)):
            self.dataset[index]
        return _private_dirty_kb() - before


def _worker_growth_kb(dataset) -> int:
    loader = torch.utils.data.DataLoader(
        _TouchAll(dataset), num_workers=1, multiprocessing_context="fork", batch_size=None
    )
    return next(iter(loader))


@pytest.mark.slow
def test_serialized_records_are_not_copied_into_workers():
    records = [
        {
            "file_name": f"images/{i:08d}.jpg",
            "image_id": i,
            "height": 480,
            "width": 640,
            "annotations": [{"bbox": [1.0, 2.0, 3.0, 4.0], "category_id": i % 1203}],
        }
        for i in range(100_000)
    ]
    serialized = _worker_growth_kb(DatasetFromList(records, serialize=True))
    plain = _worker_growth_kb(DatasetFromList(records, serialize=False, copy=False))
    # Reading Python objects writes their reference counts, copying their pages into the worker;
    # the serialized buffer is only read.
    assert serialized < 20_000, serialized
    assert plain > 3 * serialized, (plain, serialized)
