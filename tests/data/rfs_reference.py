"""The straightforward per-image loop reference of Repeat Factor Sampling (for bit-equality checks)."""

import math

import torch


def reference_repeat_factors(dataset_dicts, repeat_thresh, sqrt=True):
    image_count = {}
    for record in dataset_dicts:
        for category in {a["category_id"] for a in record["annotations"]}:
            image_count[category] = image_count.get(category, 0) + 1
    num_images = len(dataset_dicts)
    category_factor = {}
    for category, count in image_count.items():
        ratio = repeat_thresh / (count / num_images)
        category_factor[category] = max(1.0, math.sqrt(ratio) if sqrt else ratio)
    factors = []
    for record in dataset_dicts:
        categories = {a["category_id"] for a in record["annotations"]}
        factors.append(max((category_factor[c] for c in categories), default=1.0))
    return torch.tensor(factors, dtype=torch.float32)


def reference_stream(repeat_factors, seed, num_epochs):
    generator = torch.Generator()
    generator.manual_seed(seed)
    int_part = torch.trunc(repeat_factors)
    frac_part = repeat_factors - int_part
    stream = []
    for _ in range(num_epochs):
        rands = torch.rand(len(frac_part), generator=generator)
        counts = int_part + (rands < frac_part).float()
        indices = []
        for index, count in enumerate(counts):
            indices.extend([index] * int(count.item()))
        indices = torch.tensor(indices, dtype=torch.int64)
        stream.extend(indices[torch.randperm(len(indices), generator=generator)].tolist())
    return stream
