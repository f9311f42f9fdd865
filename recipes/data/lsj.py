"""Large-scale jitter (LSJ): the train augmentation of detectron2's new baselines and ViTDet's LVIS recipes.

Each image is resized to a random 0.1-2.0 x of a square target (aspect ratio kept), flipped, and cut to the
target where larger; smaller images are padded by the batch. Boxes are recomputed from the masks, so a cut
instance's box fits what stays visible. Use it in a config that has train and test mappers:

    from ..recipes.data.lsj import use_lsj

    use_lsj(dataloader, 1024, total_batch_size=64)

or, for the train augmentations alone, ``dataloader.train.mapper.augmentations = lsj_augmentations(1024)``
with ``recompute_boxes = True`` and ``aspect_ratio_grouping = False`` (every image is at most 1024 x 1024).

Every training image is at most `image_size` square, so ``model.pad_to_sizes=[[1024,1024]]`` gives training one
input shape, what ``train.compile.enabled=true`` (a compiled backbone, CUDA graphs with its reduce-overhead mode)
needs.

Long LSJ schedules (100 epochs and more) are what make it pay; on a 1x schedule multi-scale resizing is the
usual choice.
"""

from typing import Any

from lazytrain.config import LazyCall as L
from lazytrain.data.transforms import FixedSizeCrop, RandomFlip, ResizeScale


def lsj_augmentations(image_size: int = 1024, min_scale: float = 0.1, max_scale: float = 2.0) -> list:
    """The LSJ list for ``dataloader.train.mapper.augmentations`` (LazyCalls, so keys stay overridable)."""
    return [
        L(RandomFlip)(prob=0.5, horizontal=True),
        L(ResizeScale)(
            min_scale=min_scale, max_scale=max_scale, target_height=image_size, target_width=image_size
        ),
        L(FixedSizeCrop)(crop_size=(image_size, image_size), pad=False),
    ]


def use_lsj(dataloader: Any, image_size: int = 1024, *, total_batch_size: int = 64) -> None:
    """Set a config's `dataloader` to LSJ training at `image_size` (boxes recomputed from the masks, no aspect
    ratio grouping), the batch, and a test-time resize of the longer side to `image_size`."""
    dataloader.train.mapper.augmentations = lsj_augmentations(image_size)
    dataloader.train.mapper.recompute_boxes = True
    dataloader.train.aspect_ratio_grouping = False
    dataloader.train.total_batch_size = total_batch_size
    dataloader.test.mapper.augmentations[0].short_edge_length = image_size
    dataloader.test.mapper.augmentations[0].max_size = image_size
