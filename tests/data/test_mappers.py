import random

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_util
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from lazytrain.data.mappers import DatasetMapper, read_image
from lazytrain.data.transforms import FlipTransform, RandomFlip, ResizeShortestEdge
from tests.data.mapper_helpers import POLYGON, extent, iou


def expected_masks(record, size, flip):
    """Reference: rasterize the annotations at the ORIGINAL size, then move the bitmaps (nearest) and flip."""
    out = DatasetMapper(True, [], rasterize_first=True)(record)["instances"]["masks"]
    out = torch.nn.functional.interpolate(out[None].float(), size=size, mode="nearest-exact")[0].to(
        torch.uint8
    )
    return out.flip(-1) if flip == "horizontal" else out.flip(-2) if flip == "vertical" else out


@pytest.mark.parametrize("rasterize_first", [False, True], ids=["polygons", "bitmaps"])
@pytest.mark.parametrize("flip", ["none", "horizontal", "vertical"])
@pytest.mark.parametrize("short_edge", [60, 90, 37])
def test_flip_and_resize_keep_boxes_polygons_and_rle_consistent(record, flip, short_edge, rasterize_first):
    flips = (
        []
        if flip == "none"
        else [RandomFlip(1.0, horizontal=flip == "horizontal", vertical=flip == "vertical")]
    )
    mapper = DatasetMapper(
        True, [ResizeShortestEdge(short_edge, max_size=1000), *flips], rasterize_first=rasterize_first
    )
    out = mapper(record)
    height, width = short_edge, round(100 * short_edge / 60)
    assert out["image"].shape == (3, height, width) and out["image"].dtype == torch.uint8
    assert (out["height"], out["width"], out["image_id"], out["file_name"]) == (
        60,
        100,
        5,
        record["file_name"],
    )
    instances = out["instances"]
    assert instances["classes"].tolist() == [2, 1]  # the crowd region is not an instance
    assert instances["boxes"].dtype == torch.float32 and instances["masks"].dtype == torch.uint8
    assert instances["masks"].shape == (2, height, width)
    for box, mask, reference in zip(
        instances["boxes"], instances["masks"], expected_masks(record, (height, width), flip)
    ):
        assert torch.allclose(box, extent(mask), atol=1.0), (
            box,
            extent(mask),
        )  # box == mask extent within 1 px
        assert iou(mask, reference) > 0.85
    # exact box geometry: the polygon's box scaled then mirrored in continuous coordinates
    sx, sy = width / 100, height / 60
    x0, y0, x1, y1 = 10 * sx, 8 * sy, 45 * sx, 40 * sy
    if flip == "horizontal":
        x0, x1 = width - x1, width - x0
    if flip == "vertical":
        y0, y1 = height - y1, height - y0
    assert instances["boxes"][0].tolist() == pytest.approx(
        [x0, y0, x1, y1], abs=1e-4 + 0.01 * (short_edge % 2)
    )
    assert (out["image"][0, height // 2, 0] == 255) == (
        flip != "horizontal"
    )  # the image moved with the boxes


def test_polygon_path_matches_the_mask_of_the_transformed_polygon(record):
    """IoU ~1 between the mapper's mask and the polygon transformed by hand and rasterized at the output size."""
    random.seed(0)
    out = DatasetMapper(True, [ResizeShortestEdge(120, max_size=1000), RandomFlip(1.0)])(record)
    points = np.array(POLYGON).reshape(-1, 2) * 2.0
    points[:, 0] = 200 - points[:, 0]
    expected = mask_util.decode(mask_util.frPyObjects([points.reshape(-1).tolist()], 120, 200))[:, :, 0]
    assert iou(out["instances"]["masks"][0], torch.from_numpy(expected)) == pytest.approx(1.0)
    assert out["instances"]["boxes"][0].tolist() == pytest.approx([200 - 90, 16, 200 - 20, 80])


def test_instances_emptied_by_the_transform_are_dropped(record):
    record["annotations"][0]["bbox"] = [0.0, 0.0, 0.4, 0.4]
    record["annotations"][0]["segmentation"] = [[0, 0, 0.4, 0, 0.4, 0.4, 0, 0.4]]
    out = DatasetMapper(True, [ResizeShortestEdge(30, max_size=1000)])(record)
    assert out["instances"]["classes"].tolist() == [1]
    assert out["instances"]["masks"].shape == (1, 30, 50)


def test_instances_cropped_away_by_a_torchvision_transform_are_dropped(record):
    crop = v2.RandomCrop((30, 50))  # torchvision draws the offset from torch's global RNG
    torch.manual_seed(0)
    kept = []
    for _ in range(10):
        state = torch.get_rng_state()
        loose = DatasetMapper(True, [crop])(record)["instances"]
        torch.set_rng_state(state)
        out = DatasetMapper(True, [crop], recompute_boxes=True)(record)
        instances = out["instances"]
        assert out["image"].shape == (3, 30, 50) and len(instances["boxes"]) == len(instances["masks"])
        for box, loose_box, mask in zip(instances["boxes"], loose["boxes"], instances["masks"]):
            assert mask.any() and torch.equal(box, extent(mask))
            assert (loose_box[:2] <= box[:2]).all() and (loose_box[2:] >= box[2:]).all()
        kept.append(len(instances["classes"]))
    assert min(kept) < 2  # some crops lose an instance


def test_torchvision_flip_equals_lazytrain_flip(record):
    ours = DatasetMapper(True, [ResizeShortestEdge(90), RandomFlip(1.0)])(record)["instances"]
    theirs = DatasetMapper(True, [ResizeShortestEdge(90), v2.RandomHorizontalFlip(1.0)])(record)["instances"]
    assert torch.allclose(ours["boxes"], theirs["boxes"])
    assert all(iou(a, b) > 0.95 for a, b in zip(ours["masks"], theirs["masks"]))


@pytest.mark.parametrize("horizontal", [True, False])
def test_flip_transform_moves_boxes_like_torchvision(horizontal):
    boxes = torch.tensor([[1.0, 2.0, 30.0, 40.0], [0.0, 0.0, 64.0, 48.0], [10.5, 7.25, 11.0, 9.0]])
    flip = FlipTransform(48, 64, horizontal=horizontal)
    kernel = F.horizontal_flip_bounding_boxes if horizontal else F.vertical_flip_bounding_boxes
    expected = kernel(boxes, format=tv_tensors.BoundingBoxFormat.XYXY, canvas_size=(48, 64))
    assert torch.equal(flip.apply_boxes(boxes), expected)


def test_photometric_torchvision_transform_in_eval_mode(record):
    out = DatasetMapper(False, [ResizeShortestEdge(30), v2.ColorJitter(brightness=0.5)])(record)
    assert "instances" not in out and out["image"].shape == (3, 30, 50) and out["image"].dtype == torch.uint8
    assert (out["height"], out["width"], out["image_id"]) == (60, 100, 5)


@pytest.mark.parametrize("image_format", ["RGB", "BGR"])
def test_map_image_gives_the_image_the_mapper_gives_for_the_file(record, image_format):
    mapper = DatasetMapper(False, [ResizeShortestEdge(30, max_size=40)], image_format=image_format)
    image = torch.from_numpy(read_image(record["file_name"])).permute(2, 0, 1)
    mapped = mapper.map_image(image)
    assert mapped.shape == (3, 24, 40) and mapped.is_contiguous()
    assert torch.equal(mapped, mapper(record)["image"])


def test_box_corners_are_summed_in_float64_like_the_json_numbers(record):
    # x + w in float32 would round differently (and change training runs) for values like these
    bbox = [10.1, 8.3, 35.7, 32.9]
    record["annotations"] = [{**record["annotations"][0], "bbox": bbox}]
    boxes = DatasetMapper(True, [], use_instance_mask=False)(record)["instances"]["boxes"]
    expected = torch.tensor([[10.1, 8.3, 10.1 + 35.7, 8.3 + 32.9]], dtype=torch.float32)
    assert torch.equal(boxes, expected)


def test_boxes_only_and_bgr(record):
    out = DatasetMapper(True, [RandomFlip(1.0)], image_format="BGR", use_instance_mask=False)(record)
    assert set(out["instances"]) == {"boxes", "classes"}
    rgb = DatasetMapper(True, [RandomFlip(1.0)])(record)
    assert torch.equal(out["image"], rgb["image"].flip(0))


def test_augmentation_draws_from_the_global_rng(record):
    mapper = DatasetMapper(True, [ResizeShortestEdge([30, 45, 60, 75, 90]), RandomFlip()])

    def shapes(seed):
        random.seed(seed)
        return [
            tuple(mapper(record)["image"].shape) + (mapper(record)["instances"]["boxes"][0, 0].item(),)
            for _ in range(4)
        ]

    assert shapes(3) == shapes(3)
    assert len({shapes(seed)[0] for seed in range(8)}) > 1


def test_exif_orientation_is_applied(tmp_path):
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :10] = 255  # white on the left in storage order
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # displayed rotated 90 degrees clockwise: the white band goes to the top
    image.save(tmp_path / "rot.jpg", exif=exif, quality=95)
    array = read_image(str(tmp_path / "rot.jpg"))
    assert array.shape == (40, 20, 3) and array[:8].mean() > 200 and array[-20:].mean() < 50
    record = {
        "file_name": str(tmp_path / "rot.jpg"),
        "height": 40,
        "width": 20,
        "image_id": 1,
        "annotations": [],
    }
    assert DatasetMapper(True, [])(record)["image"].shape == (3, 40, 20)
    with pytest.raises(
        ValueError, match=r"rot\.jpg is 20x40 \(after EXIF orientation\) but its record says 40x20"
    ):
        DatasetMapper(True, [])({**record, "height": 20, "width": 40})


@pytest.mark.parametrize("mode, suffix", [("L", "jpg"), ("P", "png"), ("RGBA", "png"), ("CMYK", "jpg")])
def test_images_of_other_modes_are_read_as_rgb(tmp_path, mode, suffix):
    pixels = np.zeros((6, 8, 3), np.uint8)
    pixels[:, 4:] = 255
    Image.fromarray(pixels).convert(mode).save(tmp_path / f"x.{suffix}", quality=100)
    array = read_image(str(tmp_path / f"x.{suffix}"))
    assert array.shape == (6, 8, 3) and array.flags.writeable
    assert array[:, :3].max() < 30 and array[:, 5:].min() > 225


def test_missing_and_corrupt_images_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"image file not found: .*nope\.jpg"):
        DatasetMapper(False, [])({"file_name": str(tmp_path / "nope.jpg")})
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(OSError, match=r"cannot read image .*bad\.jpg"):
        read_image(str(tmp_path / "bad.jpg"))
    good = tmp_path / "good.jpg"
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(good)
    (tmp_path / "cut.jpg").write_bytes(good.read_bytes()[:200])
    with pytest.raises(OSError, match=r"cannot read image .*cut\.jpg"):
        read_image(str(tmp_path / "cut.jpg"))


def test_resize_shortest_edge_sampling_and_bad_arguments():
    random.seed(0)
    sizes = {
        ResizeShortestEdge([20, 40], sample_style="range").get_transform(10, 20).new_height for _ in range(50)
    }
    assert min(sizes) >= 20 and max(sizes) <= 40 and len(sizes) > 5
    assert {ResizeShortestEdge([20, 40]).get_transform(10, 20).new_height for _ in range(50)} == {20, 40}
    capped = ResizeShortestEdge(800, max_size=1333).get_transform(100, 400)
    assert (capped.new_height, capped.new_width) == (333, 1333)
    with pytest.raises(ValueError, match=r"sample_style=\) must be 'choice' or 'range'"):
        ResizeShortestEdge(20, sample_style="sometimes")
    with pytest.raises(ValueError, match=r"must be \[min, max\] with sample_style='range'"):
        ResizeShortestEdge([10, 20, 30], sample_style="range")
    with pytest.raises(ValueError, match="must be positive"):
        ResizeShortestEdge(0)


def test_random_flip_and_mapper_bad_arguments():
    with pytest.raises(ValueError, match=r"RandomFlip\(prob=\) must be in \[0, 1\]"):
        RandomFlip(1.5)
    with pytest.raises(ValueError, match="choose exactly one"):
        RandomFlip(horizontal=True, vertical=True)
    with pytest.raises(ValueError, match=r"image_format=\) must be 'RGB' or 'BGR'"):
        DatasetMapper(True, [], image_format="YUV")
    with pytest.raises(ValueError, match=r"recompute_boxes=True\) needs use_instance_mask=True"):
        DatasetMapper(True, [], use_instance_mask=False, recompute_boxes=True)
    with pytest.raises(TypeError, match="takes lazytrain Augmentations or torchvision v2 transforms"):
        DatasetMapper(True, [42])
