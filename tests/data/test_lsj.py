"""Large-scale jitter: ResizeScale, FixedSizeCrop and the crop/pad transforms, through the DatasetMapper."""

import os
import random

import numpy as np
import pytest
import torch

from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.transforms import (
    Augmentation,
    CropTransform,
    FixedSizeCrop,
    PadTransform,
    ResizeScale,
    ResizeShortestEdge,
    ResizeTransform,
    TransformList,
)
from tests.data.mapper_helpers import extent, iou

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Fixed(Augmentation):
    """Always the same transform, so a test knows the geometry."""

    def __init__(self, make):
        self.make = make

    def get_transform(self, height, width):
        return self.make(height, width)


def reference_masks(record, steps):
    """Rasterize at the original size, then resize (nearest), crop and pad the bitmaps by hand."""
    masks = DatasetMapper(True, [], rasterize_first=True)(record)["instances"]["masks"]
    (new_h, new_w), (x0, y0, crop_h, crop_w), (pad_bottom, pad_right) = steps
    masks = torch.nn.functional.interpolate(masks[None].float(), size=(new_h, new_w), mode="nearest-exact")[0]
    masks = masks[:, y0 : y0 + crop_h, x0 : x0 + crop_w]
    return torch.nn.functional.pad(masks, (0, pad_right, 0, pad_bottom)).to(torch.uint8)


@pytest.mark.parametrize("rasterize_first", [False, True], ids=["polygons", "bitmaps"])
def test_resize_crop_pad_move_image_boxes_and_masks_together(record, rasterize_first):
    # 60x100 -> 120x200, keep x 30..180, y 10..90 (150 x 80), pad to 100 x 160
    steps = ((120, 200), (30, 10, 80, 150), (20, 10))

    def make(height, width):
        return TransformList(
            [
                ResizeTransform(height, width, 120, 200),
                CropTransform(120, 200, x0=30, y0=10, crop_height=80, crop_width=150),
                PadTransform(80, 150, pad_bottom=20, pad_right=10, value=128),
            ]
        )

    out = DatasetMapper(True, [Fixed(make)], rasterize_first=rasterize_first, recompute_boxes=True)(record)
    image, instances = out["image"], out["instances"]
    assert image.shape == (3, 100, 160)
    assert (image[:, 80:, :] == 128).all() and (image[:, :, 150:] == 128).all()  # the padding
    assert (image[:, :80, :20] == 255).all() and (image[:, :80, 75:150] == 0).all()  # white left half, moved
    assert instances["classes"].tolist() == [2, 1]
    assert instances["masks"].shape == (2, 100, 160)
    assert not instances["masks"][:, 80:, :].any() and not instances["masks"][:, :, 150:].any()
    for box, mask, reference in zip(instances["boxes"], instances["masks"], reference_masks(record, steps)):
        assert iou(mask, reference) > 0.9
        assert torch.equal(box, extent(mask))
    # the polygon's box [10, 8, 45, 40] scaled by 2 and shifted by (30, 10), cut at the window's left edge
    assert instances["boxes"][0].tolist() == pytest.approx([0, 6, 60, 70], abs=1.0)


def test_fixed_size_crop_drops_what_falls_outside_and_keeps_the_rest_exact(record):
    mapper = DatasetMapper(True, [FixedSizeCrop((30, 40))], recompute_boxes=True)
    full = DatasetMapper(True, [], rasterize_first=True)(record)["instances"]["masks"]
    random.seed(0)
    kept = []
    for _ in range(30):
        state = random.getstate()
        out = mapper(record)
        random.setstate(state)
        x0, y0 = random.randint(0, 100 - 40), random.randint(0, 60 - 30)  # the draw FixedSizeCrop makes
        assert out["image"].shape == (3, 30, 40)
        instances = out["instances"]
        expected = [i for i in range(2) if full[i, y0 : y0 + 30, x0 : x0 + 40].any()]
        assert len(instances["classes"]) == len(expected)
        for mask, box, index in zip(instances["masks"], instances["boxes"], expected):
            assert iou(mask, full[index, y0 : y0 + 30, x0 : x0 + 40]) > 0.9
            assert torch.equal(box, extent(mask))
        kept.append(len(expected))
    assert min(kept) < 2 <= max(kept)  # some windows lose an instance, some keep both


def test_fixed_size_crop_pads_a_smaller_image_without_drawing(record):
    random.seed(0)
    state = random.getstate()
    out = DatasetMapper(True, [FixedSizeCrop((80, 120), pad_value=7)])(record)
    assert random.getstate() == state  # nothing to crop: no random draw
    assert out["image"].shape == (3, 80, 120)
    assert (out["image"][:, 60:] == 7).all() and (out["image"][:, :, 100:] == 7).all()
    plain = DatasetMapper(True, [])(record)
    assert torch.equal(out["image"][:, :60, :100], plain["image"])
    assert torch.equal(out["instances"]["boxes"], plain["instances"]["boxes"])
    assert torch.equal(out["instances"]["masks"][:, :60, :100], plain["instances"]["masks"])
    assert not out["instances"]["masks"][:, 60:].any()
    unpadded = DatasetMapper(True, [FixedSizeCrop((80, 120), pad=False)])(record)
    assert unpadded["image"].shape == (3, 60, 100)


def test_resize_scale_draws_a_scale_of_the_target_and_keeps_the_aspect_ratio():
    augmentation = ResizeScale(min_scale=0.5, max_scale=2.0, target_height=64, target_width=64)
    random.seed(0)
    sizes = [augmentation.get_transform(60, 100) for _ in range(200)]
    long_edges = np.array([t.new_width for t in sizes])
    # the image fits in scale * 64 x 64, so its long edge is scale * 64
    assert long_edges.min() >= 31 and long_edges.max() <= 129 and long_edges.std() > 15
    for t in sizes:
        assert abs(t.new_height / t.new_width - 0.6) < 1.5 / t.new_width  # aspect kept up to rounding


def test_large_scale_jitter_gives_one_size_and_is_reproducible(record):
    mapper = DatasetMapper(
        True,
        [ResizeScale(0.1, 2.0, 64, 64), FixedSizeCrop((64, 64))],
        recompute_boxes=True,
    )

    def draws(seed):
        random.seed(seed)
        return [mapper(record) for _ in range(6)]

    first, again = draws(1), draws(1)
    assert all(out["image"].shape == (3, 64, 64) for out in first)
    for a, b in zip(first, again):
        assert torch.equal(a["image"], b["image"]) and torch.equal(
            a["instances"]["boxes"], b["instances"]["boxes"]
        )
    assert len({tuple(out["instances"]["boxes"].flatten().tolist()) for out in first}) > 1


def test_lsj_after_resize_shortest_edge_and_bad_arguments():
    assert FixedSizeCrop((100, 100)).get_transform(100, 100) is None  # already the size: nothing to do
    assert isinstance(FixedSizeCrop((50, 50)).get_transform(100, 100), CropTransform)
    assert isinstance(FixedSizeCrop((50, 200)).get_transform(100, 100), TransformList)
    assert ResizeShortestEdge(50).get_transform(100, 100).output_size() == (50, 50)
    with pytest.raises(ValueError, match=r"ResizeScale\(min_scale=, max_scale=\) must satisfy"):
        ResizeScale(2.0, 1.0, 64, 64)
    with pytest.raises(ValueError, match=r"ResizeScale\(target_height=, target_width=\) must be positive"):
        ResizeScale(0.5, 1.0, 0, 64)
    with pytest.raises(ValueError, match=r"FixedSizeCrop\(crop_size=\) must be \(height, width\)"):
        FixedSizeCrop((64,))
    with pytest.raises(
        ValueError, match=r"CropTransform: window x0=90, y0=0, 20x10 must lie inside the 100x60"
    ):
        CropTransform(60, 100, x0=90, y0=0, crop_height=10, crop_width=20)
    with pytest.raises(ValueError, match="pads must be >= 0"):
        PadTransform(10, 10, -1, 0)
    with pytest.raises(ValueError, match="needs at least one transform"):
        TransformList([])


def test_the_lsj_recipe_block_builds_a_mapper_that_jitters_and_cuts(record):
    from lazytrain.config import LazyConfig, instantiate
    from recipes.data.lsj import lsj_augmentations

    cfg = LazyConfig.load(os.path.join(REPO, "recipes", "data", "lvis_v1.py"))
    cfg.dataloader.train.mapper.augmentations = lsj_augmentations(48)
    cfg.dataloader.train.mapper.recompute_boxes = True
    LazyConfig.apply_overrides(cfg, ["dataloader.train.mapper.augmentations.1.max_scale=1.5"])
    mapper = instantiate(cfg.dataloader.train.mapper)
    assert [type(a).__name__ for a in mapper.augmentations] == ["RandomFlip", "ResizeScale", "FixedSizeCrop"]
    assert mapper.augmentations[1].max_scale == 1.5 and mapper.recompute_boxes
    random.seed(0)
    sizes = set()
    for _ in range(20):
        out = mapper(record)
        sizes.add(tuple(out["image"].shape[1:]))
        assert max(out["image"].shape[1:]) <= 48
        for box, mask in zip(out["instances"]["boxes"], out["instances"]["masks"]):
            assert torch.equal(box, extent(mask))
    assert len(sizes) > 3  # the scale varies
    assert any(width == 48 for _, width in sizes)  # wider than 48 after the resize: cut to 48 (no padding)
