"""The embedded long-tailed data set (generated on first use): loaders, mapper, RFS sampler, LVIS evaluator.

Images are 192 px squares; training keeps that size and flips, testing keeps it too (the generator's
``CLUTTERED_STYLE`` makes 128-320 px images: resize with e.g. ``short_edge_length=[160,176,192]``).
The sampler is Repeat Factor Sampling; ``dataloader.train.sampler.repeat_thresh=0`` gives uniform sampling.
"""

from lazytrain.config import LazyCall as L
from lazytrain.data.build import (
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.samplers import RepeatFactorTrainingSampler
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge
from lazytrain.evaluation import LVISEvaluator

dataloader = dict(
    train=L(build_detection_train_loader)(
        dataset=L(get_detection_dataset_dicts)(names="synthetic_lt_train"),
        mapper=L(DatasetMapper)(
            is_train=True,
            augmentations=[
                L(ResizeShortestEdge)(short_edge_length=[192], max_size=256, sample_style="choice"),
                L(RandomFlip)(prob=0.5, horizontal=True),
            ],
            image_format="RGB",
            use_instance_mask=True,
        ),
        # Factors come from the very records the loader uses (the interpolation is built once).
        sampler=L(RepeatFactorTrainingSampler.from_dataset_dicts)(
            dataset_dicts="${..dataset}", repeat_thresh=0.1, sqrt=True, seed="${train.seed}"
        ),
        total_batch_size=4,
        aspect_ratio_grouping=True,
        num_workers=1,
        seed="${train.seed}",
        pin_memory="${train.device}",  # page-locked batches when training on cuda (non-blocking copies)
        max_failure_fraction=0.01,  # share of unreadable images replaced (with a warning) before the run stops
    ),
    test=L(build_detection_test_loader)(
        dataset=L(get_detection_dataset_dicts)(names="synthetic_lt_val", filter_empty=False),
        mapper=L(DatasetMapper)(
            is_train=False, augmentations=[L(ResizeShortestEdge)(short_edge_length=192, max_size=256)]
        ),
        # Every image is 192 x 192, so batches need no padding and give the same detections as batch 1, in
        # less time. With images of mixed sizes (CLUTTERED_STYLE) use 1.
        batch_size=4,
        num_workers=1,
        pin_memory="${train.device}",
    ),
    evaluator=L(LVISEvaluator)(dataset_name="synthetic_lt_val", output_dir="${train.output_dir}"),
)
