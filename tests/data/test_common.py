import logging

import pytest

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
