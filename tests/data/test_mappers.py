import random

import numpy as np
import pytest
import torch
from PIL import Image

from lazytrain.data.mappers import DatasetMapper, read_image
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge


def iou(a, b):
    a, b = a.bool(), b.bool()
    return (a & b).sum().item() / max((a | b).sum().item(), 1)


@pytest.fixture
def record(tmp_path):
    image = np.zeros((60, 100, 3), np.uint8)
    image[:, :50] = 255
    path = tmp_path / "img.png"
    Image.fromarray(image).save(path)
    from pycocotools import mask as mask_util

    rle_mask = np.zeros((60, 100), np.uint8)
    rle_mask[40:55, 70:90] = 1
    rle = mask_util.encode(np.asfortranarray(rle_mask))
    return {
        "file_name": str(path),
        "height": 60,
        "width": 100,
        "image_id": 5,
        "annotations": [
            {
                "bbox": [10, 10, 30, 20],
                "category_id": 2,
                "iscrowd": 0,
                "segmentation": [[10, 10, 40, 10, 40, 30, 10, 30]],
            },
            {
                "bbox": [70, 40, 20, 15],
                "category_id": 1,
                "iscrowd": 0,
                "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()},
            },
            {"bbox": [0, 0, 5, 5], "category_id": 0, "iscrowd": 1, "segmentation": [[0, 0, 5, 0, 5, 5]]},
        ],
    }


@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_flip_and_resize_keep_boxes_polygons_rle_consistent(record, flip):
    mapper = DatasetMapper(True, [ResizeShortestEdge(90, max_size=1000), RandomFlip(prob=flip)])
    out = mapper(record)
    assert out["image"].shape == (3, 90, 150) and out["image"].dtype == torch.uint8
    assert (out["height"], out["width"], out["image_id"]) == (60, 100, 5)
    instances = out["instances"]
    assert instances["classes"].tolist() == [2, 1]  # the crowd annotation is not an instance
    for box, mask in zip(instances["boxes"], instances["masks"]):
        ys, xs = torch.nonzero(mask, as_tuple=True)
        extent = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
        assert torch.allclose(box, extent, atol=1.6), (box, extent)
        filled = torch.zeros_like(mask)
        x0, y0, x1, y1 = box.round().int().tolist()
        filled[y0:y1, x0:x1] = 1
        assert iou(mask, filled) > 0.9  # both shapes are rectangles
    expected_x0 = 15.0 if flip == 0 else 150 - 60.0
    assert instances["boxes"][0, 0].item() == pytest.approx(expected_x0)
    # the image content flips with the boxes: the white half moves
    assert (out["image"][0, 0, 0] == 255) == (flip == 0)


def test_instances_emptied_by_transform_are_dropped(record):
    record["annotations"][0]["bbox"] = [0, 0, 0.2, 0.2]
    record["annotations"][0]["segmentation"] = [[0, 0, 0.2, 0, 0.2, 0.2, 0, 0.2]]
    out = DatasetMapper(True, [ResizeShortestEdge(30, max_size=1000)])(record)
    assert out["instances"]["classes"].tolist() == [1]


def test_eval_mapper_has_no_instances(record):
    out = DatasetMapper(False, [ResizeShortestEdge(30)])(record)
    assert "instances" not in out and out["image"].shape == (3, 30, 50)


def test_exif_orientation_is_applied(tmp_path):
    image = Image.fromarray(np.zeros((20, 40, 3), np.uint8))
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    image.save(tmp_path / "rot.jpg", exif=exif)
    assert read_image(str(tmp_path / "rot.jpg")).shape == (40, 20, 3)


def test_missing_image_error_names_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        read_image(str(tmp_path / "nope.jpg"))


def test_range_sampling_and_bad_arguments():
    random.seed(0)
    t = ResizeShortestEdge([20, 40], sample_style="range").get_transform(10, 20)
    assert 20 <= t.new_height <= 40
    with pytest.raises(ValueError, match="sample_style"):
        ResizeShortestEdge(20, sample_style="sometimes")
