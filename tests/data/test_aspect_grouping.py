"""Aspect-ratio grouping: every batch from landscape or from portrait images, read from the records' sizes."""

import logging

from lazytrain.data.build import build_detection_train_loader
from lazytrain.data.common import DatasetFromList
from lazytrain.data.samplers import TrainingSampler
from tests.data.loader_helpers import make_records, noisy_mapper, take


def test_batches_are_grouped_by_orientation():
    loader = build_detection_train_loader(make_records(), mapper=noisy_mapper, total_batch_size=4, seed=0)
    batches = take(loader, 30)
    assert all(len(batch) == 4 and len({item["landscape"] for item in batch}) == 1 for batch in batches)
    assert {batch[0]["landscape"] for batch in batches} == {True, False}


def test_grouping_reads_sizes_from_a_dataset_from_list():
    loader = build_detection_train_loader(
        DatasetFromList(make_records()), mapper=noisy_mapper, total_batch_size=4, seed=0
    )
    assert all(len({item["landscape"] for item in batch}) == 1 for batch in take(loader, 20))


def test_grouping_without_sizes_warns(caplog):
    records = [{"image_id": i} for i in range(8)]
    with caplog.at_level(logging.WARNING, logger="lazytrain.data.build"):
        loader = build_detection_train_loader(records, mapper=None, total_batch_size=2, seed=0)
    assert "aspect_ratio_grouping needs records with 'width' and 'height'" in caplog.text
    assert [r["image_id"] for b in take(loader, 4) for r in b] == take(TrainingSampler(8, seed=0), 8)
