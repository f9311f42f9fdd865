"""`grouped_batched_nms`: torchvision's ``batched_nms`` for any number of groups with a few host reads, and
`batched_nms` taking it where torchvision would loop over the groups on a device."""

import pytest
import torch
from torchvision.ops import boxes as box_ops

from lazytrain.modeling import nms
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
    monkeypatch.setattr(nms, "grouped_batched_nms", lambda *args: calls.append(args[0].shape) or args[2][:0])
    expected = box_ops.batched_nms(boxes, scores, labels, 0.5)
    assert torch.equal(
        batched_nms(boxes, scores, labels, 0.5, (800, 800)), expected
    )  # the CPU: torchvision's
    monkeypatch.setattr(nms, "_GROUPED_ABOVE_ELEMENTS", {})  # as on a device: above 100,000 coordinates
    assert torch.equal(batched_nms(boxes, scores, labels, 0.5, (800, 800)), expected) and calls == []
    many = _candidates(26000, 40)
    assert batched_nms(*many, 0.5, (800, 800)).numel() == 0 and calls == [(26000, 4)]
