"""`grouped_batched_nms`: torchvision's ``batched_nms`` for any number of groups with a few host reads, and
`batched_nms` taking it where torchvision would loop over the groups on a device."""

import numpy as np
import pytest
import torch
from torchvision.ops import boxes as box_ops

from lazytrain.modeling import nms, suppression
from lazytrain.modeling.nms import batched_nms, grouped_batched_nms
from lazytrain.utils.host_syncs import HostSyncCounter


def _candidates(count: int, groups: int, seed: int = 0, dtype=torch.float32):
    """Boxes clustered around a few centres (so that NMS has work), scores, and group sizes skewed as LVIS's
    classes are (a few large groups, many small ones)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(count // 10 + 1, 2, generator=generator) * 800
    centre = centres[torch.randint(0, len(centres), (count,), generator=generator)]
    centre = centre + torch.randn(count, 2, generator=generator) * 15
    size = torch.rand(count, 2, generator=generator) * 80 + 5
    boxes = torch.cat([centre - size / 2, centre + size / 2], dim=1).to(dtype)
    scores = torch.randperm(count, generator=generator).to(dtype) / max(count, 1)  # distinct
    labels = (torch.rand(count, generator=generator) ** 3 * groups).long()
    return boxes, scores, labels


@pytest.mark.parametrize(
    "count, groups, threshold, dtype",
    [
        (0, 5, 0.5, torch.float32),
        (1, 3, 0.5, torch.float32),
        (70, 1, 0.5, torch.float32),  # one group past a bucket of 64
        (3000, 40, 0.5, torch.float32),
        (6000, 1203, 0.5, torch.float32),  # LVIS's classes
        (6000, 300, 0.3, torch.float32),
        (3000, 7, 0.7, torch.float64),
    ],
)
def test_grouped_batched_nms_keeps_torchvisions_boxes_in_its_order(count, groups, threshold, dtype):
    boxes, scores, labels = _candidates(count, groups, dtype=dtype)
    expected = box_ops.batched_nms(boxes, scores, labels, threshold)
    assert torch.equal(grouped_batched_nms(boxes, scores, labels, threshold), expected)


def test_with_tied_scores_the_same_boxes_are_kept_ties_ordered_by_index():
    boxes, scores, labels = _candidates(3000, 60)
    scores = (scores * 50).floor()  # 50 distinct values
    got = grouped_batched_nms(boxes, scores, labels, 0.5)
    expected = box_ops.batched_nms(boxes, scores, labels, 0.5)
    assert sorted(got.tolist()) == sorted(expected.tolist()) and torch.equal(scores[got], scores[expected])
    for value in scores[got].unique():
        tied = got[scores[got] == value]
        assert torch.equal(tied, tied.sort().values)


def test_a_few_host_reads_for_any_number_of_groups_where_torchvisions_loop_makes_two_per_group():
    boxes, scores, labels = _candidates(6000, 1203)
    with HostSyncCounter(treat_cpu_as_device=True) as grouped:
        grouped_batched_nms(boxes, scores, labels, 0.5)
    with HostSyncCounter(treat_cpu_as_device=True) as looped:
        box_ops.batched_nms(boxes, scores, labels, 0.5)
    present = labels.unique().numel()
    assert looped.total >= 2 * present > 800  # a where and an nms per group
    assert grouped.total <= 15, grouped.format_counts()  # group sizes 2, per bucket 1-2, survivors 1


def test_batched_nms_groups_on_devices_above_torchvisions_loop_size(monkeypatch):
    boxes, scores, labels = _candidates(3000, 40)
    calls = []
    monkeypatch.setattr(
        nms, "grouped_batched_nms", lambda *args, **kwargs: calls.append(args[0].shape) or args[2][:0]
    )
    expected = box_ops.batched_nms(boxes, scores, labels, 0.5)
    assert torch.equal(
        batched_nms(boxes, scores, labels, 0.5, (800, 800)), expected
    )  # the CPU: torchvision's
    monkeypatch.setattr(nms, "_GROUPED_ABOVE_ELEMENTS", {})  # as on a device: above 100,000 coordinates
    assert torch.equal(batched_nms(boxes, scores, labels, 0.5, (800, 800)), expected) and calls == []
    many = _candidates(26000, 40)
    assert batched_nms(*many, 0.5, (800, 800)).numel() == 0 and calls == [(26000, 4)]


def _level_candidates(rows: int, count: int, seed: int, dtype=torch.float32):
    """An RPN level's candidates for `rows` images: clustered boxes (with exact duplicates, boxes of zero width
    and a zero-area box), and about a tenth of them invalid."""
    boxes, _, _ = _candidates(rows * count, 1, seed=seed, dtype=dtype)
    boxes = boxes.reshape(rows, count, 4)
    if count > 4:
        boxes[:, 1] = boxes[:, 0]  # a duplicate: IoU 1
        boxes[:, 2, 2] = boxes[:, 2, 0]  # zero width
        boxes[:, 3] = boxes[:, 3, :1].repeat(1, 4)  # a point: zero area, IoU nan with itself
    valid = torch.rand(rows, count, generator=torch.Generator().manual_seed(seed)) > 0.1
    return boxes, valid


@pytest.mark.slow  # compiles with inductor (C++ on the CPU): ~5-15 s in a fresh process
@pytest.mark.parametrize(
    "rows, sizes, threshold, dtype",
    [
        (2, [2000, 507], 0.7, torch.float32),  # the R50 RPN's level sizes in training
        (8, [600, 150, 37], 0.7, torch.float32),  # the demo's, batch 8; a level of at most 64 boxes
        (3, [300], 0.3, torch.float32),  # 0.3 rounds up in float32: compared as torchvision does
        (2, [130, 64], 0.5, torch.float64),
    ],
)
def test_compiled_suppression_bits_equal_the_tiles_bit_for_bit(rows, sizes, threshold, dtype):
    boxes, valid = _level_candidates(rows, sum(sizes), seed=len(sizes), dtype=dtype)
    groups = nms._group_slices(sizes)
    compiled = suppression.suppression_bits(boxes, valid, groups, threshold, compiled=True)
    expected = suppression.suppression_bits(boxes, valid, groups, threshold, compiled=False)
    assert torch.equal(compiled, expected)
    assert bool((expected != 0).any())  # boxes do suppress each other


# Not slow (~14 s with a cold compile cache): the floor torch's quick suite compiles both kernels too.
def test_grouped_nms_with_the_compiled_bits_keeps_torchvisions_boxes():
    boxes, valid = _level_candidates(3, 900, seed=5)
    scores = torch.rand(3, 900, generator=torch.Generator().manual_seed(5))
    scores, order = scores.masked_fill(~valid, -1.0).sort(dim=1, descending=True)
    boxes, valid = boxes.gather(1, order[..., None].expand(-1, -1, 4)), valid.gather(1, order)
    sizes = [400, 300, 200]
    keep, is_final = nms.grouped_nms(boxes, scores, valid, sizes, 0.6, needed=0, compiled=True)
    assert bool(is_final)
    for row in range(3):
        for group in nms._group_slices(sizes):
            members = valid[row, group].nonzero()[:, 0]
            kept = box_ops.nms(boxes[row, group][members], scores[row, group][members], 0.6)
            assert torch.equal(keep[row, group].nonzero()[:, 0], members[kept].sort().values)


@pytest.mark.slow
@pytest.mark.parametrize(
    "count, groups, threshold, dtype",
    [(6000, 1203, 0.5, torch.float32), (3000, 7, 0.7, torch.float64), (70, 1, 0.5, torch.float32)],
)
def test_grouped_batched_nms_with_compiled_kernels_keeps_torchvisions_boxes(count, groups, threshold, dtype):
    boxes, scores, labels = _candidates(count, groups, dtype=dtype)
    expected = box_ops.batched_nms(boxes, scores, labels, threshold)
    assert torch.equal(grouped_batched_nms(boxes, scores, labels, threshold, compiled=True), expected)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.7, 0.9, 1.0, 0.123456789])
def test_the_compiled_comparison_decides_as_the_rounded_float32_quotient(threshold):
    """`_comparison`'s ``inter > m * union`` in float64 against the float32 quotient compared in double, as
    torchvision's CPU kernel does, on random pairs and on pairs a few float32 steps around the threshold."""
    rng = np.random.default_rng(0)
    inter = (rng.random(200_000) * 500).astype(np.float32)
    union = (inter + rng.random(200_000).astype(np.float32) * 500).astype(np.float32)
    near = (inter / np.float32(max(threshold, 0.25))).astype(np.float32)
    near = np.nextafter(near, near + rng.integers(-4, 5, near.size).astype(np.float32))
    bound, by_product = suppression._comparison(threshold, torch.float32)
    assert by_product
    for unions in (union, near, np.zeros_like(union)):
        with np.errstate(divide="ignore", invalid="ignore"):
            expected = (inter / unions).astype(np.float64) > threshold
        actual = inter.astype(np.float64) > unions.astype(np.float64) * bound
        assert np.array_equal(actual, expected)
    assert suppression._comparison(threshold, torch.float64) == (threshold, False)


def test_greedy_steps_that_do_not_settle_raise_even_under_python_O():
    """Not an assert (``python -O`` strips those): a RuntimeError that asks for the boxes."""
    suppression = torch.zeros(1, 1, 64, 1, dtype=torch.int64)
    valid = torch.ones(1, 1, 64, dtype=torch.bool)

    def never_settle(suppression, valid, keep):
        return keep, torch.tensor(False)

    with pytest.raises(RuntimeError, match="did not settle within 64 boxes"):
        nms._step_until_settled(never_settle, suppression, valid, valid, torch.tensor(False))
