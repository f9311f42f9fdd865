import io
import json
import pickle
import tracemalloc

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from pytest import param

from lazytrain.evaluation.predictions import (
    DetectionTable,
    encode_masks,
    get_coco_entries,
    pack_instances,
    write_coco_results,
)
from tests.evaluation.reference import reference_entries

CATEGORY_IDS = [3, 8, 40]


def _instances(count, *, height=30, width=40, seed=0, box_dtype=torch.float32, score_dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * torch.tensor([width / 2, height / 2])
    size = 1 + torch.rand(count, 2, generator=generator) * torch.tensor([width / 2, height / 2])
    masks = torch.zeros(count, height, width, dtype=torch.uint8)
    for i, (x, y) in enumerate(corner.int().tolist()):
        masks[i, y : y + 1 + i % 7, x : x + 2 + i % 5] = 1
    return {
        "boxes": torch.cat([corner, corner + size], dim=1).to(box_dtype),
        "scores": torch.rand(count, generator=generator).to(score_dtype),
        "classes": torch.randint(0, len(CATEGORY_IDS), (count,), generator=generator),
        "masks": masks,
    }


@pytest.mark.parametrize(
    ("box_dtype", "score_dtype"),
    [
        param(torch.float32, torch.float32, id="float32"),
        param(torch.float16, torch.bfloat16, id="half-and-bfloat16"),
        param(torch.float64, torch.float64, id="float64"),
    ],
)
def test_entries_are_those_of_one_dict_per_detection(box_dtype, score_dtype):
    instances = _instances(9, box_dtype=box_dtype, score_dtype=score_dtype)
    kept = pack_instances(instances, 17, CATEGORY_IDS)
    expected = reference_entries([{"image_id": 17}], [{"instances": instances}], CATEGORY_IDS)
    assert get_coco_entries(kept) == expected
    # The same floats, not merely close ones: the json text is equal too.
    assert json.dumps(get_coco_entries(kept)) == json.dumps(expected)
    assert kept.boxes.dtype == (np.float64 if box_dtype == torch.float64 else np.float32)


def test_boxes_only_and_no_detections():
    instances = _instances(3)
    del instances["masks"]
    kept = pack_instances(instances, 2, CATEGORY_IDS)
    assert not kept.has_masks and kept.num_detections == 3
    assert [set(entry) for entry in get_coco_entries(kept)] == [
        {"image_id", "category_id", "bbox", "score"}
    ] * 3
    empty = {key: value[:0] for key, value in _instances(3).items()}
    nothing = pack_instances(empty, 5, CATEGORY_IDS)
    assert nothing.has_masks and nothing.num_detections == 0 and get_coco_entries(nothing) == []


def test_table_picks_detections_with_the_fields_a_task_needs():
    first, second = (
        pack_instances(_instances(4, seed=1), 1, CATEGORY_IDS),
        pack_instances(_instances(3), 2, CATEGORY_IDS),
    )
    table = DetectionTable([first, second])
    everything = get_coco_entries(first) + get_coco_entries(second)
    picked = table.get_entries(
        np.array([1, 4, 6]), fields=("image_id", "category_id", "score", "segmentation")
    )
    assert picked == [{k: v for k, v in everything[i].items() if k != "bbox"} for i in (1, 4, 6)]
    assert table.get_entries() == everything
    assert len(table) == 7 and table.image_ids.tolist() == [1, 1, 1, 1, 2, 2, 2]


def test_written_results_are_the_json_of_every_entry():
    images = [
        pack_instances({key: value[:0] for key, value in _instances(2).items()}, 1, CATEGORY_IDS),  # none
        pack_instances(_instances(3, seed=2), 2, CATEGORY_IDS),
        pack_instances({key: value[:0] for key, value in _instances(2).items()}, 3, CATEGORY_IDS),
        pack_instances(_instances(2, seed=3), 4, CATEGORY_IDS),
    ]
    file = io.BytesIO()
    assert write_coco_results(file, images) == 5
    # The same numbers, to the last bit (json reads back the shortest repr that round-trips).
    assert json.loads(file.getvalue()) == [entry for image in images for entry in get_coco_entries(image)]
    empty = io.BytesIO()
    assert write_coco_results(empty, images[:1]) == 0 and empty.getvalue() == b"[]"


def _unpickled_bytes(data: bytes) -> int:
    tracemalloc.start()
    try:
        kept = pickle.loads(data)  # noqa: F841 (alive while measured)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_an_image_takes_little_more_than_its_rles():
    instances = _instances(300, height=480, width=640)
    kept = pack_instances(instances, 1, CATEGORY_IDS)
    rle_bytes = sum(len(counts) for counts in kept.mask_counts)
    as_dicts = reference_entries([{"image_id": 1}], [{"instances": instances}], CATEGORY_IDS)
    # Beyond the RLE text, per detection: pickled 32 bytes (box 16, score 4, category 8, string framing) against
    # 88 for a dict; in memory 88 (mostly the str object around each RLE) against 849 (Python 3.11).
    assert (len(pickle.dumps(kept)) - rle_bytes) / 300 < 40
    assert (len(pickle.dumps(as_dicts)) - rle_bytes) / 300 > 80
    assert (_unpickled_bytes(pickle.dumps(kept)) - rle_bytes) / 300 < 120
    assert (_unpickled_bytes(pickle.dumps(as_dicts)) - rle_bytes) / 300 > 600


def _encoded_by_pycocotools(masks: torch.Tensor) -> list[str]:
    array = np.asfortranarray(masks.numpy().astype(np.uint8).transpose(1, 2, 0))
    return [rle["counts"].decode("ascii") for rle in mask_util.encode(array)]


def _edge_masks(height=7, width=5):
    masks = torch.zeros(10, height, width, dtype=torch.uint8)
    masks[1] = 1  # everything: one run of 1s from the first pixel to the last
    masks[2, :, 1:3] = 1  # two full columns: a run across the column boundary
    masks[3, 4:, 1] = masks[3, :3, 2] = 1  # bottom of a column, then top of the next
    masks[4, -1, -1] = 1  # the last pixel only
    masks[5, 0, 0] = 1  # the first pixel only
    masks[6, 2:5, 1:4] = 1  # a box inside
    masks[6, 3, 2] = 0  # with a hole
    masks[7, :, 0] = masks[7, :, -1] = 1  # first and last columns
    masks[8, 0, :] = masks[8, -1, :] = 1  # first and last rows
    return masks  # masks[0] and [9] are empty


@pytest.mark.parametrize(
    "masks",
    [
        param(_edge_masks(), id="edges"),
        param(
            torch.from_numpy(np.random.default_rng(0).random((300, 9, 6)) < 0.4).to(torch.uint8), id="noise"
        ),
        param(torch.from_numpy(np.random.default_rng(1).random((40, 12, 11)) < 0.9), id="bool"),
        param(_instances(60, height=48, width=64)["masks"], id="boxes"),
        param(_instances(20, height=30, width=40)["masks"].transpose(1, 2), id="not-contiguous"),
    ],
)
def test_masks_are_encoded_as_pycocotools_encodes_them(masks):
    size, counts = encode_masks(masks)
    assert size == tuple(masks.shape[1:])
    assert counts == _encoded_by_pycocotools(masks)


def test_no_masks_encode_to_nothing():
    assert encode_masks(torch.zeros(0, 4, 6, dtype=torch.uint8)) == ((4, 6), [])
