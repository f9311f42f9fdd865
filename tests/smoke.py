"""Overrides that shrink a detection recipe to a smoke run: two iterations of two small images, no workers."""

from __future__ import annotations


def smoke_overrides(short_edge: int = 96, max_size: int = 128) -> list[str]:
    """Hydra overrides for any recipe whose train and test mappers start with a `ResizeShortestEdge`."""
    return [
        "train.max_iter=2",
        "train.log_period=1",
        "dataloader.train.total_batch_size=2",
        "dataloader.train.num_workers=0",
        "dataloader.test.num_workers=0",
        f"dataloader.train.mapper.augmentations.0.short_edge_length=[{short_edge}]",
        f"dataloader.train.mapper.augmentations.0.max_size={max_size}",
        f"dataloader.test.mapper.augmentations.0.short_edge_length={short_edge}",
        f"dataloader.test.mapper.augmentations.0.max_size={max_size}",
    ]


def lsj_smoke_overrides(size: int = 96) -> list[str]:
    """`smoke_overrides` for a recipe whose train mapper has recipes/data/lsj.py's `lsj_augmentations` (flip,
    `ResizeScale`, `FixedSizeCrop`) and whose test mapper starts with a `ResizeShortestEdge`."""
    lsj = [
        f"dataloader.train.mapper.augmentations.1.target_height={size}",
        f"dataloader.train.mapper.augmentations.1.target_width={size}",
        f"dataloader.train.mapper.augmentations.2.crop_size=[{size},{size}]",
    ]
    return [o for o in smoke_overrides(size, size) if not o.startswith("dataloader.train.mapper.")] + lsj


# An untrained R50 mask head on 300 detections per image makes inference slow.
FEW_DETECTIONS = "model.roi_heads.detections_per_img=20"


# A tiny stand-in of the embedded data set for smoke runs: `generate_synthetic_lt(root, **TINY_SYNTHETIC_LT)`.
TINY_SYNTHETIC_LT = {"num_train": 12, "num_val": 6, "size_range": (64, 96), "val_images_per_category": 1}

# The R50 recipes test on 1000 proposals per image: on the CPU their box head makes inference most of a smoke
# run; 100 run the same code.
FEW_PROPOSALS = ["model.rpn.pre_nms_top_n.testing=100", "model.rpn.post_nms_top_n.testing=100"]
