"""LVIS v1 (images from COCO 2017) as in detectron2's LVIS recipes: multi-scale train 640-800 + flip, test 800,
Repeat Factor Sampling t=0.001, LVIS federated evaluation with 300 detections per image.
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
        dataset=L(get_detection_dataset_dicts)(names="lvis_v1_train"),
        mapper=L(DatasetMapper)(
            is_train=True,
            augmentations=[
                L(ResizeShortestEdge)(
                    short_edge_length=[640, 672, 704, 736, 768, 800], max_size=1333, sample_style="choice"
                ),
                L(RandomFlip)(prob=0.5, horizontal=True),
            ],
            image_format="RGB",
            use_instance_mask=True,
        ),
        sampler=L(RepeatFactorTrainingSampler.from_dataset_dicts)(
            dataset_dicts="${..dataset}", repeat_thresh=0.001, sqrt=True, seed="${train.seed}"
        ),
        total_batch_size=16,
        aspect_ratio_grouping=True,
        num_workers=4,
        seed="${train.seed}",
        pin_memory="${train.device}",  # page-locked batches when training on cuda (non-blocking copies)
        max_failure_fraction=0.01,  # share of unreadable images replaced (with a warning) before the run stops
    ),
    test=L(build_detection_test_loader)(
        dataset=L(get_detection_dataset_dicts)(names="lvis_v1_val", filter_empty=False),
        mapper=L(DatasetMapper)(
            is_train=False, augmentations=[L(ResizeShortestEdge)(short_edge_length=800, max_size=1333)]
        ),
        num_workers=4,
        pin_memory="${train.device}",
    ),
    evaluator=L(LVISEvaluator)(
        dataset_name="lvis_v1_val", max_dets_per_image=300, output_dir="${train.output_dir}"
    ),
)
