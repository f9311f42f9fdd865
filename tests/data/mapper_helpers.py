"""Shared pieces of the mapper tests: a polygon, mask comparisons."""

import numpy as np
import torch
from pycocotools import mask as mask_util

POLYGON = [10.0, 20.0, 25.0, 8.0, 40.0, 10.0, 45.0, 25.0, 35.0, 40.0, 15.0, 36.0]  # bbox [10, 8, 35, 32]


def iou(a, b):
    a, b = a.bool(), b.bool()
    return (a & b).sum().item() / max((a | b).sum().item(), 1)


def extent(mask):
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)


def rle_of(mask):
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode()}
