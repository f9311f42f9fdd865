"""The straightforward per-image loop reference of (instance-aware) Repeat Factor Sampling, and records with a
long tail of categories to compare against it."""

import collections
import math
import random

import torch


def loop_repeat_factors(dataset_dicts, repeat_thresh, sqrt=True, instance_aware=False):
    image_count, instance_count = collections.Counter(), collections.Counter()
    for record in dataset_dicts:
        categories = [a["category_id"] for a in record.get("annotations", [])]
        image_count.update(set(categories))
        instance_count.update(categories)
    total_instances = sum(instance_count.values())
    category_factor = {}
    for category, count in image_count.items():
        frequency = count / len(dataset_dicts)
        if instance_aware:
            frequency = math.sqrt(frequency * (instance_count[category] / total_instances))
        ratio = repeat_thresh / frequency
        category_factor[category] = max(1.0, math.sqrt(ratio) if sqrt else ratio)
    factors = []
    for record in dataset_dicts:
        categories = {a["category_id"] for a in record.get("annotations", [])}
        factors.append(max((category_factor[c] for c in categories), default=1.0))
    return torch.tensor(factors, dtype=torch.float32)


def loop_stream(repeat_factors, seed, num_epochs):
    generator = torch.Generator()
    generator.manual_seed(seed)
    int_part = torch.trunc(repeat_factors)
    frac_part = repeat_factors - int_part
    stream = []
    for _ in range(num_epochs):
        rands = torch.rand(len(repeat_factors), generator=generator)
        counts = int_part + (rands < frac_part).float()
        indices = []
        for image, count in enumerate(counts.tolist()):
            indices.extend([image] * int(count))
        order = torch.randperm(len(indices), generator=generator)
        stream.extend(indices[i] for i in order.tolist())
    return stream


def make_dicts(num_images, num_categories=20, seed=0):
    rng = random.Random(seed)
    records = []
    for i in range(num_images):
        count = rng.choice([0, 1, 1, 2, 3, 5])
        # power-law category popularity, repeated categories within an image
        categories = [min(int(rng.paretovariate(1.0)) - 1, num_categories - 1) for _ in range(count)]
        records.append({"image_id": i, "annotations": [{"category_id": c} for c in categories]})
    return records


RECORDS = make_dicts(300)
