"""Class image counts come from the catalog metadata or the records, never from the config."""

import pytest

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from lazytrain.data.class_frequency import get_class_image_counts


@pytest.fixture
def registered():
    names = []

    def register(name, records, **metadata):
        loads = []

        def load():
            loads.append(name)
            return records

        DatasetCatalog.register(name, load)
        MetadataCatalog.get(name).set(**metadata)
        names.append(name)
        return loads

    yield register
    for name in names:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def _record(*categories):
    return {"annotations": [{"category_id": c} for c in categories]}


def test_counts_images_not_instances_from_the_records(registered):
    registered(
        "test_freq_records", [_record(0, 0, 2), _record(2), _record(), {}], thing_classes=["a", "b", "c", "d"]
    )
    # Class 0: one image (two instances); class 2: two images; classes 1 and 3 (last) in none.
    assert get_class_image_counts("test_freq_records") == [1, 0, 2, 0]


def test_metadata_counts_win_and_map_json_ids_to_contiguous_ids(registered):
    entries = [{"id": 9, "image_count": 4, "frequency": "r"}, {"id": 3, "image_count": 120, "frequency": "f"}]
    loads = registered(
        "test_freq_metadata",
        [_record(0)],
        class_image_count=entries,
        thing_dataset_id_to_contiguous_id={3: 0, 9: 1},
    )
    assert get_class_image_counts(["test_freq_metadata"]) == [120, 4]
    assert loads == []  # the metadata was there: no loading


def test_loading_fills_the_metadata_of_lvis_style_sets():
    def load():
        MetadataCatalog.get("test_freq_lvis").set(class_image_count=[{"id": 1, "image_count": 7}])
        return [_record(0)]

    DatasetCatalog.register("test_freq_lvis", load)
    try:
        assert get_class_image_counts("test_freq_lvis") == [7]
    finally:
        DatasetCatalog.remove("test_freq_lvis")
        MetadataCatalog.remove("test_freq_lvis")


def test_several_data_sets_are_summed_and_must_share_their_classes(registered):
    registered("test_freq_one", [_record(0), _record(1)], thing_classes=["a", "b"])
    registered("test_freq_two", [_record(1, 0), _record(1)], thing_classes=["a", "b"])
    registered("test_freq_three", [_record(0)], thing_classes=["a", "b", "c"])
    assert get_class_image_counts(["test_freq_one", "test_freq_two"]) == [2, 3]
    with pytest.raises(
        ValueError, match=r"different numbers of classes \{'test_freq_one': 2, 'test_freq_three': 3\}"
    ):
        get_class_image_counts(["test_freq_one", "test_freq_three"])
    with pytest.raises(ValueError, match=r"needs at least one data set name"):
        get_class_image_counts([])


def test_category_ids_beyond_the_classes_are_an_error(registered):
    registered("test_freq_bad", [_record(0, 5)], thing_classes=["a", "b"])
    with pytest.raises(ValueError, match=r"test_freq_bad has category_id 5 but 2 thing_classes"):
        get_class_image_counts("test_freq_bad")
