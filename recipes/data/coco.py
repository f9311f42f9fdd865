"""COCO 2017 instances as in detectron2's 1x recipe: multi-scale train 640-800 + flip, test 800, uniform
sampling, COCO evaluation with 100 detections per image.
"""

from lazytrain.config import LazyCall as L
from lazytrain.data.build import (
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge
from lazytrain.evaluation import COCOEvaluator

dataloader = dict(
    train=L(build_detection_train_loader)(
        dataset=L(get_detection_dataset_dicts)(names="coco_2017_train"),
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
        sampler=None,  # a shuffled TrainingSampler over the data set, seeded with `seed`
        total_batch_size=16,
        aspect_ratio_grouping=True,
        num_workers=4,
        seed="${train.seed}",
        pin_memory="${train.device}",  # page-locked batches when training on cuda (non-blocking copies)
        max_failure_fraction=0.01,  # share of unreadable images replaced (with a warning) before the run stops
    ),
    test=L(build_detection_test_loader)(
        dataset=L(get_detection_dataset_dicts)(names="coco_2017_val", filter_empty=False),
        mapper=L(DatasetMapper)(
            is_train=False, augmentations=[L(ResizeShortestEdge)(short_edge_length=800, max_size=1333)]
        ),
        num_workers=4,
        pin_memory="${train.device}",
    ),
    evaluator=L(COCOEvaluator)(
        dataset_name="coco_2017_val", max_dets_per_image=100, output_dir="${train.output_dir}"
    ),
)
