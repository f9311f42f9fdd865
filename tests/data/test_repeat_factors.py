"""Repeat factors: the formulas by hand, the loop reference bit for bit, the threshold's errors, the CSR table."""

import math

import numpy as np
import pytest
import torch

from lazytrain.data.repeat_factors import CategoryIndex, repeat_factors_from_category_frequency
from tests.data.rfs_reference import RECORDS, loop_repeat_factors


def test_rfs_formula_hand_computed():
    records = [
        {"annotations": [{"category_id": 0}, {"category_id": 1}]},
        {"annotations": [{"category_id": 0}]},
        {"annotations": []},
    ]
    factors = repeat_factors_from_category_frequency(records, 0.5)
    # f_0 = 2/3 -> r_0 = max(1, sqrt(0.75)) = 1; f_1 = 1/3 -> r_1 = sqrt(1.5)
    assert factors.tolist() == pytest.approx([math.sqrt(1.5), 1.0, 1.0])
    no_sqrt = repeat_factors_from_category_frequency(records, 0.5, sqrt=False)
    assert no_sqrt.tolist() == pytest.approx([1.5, 1.0, 1.0])


def test_irfs_formula_hand_computed():
    records = [
        {"annotations": [{"category_id": 0}] * 3 + [{"category_id": 1}]},
        {"annotations": [{"category_id": 0}]},
        {},  # no annotations key at all
    ]
    factors = repeat_factors_from_category_frequency(records, 0.9, instance_aware=True)
    f0 = math.sqrt((2 / 3) * (4 / 5))  # in 2 of 3 images, 4 of 5 instances
    f1 = math.sqrt((1 / 3) * (1 / 5))
    r0, r1 = max(1.0, math.sqrt(0.9 / f0)), max(1.0, math.sqrt(0.9 / f1))
    assert factors.tolist() == pytest.approx([max(r0, r1), r0, 1.0])
    assert r1 > r0 > 1.0


def test_zero_threshold_is_uniform_and_negative_is_an_error():
    uniform = repeat_factors_from_category_frequency(RECORDS, 0.0)
    assert uniform.unique().tolist() == [1.0]
    for bad in (-0.1, float("nan"), "0.1"):
        with pytest.raises(
            ValueError,
            match=r"repeat_thresh=\) must be a number >= 0.*got .*dataloader\.train\.sampler\.repeat_thresh",
        ):
            repeat_factors_from_category_frequency(RECORDS, bad)


@pytest.mark.parametrize("instance_aware", [False, True], ids=["rfs", "irfs"])
@pytest.mark.parametrize("sqrt", [True, False], ids=["sqrt", "linear"])
@pytest.mark.parametrize("thresh", [0.01, 0.3])
def test_factors_equal_the_loop_reference_bit_for_bit(thresh, sqrt, instance_aware):
    vectorized = repeat_factors_from_category_frequency(
        RECORDS, thresh, sqrt=sqrt, instance_aware=instance_aware
    )
    assert torch.equal(vectorized, loop_repeat_factors(RECORDS, thresh, sqrt, instance_aware))
    assert vectorized.max() > 1


def test_category_index_from_dicts_and_prebuilt_csr_agree():
    index = CategoryIndex.from_dataset_dicts(RECORDS)
    assert index.num_images == len(RECORDS) and index.categories.dtype == np.int32
    image = 5
    annotations = [a["category_id"] for a in RECORDS[image]["annotations"]]
    span = slice(index.offsets[image], index.offsets[image + 1])
    assert index.categories[span].tolist() == sorted(set(annotations))
    assert index.instances[span].tolist() == [annotations.count(c) for c in sorted(set(annotations))]
    prebuilt = CategoryIndex(index.offsets.copy(), index.categories.copy(), index.instances.copy())
    for instance_aware in (False, True):
        assert torch.equal(
            repeat_factors_from_category_frequency(prebuilt, 0.1, True, instance_aware),
            loop_repeat_factors(RECORDS, 0.1, True, instance_aware),
        )


def test_category_index_rejects_inconsistent_arrays():
    with pytest.raises(ValueError, match=r"CategoryIndex\(offsets=\) must be 1-D, start at 0"):
        CategoryIndex(np.array([0, 2, 3]), np.zeros(2, np.int32), np.ones(2, np.int32))


def test_detectron2s_name_on_the_sampler_is_the_modules_function():
    """detectron2 users call ``RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(dicts,
    thresh)``: the same name, positional arguments and tensor there, one implementation (failed before: the
    factors had moved to lazytrain.data.repeat_factors only)."""
    from lazytrain.data.samplers import RepeatFactorTrainingSampler

    records = [
        {"annotations": [{"category_id": 0}, {"category_id": 1}]},
        {"annotations": [{"category_id": 0}]},
    ]
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, 1.0)
    assert isinstance(factors, torch.Tensor) and factors.dtype == torch.float32
    assert factors.tolist() == pytest.approx([math.sqrt(2.0), 1.0])  # f_1 = 1/2 -> sqrt(1 / 0.5)
    assert (
        RepeatFactorTrainingSampler.repeat_factors_from_category_frequency
        is repeat_factors_from_category_frequency
    )
    sampler = RepeatFactorTrainingSampler(factors, seed=0, rank=0, world_size=1)
    assert sampler.repeat_factors_from_category_frequency(records, 1.0, sqrt=False).tolist() == [2.0, 1.0]
