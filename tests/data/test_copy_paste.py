"""Copy-Paste in the train mapper: pasted masks and boxes on hand-built images, occlusion of the image's own
instances, polygon and RLE sources, the rare-aware weights, seeding, loader workers and the demo config."""

import math
import os
import random

import numpy as np
import pytest
import torch
from PIL import Image

from lazytrain.config import LazyConfig, instantiate
from lazytrain.data.build import build_detection_train_loader
from lazytrain.data.common import DatasetFromList, MapDataset
from lazytrain.data.copy_paste import CopyPaste, find_copy_paste_problems, paste_objects
from lazytrain.data.datasets.cached_records import CachedRecords
from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.repeat_factors import (
    CategoryIndex,
    category_repeat_factors,
    repeat_factors_from_category_frequency,
)
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge
from recipes.data.lsj import lsj_augmentations
from tests.data.mapper_helpers import extent, rle_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rect(height, width, y0, y1, x0, x1):
    mask = torch.zeros((height, width), dtype=torch.uint8)
    mask[y0:y1, x0:x1] = 1
    return mask


def instances_of(masks, classes):
    masks = torch.stack(masks) if masks else torch.zeros((0, 20, 30), dtype=torch.uint8)
    boxes = torch.stack([extent(m) for m in masks]) if len(masks) else torch.zeros((0, 4))
    return {"boxes": boxes, "classes": torch.tensor(classes, dtype=torch.int64), "masks": masks}


def assert_boxes_are_mask_extents(instances):
    assert all(mask.any() for mask in instances["masks"])
    for box, mask in zip(instances["boxes"], instances["masks"]):
        assert torch.equal(box, extent(mask)), (box, extent(mask))


def test_paste_removes_covered_pixels_drops_covered_instances_and_boxes_follow_masks():
    image = torch.zeros((3, 20, 30), dtype=torch.uint8)
    partly = rect(20, 30, 2, 10, 2, 12)  # its left half gets covered
    covered = rect(20, 30, 12, 14, 20, 22)  # fully covered
    apart = rect(20, 30, 15, 19, 2, 6)  # untouched, its (loose) box kept as is
    instances = instances_of([partly, covered, apart], [1, 2, 5])
    instances["boxes"][2] = torch.tensor([1.5, 14.5, 6.5, 19.5])
    source_image = torch.full((3, 20, 30), 255, dtype=torch.uint8)
    source = instances_of([rect(20, 30, 0, 12, 0, 7), rect(20, 30, 11, 15, 19, 23)], [3, 4])
    before = {key: value.clone() for key, value in instances.items()}

    out_image, out = paste_objects(image, instances, source_image, source, min_area=1)

    assert out["classes"].tolist() == [1, 5, 3, 4]
    assert torch.equal(out["masks"][0], rect(20, 30, 2, 10, 7, 12))
    assert out["boxes"][0].tolist() == [7, 2, 12, 10]
    assert torch.equal(out["masks"][1], apart) and out["boxes"][1].tolist() == [1.5, 14.5, 6.5, 19.5]
    assert torch.equal(out["masks"][2:], source["masks"])
    assert out["boxes"][2:].tolist() == [[0, 0, 7, 12], [19, 11, 23, 15]]
    union = source["masks"].amax(0).bool()
    assert (out_image[:, union] == 255).all() and (out_image[:, ~union] == 0).all()
    assert all(torch.equal(before[key], instances[key]) for key in before)  # inputs untouched
    assert (image == 0).all()


@pytest.mark.parametrize("min_area", [1, 16], ids=["min_area-1", "min_area-16-the-old-default"])
def test_only_fully_covered_instances_are_dropped_and_small_partly_covered_ones_stay(min_area):
    """Ghiasi et al.: fully occluded objects are removed, partly occluded ones keep their visible part. A
    15-pixel object with one pixel covered stays as an uncovered 15-pixel one does, whatever `min_area`."""
    line = rect(20, 30, 10, 11, 5, 20)  # 15 pixels in a row, its leftmost one covered
    apart = rect(20, 30, 15, 18, 20, 25)  # 15 pixels, not covered
    covered = rect(20, 30, 1, 4, 0, 5)  # 15 pixels, all covered
    instances = instances_of([line, apart, covered], [1, 2, 3])
    instances["boxes"][0] = torch.tensor([4.5, 9.5, 20.5, 11.5])  # loose: recomputed once pixels are lost
    source = instances_of([rect(20, 30, 0, 11, 0, 6)], [4])
    image, source_image = (
        torch.zeros((3, 20, 30), dtype=torch.uint8),
        torch.ones((3, 20, 30), dtype=torch.uint8),
    )
    _, out = paste_objects(image, instances, source_image, source, min_area=min_area)
    assert out["classes"].tolist() == [1, 2, 4]
    visible = line.clone()
    visible[10, 5] = 0
    assert torch.equal(out["masks"][0], visible) and int(out["masks"][0].sum()) == 14
    assert out["boxes"][0].tolist() == [6, 10, 20, 11]
    assert torch.equal(out["masks"][1], apart) and out["boxes"][1].tolist() == [20, 15, 25, 18]
    assert_boxes_are_mask_extents(out)


def test_min_area_leaves_out_pasted_objects_with_fewer_pixels_on_the_image():
    """Counted on the image: a 20-pixel object with 5 of its pixels beyond the image's edge has 15."""
    instances = instances_of([rect(20, 30, 0, 20, 0, 30)], [1])  # the whole image
    small, large, cut = rect(24, 30, 0, 3, 0, 5), rect(24, 30, 5, 9, 0, 4), rect(24, 30, 17, 21, 10, 15)
    source = {
        "boxes": torch.zeros((3, 4)),
        "classes": torch.tensor([3, 4, 5]),
        "masks": torch.stack([small, large, cut]),
    }
    image, source_image = (
        torch.zeros((3, 20, 30), dtype=torch.uint8),
        torch.ones((3, 24, 30), dtype=torch.uint8),
    )
    out_image, out = paste_objects(image, instances, source_image, source, min_area=16)
    assert out["classes"].tolist() == [1, 4]  # the 15-pixel one and the cut one are not pasted
    assert int(out_image[0].sum()) == 16  # only the pasted object's pixels replace the image's
    assert int(out["masks"][0].sum()) == 20 * 30 - 16
    _, out = paste_objects(image, instances, source_image, source, min_area=15)
    assert out["classes"].tolist() == [1, 3, 4, 5]
    assert_boxes_are_mask_extents(out)


@pytest.mark.parametrize("source_size", [(12, 40), (30, 18)], ids=["wider", "taller"])
def test_a_source_of_another_size_is_laid_from_the_top_left_and_cut(source_size):
    height, width = source_size
    image = torch.zeros((3, 20, 30), dtype=torch.uint8)
    instances = instances_of([rect(20, 30, 0, 20, 0, 30)], [1])  # the whole image
    inside, outside = rect(height, width, 8, 12, 10, 18), rect(height, width, 0, 4, 0, 4)
    outside[:4, :4], outside[-2:, -2:] = 0, 1  # only beyond the image's extent
    source = {
        "boxes": torch.zeros((2, 4)),
        "classes": torch.tensor([3, 4]),
        "masks": torch.stack([inside, outside]),
    }
    out_image, out = paste_objects(
        image, instances, torch.full((3, height, width), 9, dtype=torch.uint8), source
    )
    assert out_image.shape == (3, 20, 30) and out["masks"].shape[1:] == (20, 30)
    assert out["classes"].tolist() == [1, 3]  # the object beyond the image is left out
    assert out["masks"][0].sum() == 20 * 30 - 32 and out["boxes"][1].tolist() == [10, 8, 18, 12]
    assert int((out_image[0] == 9).sum()) == 32
    assert_boxes_are_mask_extents(out)


def write_image(path, height, width, value):
    Image.fromarray(np.full((height, width, 3), value, np.uint8)).save(path)
    return str(path)


def annotation(kind, y0, y1, x0, x1, category, height=40, width=60):
    """A rectangle as a polygon or an RLE annotation."""
    if kind == "polygon":
        segmentation = [[x0, y0, x1, y0, x1, y1, x0, y1]]
    else:
        segmentation = rle_of(rect(height, width, y0, y1, x0, x1).numpy())
    bbox = [x0, y0, x1 - x0, y1 - y0]
    return {"bbox": bbox, "category_id": category, "iscrowd": 0, "segmentation": segmentation}


@pytest.fixture
def make_record(tmp_path):
    def make(name, value, annotations, height=40, width=60):
        path = write_image(tmp_path / f"{name}.png", height, width, value)
        return {
            "file_name": path,
            "height": height,
            "width": width,
            "image_id": name,
            "annotations": annotations,
        }

    return make


@pytest.mark.parametrize("source_kind", ["polygon", "rle"])
@pytest.mark.parametrize("image_kind", ["polygon", "rle"])
def test_the_mapper_pastes_polygon_and_rle_objects(make_record, image_kind, source_kind):
    record = make_record(
        "image",
        0,
        [annotation(image_kind, 5, 25, 5, 25, 1), annotation(image_kind, 30, 34, 40, 44, 2)],
    )
    source = make_record(
        "source",
        200,
        [annotation(source_kind, 0, 25, 0, 15, 3), annotation(source_kind, 28, 36, 38, 46, 4)],
    )
    mapper = DatasetMapper(True, [], copy_paste=CopyPaste("uniform", max_objects=2))
    mapper.attach_dataset([source])
    expected = {3: rect(40, 60, 0, 25, 0, 15), 4: rect(40, 60, 28, 36, 38, 46)}
    seen = set()
    for seed in range(8):
        random.seed(seed)
        out = mapper(record)
        instances = out["instances"]
        classes = instances["classes"].tolist()
        pasted = [c for c in classes if c in (3, 4)]
        seen.add(tuple(pasted))
        # object 4 covers instance 2 whole, object 3 the left half of instance 1
        assert classes == [1, *([] if 4 in pasted else [2]), *pasted]
        for category, mask in zip(pasted, instances["masks"][-len(pasted) :]):
            assert torch.equal(mask, expected[category])
        left = 15 if 3 in pasted else 5
        assert torch.equal(instances["masks"][0], rect(40, 60, 5, 25, left, 25))
        assert_boxes_are_mask_extents(instances)
        union = instances["masks"][-len(pasted) :].amax(0).bool()
        assert (out["image"][:, union] == 200).all() and (out["image"][:, ~union] == 0).all()
        assert (out["height"], out["width"], out["image_id"]) == (40, 60, "image")
    assert (3, 4) in seen and len(seen) > 1


def test_mode_none_and_prob_zero_paste_nothing_and_draw_nothing(record):
    random.seed(3)
    plain = DatasetMapper(True, [ResizeShortestEdge([30, 50]), RandomFlip()])(record)
    after = random.random()
    for copy_paste in (CopyPaste("none"), CopyPaste("uniform", prob=0.0)):
        mapper = DatasetMapper(True, [ResizeShortestEdge([30, 50]), RandomFlip()], copy_paste=copy_paste)
        mapper.attach_dataset([record])
        random.seed(3)
        out = mapper(record)
        assert torch.equal(out["image"], plain["image"])
        assert all(torch.equal(out["instances"][k], v) for k, v in plain["instances"].items())
        if copy_paste.mode == "none":
            assert random.random() == after


def category_records(categories_per_image):
    return [{"annotations": [{"category_id": c} for c in cats]} for cats in categories_per_image]


# category 0 in every image, 1 in two, 2 in one (twice), and a crowd region of category 3
RARE_RECORDS = category_records([[0, 1], [0], [0, 2, 2], [0, 1], [0], [0]])
RARE_RECORDS[1]["annotations"].append({"category_id": 3, "iscrowd": 1})


def test_rare_aware_source_probabilities_follow_the_repeat_factors():
    copy_paste = CopyPaste("rare", repeat_thresh=0.5)
    copy_paste.attach_dataset(RARE_RECORDS)
    # independent: f_c = images with c / 6 (crowd regions ignored), r_c = max(1, sqrt(0.5 / f_c))
    factor = {0: 1.0, 1: math.sqrt(0.5 / (2 / 6)), 2: math.sqrt(0.5 / (1 / 6))}
    sums = [
        sum(factor[a["category_id"]] for a in r["annotations"] if not a.get("iscrowd")) for r in RARE_RECORDS
    ]
    expected = np.array(sums) / sum(sums)
    np.testing.assert_allclose(copy_paste.source_probabilities(), expected, rtol=1e-6)
    random.seed(0)
    draws = np.bincount([copy_paste._draw_source() for _ in range(20000)], minlength=6) / 20000
    np.testing.assert_allclose(draws, expected, atol=4 * math.sqrt(0.25 / 20000))
    weights = copy_paste.object_weights(torch.tensor([0, 1, 2, 2]))
    np.testing.assert_allclose(weights, [factor[c] for c in (0, 1, 2, 2)], rtol=1e-6)
    uniform = CopyPaste("uniform")
    uniform.attach_dataset(RARE_RECORDS)
    np.testing.assert_allclose(uniform.source_probabilities(), np.full(6, 1 / 6))


def test_rare_aware_object_choice_probabilities_are_the_normalized_weights():
    copy_paste = CopyPaste("rare", repeat_thresh=0.5, max_objects=1)
    copy_paste.attach_dataset(RARE_RECORDS)
    classes = torch.tensor([0, 0, 1, 2])
    weights = copy_paste.object_weights(classes)
    random.seed(0)
    draws = [copy_paste._draw_objects(classes) for _ in range(20000)]
    assert all(len(d) == 1 for d in draws)
    counts = np.bincount([d[0] for d in draws], minlength=4) / 20000
    np.testing.assert_allclose(counts, weights / weights.sum(), atol=4 * math.sqrt(0.25 / 20000))
    copy_paste.max_objects = 3
    random.seed(0)
    sizes = [len(copy_paste._draw_objects(classes)) for _ in range(3000)]
    assert set(sizes) == {1, 2, 3}


def test_category_repeat_factors_are_those_the_image_factors_take_the_maximum_of():
    records = category_records([[0, 1], [0], [0, 4, 4], [0, 1], [], [0]])
    index = CategoryIndex.from_dataset_dicts(records)
    factors = category_repeat_factors(index, 0.5)
    assert factors.dtype == np.float32 and factors[3] == 1.0  # absent category
    images = repeat_factors_from_category_frequency(records, 0.5)
    assert images.tolist() == [
        max([1.0, *(factors[a["category_id"]] for a in r["annotations"])]) for r in records
    ]
    assert category_repeat_factors(index, 0.0).tolist() == [1.0] * 5


def test_bad_settings_name_the_argument(record):
    with pytest.raises(
        ValueError, match=r"CopyPaste\(mode=\) must be one of 'none', 'uniform', 'rare'; got 'rar'"
    ):
        CopyPaste("rar")
    with pytest.raises(ValueError, match=r"CopyPaste\(prob=\)"):
        CopyPaste(prob=1.5)
    with pytest.raises(ValueError, match=r"CopyPaste\(max_objects=\)"):
        CopyPaste(max_objects=0)
    problems = find_copy_paste_problems({"mode": "rare", "prob": -0.5, "min_area": 3, "repeat_thresh": "x"})
    assert problems == {
        "prob": "must be a number in [0, 1]; got -0.5",
        "repeat_thresh": "must be a number >= 0 (0 weighs every category alike; LVIS's RFS uses 0.001); got 'x'",
    }
    with pytest.raises(ValueError, match=r"needs is_train=True and use_instance_mask=True"):
        DatasetMapper(False, copy_paste=CopyPaste())
    with pytest.raises(ValueError, match="no dataset to draw source images from"):
        DatasetMapper(True, copy_paste=CopyPaste())(record)
    with pytest.raises(ValueError, match="no annotations outside crowd regions"):
        CopyPaste("rare").attach_dataset([{"annotations": [{"category_id": 0, "iscrowd": 1}]}])


@pytest.fixture
def pool(make_record):
    """Six 40x60 images of shades 0, 40, ..., each with a polygon and an RLE object."""
    return [
        make_record(
            f"img{i}",
            40 * i,
            [
                annotation("polygon", 2 + i, 20 + i, 3 * i, 20 + 3 * i, i % 3),
                annotation("rle", 24, 38, 30, 58, 3),
            ],
        )
        for i in range(6)
    ]


def jitter_mapper(mode="rare"):
    return DatasetMapper(
        True,
        [ResizeShortestEdge([30, 40, 50], max_size=80), RandomFlip()],
        recompute_boxes=True,
        copy_paste=CopyPaste(mode, repeat_thresh=0.5),
    )


def test_same_sample_seed_same_output_different_seed_different(pool):
    records, mapper = DatasetFromList(pool), jitter_mapper()
    mapper.attach_dataset(records)
    dataset = MapDataset(records, mapper)
    first, again = dataset[(2, 123)], dataset[(2, 123)]
    assert torch.equal(first["image"], again["image"])
    assert all(torch.equal(first["instances"][k], v) for k, v in again["instances"].items())
    others = [dataset[(2, seed)] for seed in range(1, 6)]
    assert any(
        o["image"].shape != first["image"].shape or not torch.equal(o["image"], first["image"])
        for o in others
    )
    for out in [first, *others]:
        assert_boxes_are_mask_extents(out["instances"])


def test_with_large_scale_jitter_boxes_stay_mask_extents(pool):
    mapper = DatasetMapper(True, [], recompute_boxes=True, copy_paste=CopyPaste("uniform", max_objects=2))
    mapper.augmentations = [instantiate(a) for a in lsj_augmentations(48)]
    mapper.attach_dataset(pool)
    random.seed(0)
    pasted = 0
    for record in pool * 2:
        out = mapper(record)
        assert max(out["image"].shape[1:]) <= 48
        assert out["instances"]["masks"].shape[1:] == out["image"].shape[1:]
        assert_boxes_are_mask_extents(out["instances"])
        pasted += len(out["instances"]["classes"]) > 2
    assert pasted > 0


def take(loader, count):
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == count:
            return batches
    return batches


def test_the_loader_attaches_its_dataset_and_two_workers_map_as_one_process(pool):
    def build(workers):
        mapper = jitter_mapper()
        loader = build_detection_train_loader(
            pool, mapper=mapper, total_batch_size=2, num_workers=workers, seed=7, aspect_ratio_grouping=False
        )
        assert mapper.copy_paste._dataset is loader.dataset.dataset  # the loader's records, no second copy
        return take(loader, 2)

    serial, parallel = build(0), build(2)
    assert_same_samples(sum(serial, []), sum(parallel, []))


def test_a_resumed_loader_pastes_what_the_uninterrupted_one_did(pool):
    def build():
        return build_detection_train_loader(pool, mapper=jitter_mapper(), total_batch_size=2, seed=7)

    uninterrupted, first = take(build(), 3), build()
    take(first, 1)
    resumed = build()
    resumed.load_state_dict(first.state_dict())
    assert_same_samples(sum(uninterrupted[1:], []), sum(take(resumed, 2), []))


def assert_same_samples(samples, others):
    for a, b in zip(samples, others, strict=True):
        assert torch.equal(a["image"], b["image"])
        assert all(torch.equal(a["instances"][k], v) for k, v in b["instances"].items())


def test_the_demo_config_with_copy_paste_maps_batches(tmp_path, monkeypatch):
    from lazytrain.data.datasets.synthetic import generate_synthetic_lt
    from tests.smoke import TINY_SYNTHETIC_LT

    generate_synthetic_lt(str(tmp_path / "synthetic_lt"), **TINY_SYNTHETIC_LT)
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    assert cfg.dataloader.train.mapper.copy_paste.mode == "none"
    LazyConfig.apply_overrides(
        cfg,
        ["dataloader.train.mapper.copy_paste.mode=rare", "dataloader.train.num_workers=0", "train.seed=0"],
    )
    loader = instantiate(cfg.dataloader.train)
    copy_paste = loader.dataset._map_func.copy_paste
    records = loader.dataset.dataset
    assert isinstance(records, CachedRecords)  # the weights come from the annotation cache's arrays
    from_records = CopyPaste("rare", repeat_thresh=0.3)
    from_records.attach_dataset([records[i] for i in range(len(records))])
    np.testing.assert_allclose(
        copy_paste.source_probabilities(), from_records.source_probabilities(), rtol=1e-12
    )
    annotated = {records[i]["image_id"]: len(records[i]["annotations"]) for i in range(len(records))}
    batches = take(loader, 2)
    assert [len(b) for b in batches] == [4, 4]
    samples = sum(batches, [])
    for sample in samples:
        masks = sample["instances"]["masks"]
        assert masks.shape[1:] == sample["image"].shape[1:] and all(mask.any() for mask in masks)
    assert any(len(s["instances"]["classes"]) > annotated[s["image_id"]] for s in samples)  # pasted objects


def test_a_misspelled_mode_in_the_demo_config_names_the_key():
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    LazyConfig.apply_overrides(cfg, ["dataloader.train.mapper.copy_paste.mode=rar"])
    with pytest.raises(
        Exception, match=r"dataloader\.train\.mapper\.copy_paste.*must be one of 'none', 'uniform', 'rare'"
    ):
        instantiate(cfg.dataloader.train.mapper)


def test_a_recipe_without_the_key_gets_copy_paste_from_the_command_line():
    """README's form for the LVIS recipes, which have no copy_paste key."""
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "maskrcnn_vitdet_b_rfs.py"))
    override = "+dataloader.train.mapper.copy_paste={_target_:lazytrain.data.copy_paste.CopyPaste,mode:rare}"
    LazyConfig.apply_overrides(cfg, [override])
    mapper = instantiate(cfg.dataloader.train.mapper)
    assert (mapper.copy_paste.mode, mapper.copy_paste.repeat_thresh, mapper.recompute_boxes) == (
        "rare",
        0.001,
        True,
    )
