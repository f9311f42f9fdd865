"""Importable targets for config tests (configs store targets as dotted paths)."""

import dataclasses
from collections import Counter

CALLS: Counter = Counter()


def make_dataset(size: int = 3) -> list[int]:
    CALLS["make_dataset"] += 1
    return list(range(size))


class Sampler:
    def __init__(self, dataset_dicts, repeat_thresh: float = 0.0, seed: int = 0):
        CALLS["Sampler"] += 1
        self.dataset_dicts = dataset_dicts
        self.repeat_thresh = repeat_thresh
        self.seed = seed


class Loader:
    def __init__(self, dataset, sampler, batch_size: int = 2):
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = batch_size


@dataclasses.dataclass
class Point:
    x: int = 0
    y: int = 0


def add(a, b=0, *, scale=1):
    return (a + b) * scale


def make_adder(offset):
    def adder(value):
        return value + offset

    return adder


def failing(value):
    raise RuntimeError(f"boom {value}")


def record(**kwargs):
    return kwargs


class Registry:
    @classmethod
    def from_size(cls, size: int):
        obj = cls()
        obj.size = size
        return obj


def replaced():
    return 1


REPLACED_BEFORE = replaced


def replaced():  # noqa: F811 (the first function's dotted path now names this one)
    return 2
