"""Helpers of the loader tests: small records, mappers that draw from the global RNGs or make tensors, and
comparisons of batches."""

import io
import itertools
import random

import numpy as np
import torch

from lazytrain.data.build import build_detection_train_loader

CALLS = {"make_records": 0}


def make_records(n=40):
    CALLS["make_records"] += 1
    rng = random.Random(0)
    return [
        {
            "file_name": f"{i}.jpg",
            "image_id": i,
            "width": rng.choice([60, 100]),
            "height": rng.choice([60, 100]) + 1,
            "annotations": [{"category_id": 0 if i % 7 else 1 + i % 3}],
        }
        for i in range(n)
    ]


def noisy_mapper(record):
    # draws from the global RNGs like random augmentations do
    return {
        "image_id": record["image_id"],
        "landscape": record["width"] > record["height"],
        "noise": (random.random(), float(np.random.rand()), torch.rand(1).item()),
    }


class NoisyMapper:
    def __call__(self, record):
        return noisy_mapper(record)


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def build(num_workers, records=None, **kwargs):
    kwargs.setdefault("total_batch_size", 4)
    return build_detection_train_loader(
        records or make_records(), mapper=noisy_mapper, seed=3, num_workers=num_workers, **kwargs
    )


def round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def tensor_mapper(record):
    generator = torch.Generator().manual_seed(record["image_id"])
    image = torch.randint(
        0, 255, (3, record["height"], record["width"]), dtype=torch.uint8, generator=generator
    )
    return {
        "image": image,
        "instances": {
            "boxes": torch.rand(2, 4, generator=generator),
            "classes": torch.tensor([record["image_id"], 1]),
            "masks": image[:2] > 128,  # bool
            "empty": torch.zeros(0, 4, dtype=torch.float64),
        },
        "transposed": (torch.arange(6.0).view(2, 3).t(), "text", 7),  # not contiguous
        "image_id": record["image_id"],
    }


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys() and all(assert_same(a[k], b[k]) is None for k in a)
    elif isinstance(a, (list, tuple)):
        assert (
            type(a) is type(b) and len(a) == len(b) and all(assert_same(x, y) is None for x, y in zip(a, b))
        )
    else:
        assert a == b
