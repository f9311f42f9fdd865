"""The training step with fixed shapes (`lazytrain.modeling.fixed_shapes`): the same shapes at every step, no
host syncs, a whole-graph compile, and the dynamic path's losses and gradients."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.models.detection.roi_heads import project_masks_on_boxes
from torchvision.ops import box_iou

from lazytrain.config import LazyCall as L
from lazytrain.config import instantiate
from lazytrain.config.instantiate import InstantiationError
from lazytrain.modeling import FederatedLoss, FixedShapes, fixed_shapes
from lazytrain.modeling.fixed_shapes import _pad_masks, _proposals, check_model, pad_batch
from lazytrain.modeling.matching import PaddedBoxes, match_padded, pad_boxes
from lazytrain.modeling.roi_losses import box_regression_loss
from lazytrain.modeling.sampling import BalancedMaskSampler
from lazytrain.utils.host_syncs import HostSyncCounter
from tests.modeling.helpers import build_model, load_model_config, make_record

SIZE = 64
# Every RoI drawn (no random choice among them), so that both paths train on the same examples.
SMALL = (
    "model.rpn.pre_nms_top_n={training:150,testing:150}",
    "model.rpn.post_nms_top_n={training:100,testing:100}",
)
# Every RoI drawn (no random choice among them), so that both paths train on the same examples.
DRAW_ALL = (
    "model.num_classes=3",
    "model.roi_heads.batch_size_per_image=256",
    "model.roi_heads.positive_fraction=1.0",
    *SMALL,
)


def _records(step: int, count: int = 2, dtype: torch.dtype | None = None) -> list[dict]:
    """A batch of `count` images of different sizes (at most SIZE) and 0-2 instances."""
    records = []
    for index in range(count):
        seed = 10 * step + index
        height, width = SIZE - 8 * ((seed + 1) % 3), SIZE - 8 * (seed % 2)
        record = make_record(height, width, seed=seed)
        keep = seed % 3  # 0, 1 or 2 instances
        record["instances"] = {key: value[:keep] for key, value in record["instances"].items()}
        if dtype is not None:
            record["image"] = record["image"].to(dtype)
        records.append(record)
    return records


def _models(overrides: tuple[str, ...] = DRAW_ALL, max_instances: int = 4):
    torch.manual_seed(0)
    dynamic = build_model(overrides=overrides + (f"model.pad_to_sizes=[[{SIZE},{SIZE}]]",))
    fixed = copy.deepcopy(dynamic)
    fixed.fixed_shapes = FixedShapes([SIZE, SIZE], max_instances)
    return dynamic.train(), fixed.train()


def _losses_and_grads(model, records, seed: int = 1):
    torch.manual_seed(seed)
    model.zero_grad()
    losses = model(records)
    sum(losses.values()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads


DETECTRON2_RULES = tuple(
    f"+model.roi_heads.{pool}.{option}=true"
    for pool in ("box_roi_pool", "mask_roi_pool")
    for option in ("aligned", "epsilon_inside_log")
) + ("+model.rpn.strict_min_size=true",)


@pytest.mark.slow
@pytest.mark.parametrize("rules", [(), DETECTRON2_RULES], ids=["torchvision rules", "detectron2 rules"])
def test_losses_gradients_and_buffers_equal_the_dynamic_path(rules):
    """Slow (~25 s on 2 loaded cores each): two float64 training steps of the CPU recipe's model."""
    dynamic, fixed = _models(DRAW_ALL + rules)
    dynamic, fixed = dynamic.double(), fixed.double()
    records = _records(0, dtype=torch.float64) + _records(1, dtype=torch.float64)
    dynamic_losses, dynamic_grads = _losses_and_grads(dynamic, records)
    fixed_losses, fixed_grads = _losses_and_grads(fixed, records)
    assert fixed_losses.keys() == dynamic_losses.keys()
    for name, value in dynamic_losses.items():
        torch.testing.assert_close(fixed_losses[name], value, rtol=1e-10, atol=1e-12, msg=name)
    assert fixed_grads.keys() == dynamic_grads.keys()
    for name, grad in dynamic_grads.items():
        torch.testing.assert_close(fixed_grads[name], grad, rtol=1e-8, atol=1e-10, msg=name)
    for (name, buffer), (_, other) in zip(dynamic.named_buffers(), fixed.named_buffers()):
        torch.testing.assert_close(other, buffer, rtol=1e-10, atol=1e-12, msg=name)
    assert int(fixed.fixed_shape_counters.dropped_mask_positives) == 0
    assert int(fixed.fixed_shape_counters.nms_not_final) == 0


class _ShapeRecorder(TorchDispatchMode):
    """Every operator called, with the shapes and dtypes of its tensor arguments and results."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = tuple(
            (tuple(t.shape), t.dtype)
            for t in torch.utils._pytree.tree_leaves((args, kwargs, out))
            if isinstance(t, torch.Tensor)
        )
        self.calls.append((str(func), shapes))
        return out


@pytest.fixture(scope="module")
def five_steps():
    """Five training steps (forward, backward) of different batches at one padded size (batch 8): each step's
    operator shapes and its host syncs."""
    _, model = _models(overrides=("model.num_classes=1203", *SMALL), max_instances=3)
    model(_records(99, count=8))  # a first step
    steps = []
    for step in range(5):
        # The host pads the batch (pad_batch, sizes of the data); from there on every shape is fixed.
        batch = pad_batch(_records(step, count=8), model.fixed_shapes, torch.device("cpu"), True)
        model.zero_grad(set_to_none=True)
        with HostSyncCounter() as syncs, _ShapeRecorder() as recorder:
            losses, _ = model.fixed_step(batch)
            sum(losses.values()).backward()
        steps.append((recorder.calls, syncs.total, syncs.format_counts()))
    return steps


@pytest.mark.slow
def test_every_operator_has_the_same_shapes_at_every_step(five_steps):
    """Slow (~100 s on 2 loaded cores, shared with the next test): six steps at batch 8, 1203 classes,
    every operator recorded."""
    first = five_steps[0][0]
    assert len(first) > 500
    for calls, _, _ in five_steps[1:]:
        assert calls == first


@pytest.mark.slow
def test_no_host_syncs_at_batch_8_and_1203_classes(five_steps):
    """Slow: the steps of `five_steps` (see the test above)."""
    assert [(total, table) for _, total, table in five_steps] == [(0, "total 0")] * 5


@pytest.mark.slow
def test_fullgraph_compile_equals_eager():
    """Slow (~70 s): dynamo traces the whole step (aot_eager: no code generation)."""
    _, model = _models(max_instances=3)
    model = model.double()
    batch = pad_batch(_records(0, dtype=torch.float64), model.fixed_shapes, torch.device("cpu"), True)

    def step(function):
        torch.manual_seed(3)
        model.zero_grad()
        losses, counters = function(batch)
        sum(losses.values()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return {k: v.detach() for k, v in losses.items()}, grads, counters

    eager = step(model.fixed_step)
    compiled = step(torch.compile(model.fixed_step, fullgraph=True, backend="aot_eager", dynamic=False))
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(tuple(compiled[2]), tuple(eager[2]))


def test_proposals_equal_the_dynamic_selection():
    dynamic, _ = _models()
    rpn = dynamic.rpn
    torch.manual_seed(0)
    num_images, per_level = 2, [300, 200]
    centers = torch.rand(num_images, sum(per_level), 2) * SIZE
    sizes = torch.rand(num_images, sum(per_level), 2) * 24 + 1
    boxes = torch.cat((centers - sizes / 2, centers + sizes / 2), dim=2)
    objectness = torch.randn(num_images * sum(per_level), 1)
    image_sizes = [(SIZE, SIZE - 8), (SIZE - 16, SIZE)]
    expected_boxes, expected_scores = rpn.filter_proposals(boxes, objectness, image_sizes, per_level)
    proposals, valid, not_final = _proposals(rpn, boxes, objectness, torch.tensor(image_sizes), per_level)
    assert proposals.shape == (num_images, rpn.post_nms_top_n(), 4)
    assert int(not_final) == 0
    for image, expected in enumerate(expected_boxes):
        assert int(valid[image].sum()) == len(expected)
        torch.testing.assert_close(proposals[image, : len(expected)], expected, rtol=0, atol=0)


def test_matching_with_padded_ground_truth_equals_the_batch_padding():
    dynamic, _ = _models()
    matcher = dynamic.roi_heads.proposal_matcher
    torch.manual_seed(0)
    gt = [torch.tensor([[0.0, 0, 20, 20], [10, 10, 40, 30]]), torch.zeros((0, 4))]
    rois = pad_boxes([torch.rand(30, 2).repeat(1, 2) * 30 + torch.tensor([0, 0, 10, 10]) for _ in range(2)])
    expected = match_padded(matcher, pad_boxes(gt), rois)
    capacity = torch.zeros(2, 5, 4)
    capacity[0, :2] = gt[0]
    valid = torch.zeros(2, 5, dtype=torch.bool)
    valid[0, :2] = True
    assert torch.equal(match_padded(matcher, PaddedBoxes(capacity, valid), rois), expected)


def test_mask_targets_from_padded_masks_equal_the_unpadded_ones():
    torch.manual_seed(0)
    masks = (torch.rand(3, 40, 50) > 0.5).to(torch.uint8)
    boxes = torch.tensor([[30.0, 20, 50, 40], [0, 0, 50, 40], [45.5, 35.2, 49.9, 39.9]], dtype=torch.float64)
    matched = torch.tensor([0, 1, 2])
    expected = project_masks_on_boxes(masks, boxes, matched, 14)
    padded = project_masks_on_boxes(_pad_masks(masks, 64, 64), boxes, matched, 14)
    torch.testing.assert_close(padded, expected, rtol=0, atol=1e-12)


def test_mask_positives_beyond_the_capacity_are_subsampled_and_counted(monkeypatch):
    _, model = _models()
    records = _records(0) + _records(1)
    foreground = []
    mask_loss = fixed_shapes._mask_loss

    def recording_mask_loss(heads, features, samples, *args):
        foreground.append(samples.num_foreground.tolist())
        return mask_loss(heads, features, samples, *args)

    monkeypatch.setattr(fixed_shapes, "_mask_loss", recording_mask_loss)
    for capacity in (None, 1):
        model.fixed_shapes = FixedShapes([SIZE, SIZE], 4, mask_positives=capacity)
        model.fixed_shape_counters = None
        torch.manual_seed(1)
        losses = model(records)
        assert torch.isfinite(losses["loss_mask"])
    assert foreground[0] == foreground[1] and max(foreground[0]) > 1
    expected = sum(max(count - 1, 0) for count in foreground[1])
    assert int(model.fixed_shape_counters.dropped_mask_positives) == expected


def test_capacities_are_checked_with_the_key_to_raise():
    fixed = FixedShapes([SIZE, SIZE], 1)
    with pytest.raises(ValueError, match=r"model.fixed_shapes.max_instances=1.*at least 2"):
        pad_batch(_records(0) + _records(2), fixed, torch.device("cpu"), True)
    with pytest.raises(ValueError, match=r"model.fixed_shapes.image_size"):
        pad_batch([make_record(SIZE + 8, SIZE)], fixed, torch.device("cpu"), True)
    with pytest.raises(ValueError, match=r"model.fixed_shapes.max_instances"):
        FixedShapes([SIZE, SIZE], 0)


def test_parts_the_fixed_step_lacks_are_refused_before_the_run():
    _, model = _models()
    model.roi_heads.box_predictor.loss = FederatedLoss(3, [1.0, 1.0, 1.0])
    with pytest.raises(
        ValueError, match=r"model.fixed_shapes.*softmax cross-entropy.*model.fixed_shapes=null"
    ):
        check_model(model)


def test_sampling_at_fixed_shapes_draws_torchvision_counts_from_valid_rows_only():
    sampler = BalancedMaskSampler(8, 0.25)
    torch.manual_seed(0)
    # Image 0: 6 positives and 20 negatives in 30 rows; image 1: 1 positive, 3 negatives; -1: padding/ignored.
    labels = torch.full((2, 30), -1)
    labels[0, :6], labels[0, 6:26] = 1, 0
    labels[1, :1], labels[1, 1:4] = 2, 0
    positive, negative = sampler(labels)
    assert positive.sum(dim=1).tolist() == [2, 1] and negative.sum(dim=1).tolist() == [6, 3]
    assert not ((positive | negative) & (labels < 0)).any()


def test_masked_box_loss_with_padding_rows_equals_the_loss_of_the_real_rows():
    torch.manual_seed(0)
    deltas, targets = torch.randn(7, 4 * 4, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64)
    labels = torch.tensor([2, 0, 1, 3, 0, 0, 0])  # the last 3 rows: padding, labelled background
    expected = box_regression_loss(deltas[:4], labels[:4], targets[:4])
    padded = box_regression_loss(deltas, labels, targets, normalizer=torch.tensor(4))
    torch.testing.assert_close(padded, expected, rtol=1e-12, atol=0)


def test_the_recipe_key_builds_the_step_and_the_default_stays_dynamic():
    cfg = load_model_config(overrides=("model.num_classes=3",))
    assert instantiate(cfg.model).fixed_shapes is None
    cfg.model.fixed_shapes = L(FixedShapes)(image_size=[SIZE, SIZE], max_instances=4, mask_positives=16)
    model = instantiate(cfg.model)
    assert model.fixed_shapes == FixedShapes((SIZE, SIZE), 4, 16)
    cfg.model.roi_heads.box_predictor.loss = L(FederatedLoss)(num_classes=3, class_image_counts=[1, 1, 1])
    with pytest.raises(InstantiationError, match=r"model.fixed_shapes"):
        instantiate(cfg.model)


def test_an_image_size_off_the_padding_multiple_is_refused_with_the_rounded_size():
    """1333 // 334 = 3: the anchors' P2 stride would be 3 instead of 4, leaving out the bottom and right."""
    cfg = load_model_config(overrides=("model.num_classes=3",))
    cfg.model.fixed_shapes = L(FixedShapes)(image_size=[1333, 1024], max_instances=4)
    with pytest.raises(
        InstantiationError,
        match=r"model.fixed_shapes.image_size=\[1333, 1024\].*size_divisible=32.*\[1344, 1024\]",
    ):
        instantiate(cfg.model)
    # The size a too large image asks for is a multiple too (ResizeShortestEdge's max_size 1333).
    with pytest.raises(ValueError, match=r"at least \[1344, 1024\]"):
        FixedShapes([1024, 1024], 4).check_image_size(1333, 1000)
    with pytest.raises(ValueError, match=r"at least \[1088, 1024\]"):
        FixedShapes([1024, 1024], 4).check_image_size(1060, 1000, size_divisible=64)


def test_unsettled_nms_keeps_no_box_that_greedy_nms_suppresses():
    """A chain of 60 boxes, each 1.5 px right of the last (IoU 0.86 with the next, 0.74 with the one after):
    16 greedy steps do not settle; the even iterate kept 44 boxes with 69 overlapping pairs."""
    dynamic, _ = _models()
    rpn = dynamic.rpn
    count = 60
    x = torch.arange(count, dtype=torch.float32) * 1.5
    boxes = torch.stack((x, torch.zeros(count), x + 20, torch.full((count,), 20.0)), dim=1)[None]
    objectness = torch.linspace(5, 1, count)[:, None]  # greedy order = chain order
    image_sizes = [(64, 128)]
    expected, _ = rpn.filter_proposals(boxes, objectness, image_sizes, [count])
    proposals, valid, not_final = _proposals(rpn, boxes, objectness, torch.tensor(image_sizes), [count])
    assert int(not_final) == 1
    kept = proposals[0][valid[0]]
    overlaps = box_iou(kept, kept).fill_diagonal_(0)
    assert int((overlaps > rpn.nms_thresh).sum()) == 0
    # A subset of greedy NMS's survivors, in its order.
    assert 0 < len(kept) <= len(expected[0]) == 20
    positions = [int((expected[0] == box).all(dim=1).nonzero()) for box in kept]
    assert positions == sorted(positions)


def test_unknown_extent_is_warned_once_before_the_run(caplog):
    fixed = FixedShapes([SIZE, SIZE], 4)
    with caplog.at_level(logging.WARNING, logger="lazytrain.modeling.fixed_shapes"):
        fixed.check_data(3, "a.jpg", [SIZE, SIZE])
        assert not caplog.records
        fixed.check_data(3, "a.jpg", None)
    (record,) = caplog.records
    assert "model.fixed_shapes.image_size" in record.getMessage()
    assert "could not be checked before the run" in record.getMessage()
    assert "max_instances" not in record.getMessage()


def test_empty_boxes_are_left_out_and_not_counted_against_max_instances():
    record = make_record(SIZE, SIZE, seed=3)
    instances = record["instances"]
    instances["boxes"] = torch.as_tensor(instances["boxes"]).clone()
    instances["boxes"][0, 2] = instances["boxes"][0, 0]  # zero width, as a crop leaves it
    batch = pad_batch([record], FixedShapes([SIZE, SIZE], 1), torch.device("cpu"), True)
    assert batch.valid.tolist() == [[True]]
    assert torch.equal(batch.boxes[0, 0], instances["boxes"][1])
    assert int(batch.labels[0, 0]) == int(instances["classes"][1]) + 1
    assert torch.equal(batch.masks[0, 0], _pad_masks(torch.as_tensor(instances["masks"])[1:], SIZE, SIZE)[0])


def test_rows_without_area_between_others_keep_the_order_and_leave_zeros_even_for_a_nan_box():
    record, other = make_record(SIZE, SIZE, seed=3), make_record(SIZE, SIZE, seed=4)
    instances = {
        key: torch.cat([record["instances"][key], other["instances"][key]]) for key in record["instances"]
    }
    boxes = instances["boxes"].clone()
    boxes[0] = float("nan")  # no area: the dynamic path drops it too
    boxes[2, 3] = boxes[2, 1]  # zero height
    record["instances"] = {**instances, "boxes": boxes}
    batch = pad_batch([record], FixedShapes([SIZE, SIZE], 4), torch.device("cpu"), True)
    assert batch.valid[0].tolist() == [True, True, False, False]
    assert torch.equal(batch.boxes[0, :2], boxes[[1, 3]])
    assert torch.equal(batch.boxes[0, 2:], torch.zeros(2, 4))  # zeros, not NaN
    assert batch.labels[0].tolist() == [
        int(instances["classes"][1]) + 1,
        int(instances["classes"][3]) + 1,
        0,
        0,
    ]
    assert torch.equal(batch.masks[0, :2], _pad_masks(instances["masks"][[1, 3]], SIZE, SIZE))
    assert int(batch.masks[0, 2:].sum()) == 0
