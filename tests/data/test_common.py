import logging
import random

import numpy as np
import pytest
import torch

from lazytrain.data.common import DatasetFromList, MapDataset
from lazytrain.errors import LazytrainError
from lazytrain.utils.preemption import EvaluationStopped


@pytest.mark.parametrize("serialize", [True, False], ids=["serialized", "list"])
def test_dataset_from_list_round_trips_records(serialize):
    records = [{"file_name": f"{i}.jpg", "annotations": [{"category_id": i % 3}]} for i in range(100)]
    dataset = DatasetFromList(records, serialize=serialize)
    assert len(dataset) == 100 and dataset[42] == records[42] and dataset[99] == records[99]
    dataset[42]["file_name"] = "changed"  # mappers may modify what they get
    assert dataset[42] is not records[42] and dataset[42]["file_name"] == "42.jpg"


def test_serialized_records_live_in_one_buffer():
    dataset = DatasetFromList([{"i": i} for i in range(1000)])
    assert dataset._buffer.dtype == np.uint8 and dataset._offsets.dtype == np.int64
    assert len(dataset._offsets) == 1001 and dataset._offsets[-1] == dataset._buffer.nbytes


def test_empty_list():
    assert len(DatasetFromList([])) == 0


def flaky_mapper(record):
    if record["file_name"].startswith("missing"):
        raise FileNotFoundError(f"image file not found: {record['file_name']}")
    return record["file_name"]


def test_map_dataset_skips_a_missing_image_with_a_warning(caplog):
    records = [{"file_name": "missing0.jpg"}] + [{"file_name": f"ok{i}.jpg"} for i in range(300)]
    dataset = MapDataset(DatasetFromList(records), flaky_mapper)
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.common"):
        result = dataset[0]
    assert result.startswith("ok") and result == dataset[0]  # the same replacement every time
    assert "Skipping missing0.jpg (FileNotFoundError: image file not found: missing0.jpg)" in caplog.text


def test_map_dataset_treats_none_as_a_failure(caplog):
    records = [{"file_name": f"{i}.jpg"} for i in range(200)]
    dataset = MapDataset(DatasetFromList(records), lambda r: None if r["file_name"] == "3.jpg" else r)
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.common"):
        assert dataset[3]["file_name"] != "3.jpg"
    assert "Skipping 3.jpg (the mapper returned None)" in caplog.text


def test_map_dataset_stops_when_failures_exceed_the_fraction():
    records = [{"file_name": f"missing{i}.jpg"} for i in range(3)] + [{"file_name": "ok.jpg"}] * 97
    dataset = MapDataset(DatasetFromList(records), flaky_mapper, max_failure_fraction=0.02)
    dataset[0], dataset[1]  # 2 of 100 may fail
    with pytest.raises(
        LazytrainError,
        match=r"3 of 100 items failed to map, more than max_failure_fraction=0.02; the last was missing2.jpg "
        r"\(FileNotFoundError.*raise MapDataset\(max_failure_fraction=\)\.",
    ):
        dataset[2]


def test_map_dataset_with_zero_fraction_raises_on_the_first_failure():
    dataset = MapDataset(
        DatasetFromList([{"file_name": "missing.jpg"}, {"file_name": "ok"}]), flaky_mapper, 0.0
    )
    with pytest.raises(LazytrainError, match="missing.jpg"):
        dataset[0]


def test_map_dataset_names_the_setting_to_raise_or_none():
    """The error's advice names where a user sets the fraction (failed before: 'raise max_failure_fraction',
    which no config key was)."""
    records = [{"file_name": "missing.jpg"}, {"file_name": "ok"}]
    keyed = MapDataset(DatasetFromList(records), flaky_mapper, 0.0, fraction_setting="loader.max_failures")
    with pytest.raises(
        LazytrainError, match=r"missing or corrupt images\), or raise loader\.max_failures\.$"
    ):
        keyed[0]
    evaluation = MapDataset(DatasetFromList(records), flaky_mapper, 0.0, fraction_setting=None)
    with pytest.raises(LazytrainError, match=r"Check the data set files \(missing or corrupt images\)\.$"):
        evaluation[0]


def draw_everywhere(record):
    return (random.random(), float(np.random.rand()), torch.rand(1).item())


def test_a_stop_signal_while_mapping_abandons_the_evaluation_instead_of_skipping_the_image():
    """A SIGTERM handled while the main process maps an image (no loader workers) raises EvaluationStopped
    there: it must reach the evaluation, not be counted as a bad image."""

    def mapper(record):
        raise EvaluationStopped(15)

    dataset = MapDataset(DatasetFromList([{"file_name": "a.jpg"}, {"file_name": "b.jpg"}]), mapper)
    with pytest.raises(EvaluationStopped):
        dataset[0]
    assert not dataset._failed


def test_seeded_items_map_deterministically_and_keep_the_callers_rngs():
    dataset = MapDataset(DatasetFromList([{"file_name": "a"}]), draw_everywhere)
    random.seed(0)
    torch.manual_seed(0)
    before = random.random(), torch.rand(1).item()
    random.seed(0)
    torch.manual_seed(0)
    assert dataset[(0, 123)] == dataset[(0, 123)] != dataset[(0, 124)]
    assert (random.random(), torch.rand(1).item()) == before  # main process: global RNGs restored


def _private_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))


class _TouchAll(torch.utils.data.Dataset):
    """Worker-side probe: read every record of the wrapped dataset, report private memory growth (KiB)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return 1

    def __getitem__(self, _):
        before = _private_kb()
        for index in range(len(self.dataset)):
            self.dataset[index]
        return _private_kb() - before


def _worker_growth_kb(dataset) -> int:
    loader = torch.utils.data.DataLoader(
        _TouchAll(dataset), num_workers=1, multiprocessing_context="fork", batch_size=None
    )
    return next(iter(loader))


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
    # Reading Python objects writes their reference counts, which copies their pages into the worker (~50 MB
    # here); the serialized buffer is only read.
    assert serialized < 8_000, serialized
    assert plain > 3 * serialized and plain > 20_000, (plain, serialized)
