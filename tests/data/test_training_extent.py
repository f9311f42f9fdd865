"""`get_training_extent`: the most instances per image and the largest mapped image a train loader gives,
which a model with fixed capacities (``model.fixed_shapes``) checks before its first step."""

from __future__ import annotations

import json
import random

import pytest
from torchvision.transforms import v2

from lazytrain.data.build import build_detection_train_loader
from lazytrain.data.copy_paste import CopyPaste
from lazytrain.data.datasets.cached_records import load_cached_json
from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.training_extent import get_training_extent, largest_output_size
from lazytrain.data.transforms import FixedSizeCrop, RandomFlip, ResizeScale, ResizeShortestEdge


def _annotation(iscrowd: int = 0) -> dict:
    return {"bbox": [1, 2, 5, 6], "category_id": 0, "iscrowd": iscrowd, "segmentation": [[1, 2, 6, 2, 6, 8]]}


def _records() -> list[dict]:
    # b.jpg has the most annotations (5) but 3 are crowd regions, which the mapper leaves out: c.jpg's 3 win.
    return [
        {"file_name": "a.jpg", "image_id": 1, "height": 100, "width": 150, "annotations": [_annotation()]},
        {
            "file_name": "b.jpg",
            "image_id": 2,
            "height": 300,
            "width": 200,
            "annotations": [_annotation(), _annotation(), _annotation(1), _annotation(1), _annotation(1)],
        },
        {"file_name": "c.jpg", "image_id": 3, "height": 80, "width": 80, "annotations": [_annotation()] * 3},
    ]


def _loader(records, augmentations, copy_paste=None):
    mapper = DatasetMapper(is_train=True, augmentations=augmentations, copy_paste=copy_paste)
    return build_detection_train_loader(records, mapper=mapper, total_batch_size=2, seed=0)


def test_the_loader_s_most_instances_and_largest_mapped_size():
    resize = ResizeShortestEdge([160, 192], max_size=256, sample_style="choice")
    extent = get_training_extent(_loader(_records(), [resize, RandomFlip()]))
    # 100 x 150 at short edge 192 would be 288 wide: capped to 171 x 256; 300 x 200 to 256 x 171; 80 x 80 to 192.
    assert extent == (3, "c.jpg", (256, 256))


@pytest.mark.parametrize(
    "augmentation",
    [
        ResizeShortestEdge([160, 176, 192], max_size=256),
        ResizeShortestEdge([100, 500], max_size=10_000, sample_style="range"),
        ResizeScale(0.1, 2.0, 96, 128),
        FixedSizeCrop((64, 64), pad=False),
        FixedSizeCrop((64, 64)),
    ],
)
@pytest.mark.parametrize("height,width", [(100, 150), (300, 200), (37, 37)])
def test_the_largest_size_is_the_largest_any_draw_makes(augmentation, height, width, monkeypatch):
    # Every draw of the augmentation's random choices at their extremes: the largest output is the bound.
    drawn = []
    for extreme in (min, max):
        monkeypatch.setattr(random, "choice", lambda values, pick=extreme: pick(values))
        monkeypatch.setattr(random, "randint", lambda low, high, pick=extreme: pick(low, high))
        monkeypatch.setattr(random, "uniform", lambda low, high, pick=extreme: pick(low, high))
        transform = augmentation.get_transform(height, width)
        drawn.append(transform.output_size() if transform is not None else (height, width))
    largest = (max(h for h, _ in drawn), max(w for _, w in drawn))
    assert largest_output_size([augmentation], height, width) == largest


def test_copy_paste_adds_its_max_objects_and_torchvision_transforms_leave_the_size_unknown():
    copy_paste = CopyPaste(mode="uniform", max_objects=4)
    most, fullest, size = get_training_extent(_loader(_records(), [v2.RandomResize(100, 300)], copy_paste))
    assert (most, size) == (3 + 4, None)
    assert "c.jpg" in fullest and "max_objects=4" in fullest
    assert get_training_extent(_loader(_records(), [], CopyPaste(mode="none")))[:1] == (3,)


def test_cached_records_are_counted_from_their_arrays_without_crowd(tmp_path, cache_dir):
    images, annotations = [], []
    for image_id, record in enumerate(_records(), start=1):
        images.append(
            {
                "id": image_id,
                "file_name": record["file_name"],
                "height": record["height"],
                "width": record["width"],
            }
        )
        for index, annotation in enumerate(record["annotations"]):
            annotations.append(
                {
                    **annotation,
                    "id": 100 * image_id + index,
                    "image_id": image_id,
                    "category_id": 7,
                    "area": 30.0,
                }
            )
    path = tmp_path / "train.json"
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": [{"id": 7, "name": "cat"}]})
    )
    records = load_cached_json(str(path), "/images", lvis=False)
    assert type(records).__name__ == "CachedRecords"
    extent = get_training_extent(_loader(records, [ResizeShortestEdge([192], max_size=256)]))
    assert extent == (3, "/images/c.jpg", (256, 256))


def test_a_loader_of_other_items_gives_nothing_to_check():
    class Loader:  # e.g. a torch DataLoader over tensors
        dataset = range(5)

    assert get_training_extent(Loader()) == (None, "", None)
