"""The mapper tests' record (a small image with a polygon, an RLE ring and a crowd region) and the annotation cache
tests' own cache folders."""

import numpy as np
import pytest
from PIL import Image

from lazytrain.data.datasets import annotation_cache
from tests.data.mapper_helpers import POLYGON, rle_of


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh annotation cache folder (`LAZYTRAIN_CACHE`) and node-local fallback root instead of /dev/shm."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(folder))
    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(annotation_cache, "_NODE_LOCAL_ROOT", str(tmp_path / "shm"))
    return folder


@pytest.fixture
def record(tmp_path):
    """A 60x100 image, left half white, with a polygon (polygon), a ring-shaped RLE mask and a crowd region."""
    pixels = np.zeros((60, 100, 3), np.uint8)
    pixels[:, :50] = 255
    path = tmp_path / "img.png"
    Image.fromarray(pixels).save(path)
    ring = np.zeros((60, 100), np.uint8)
    ring[35:55, 62:92] = 1
    ring[40:50, 70:84] = 0
    return {
        "file_name": str(path),
        "height": 60,
        "width": 100,
        "image_id": 5,
        "annotations": [
            {
                "bbox": [10, 8, 35, 32],
                "bbox_mode": "XYWH_ABS",
                "category_id": 2,
                "iscrowd": 0,
                "segmentation": [POLYGON],
            },
            {
                "bbox": [62, 35, 30, 20],
                "bbox_mode": "XYWH_ABS",
                "category_id": 1,
                "iscrowd": 0,
                "segmentation": rle_of(ring),
            },
            {
                "bbox": [0, 0, 5, 5],
                "bbox_mode": "XYWH_ABS",
                "category_id": 0,
                "iscrowd": 1,
                "segmentation": [[0, 0, 5, 0, 5, 5]],
            },
        ],
    }
