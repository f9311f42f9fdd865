"""lazytrain's RoIHeads: torchvision's results with softmax CE, the loss's own scores otherwise, and every
loss training the CPU Mask R-CNN."""

import copy
import math

import pytest
import torch
from pytest import param
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler
from torchvision.models.detection.faster_rcnn import TwoMLPHead
from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.roi_heads import RoIHeads as TorchvisionRoIHeads
from torchvision.ops import MultiScaleRoIAlign

from lazytrain.config import LazyCall as L
from lazytrain.config import instantiate
from lazytrain.modeling import (
    RCNN,
    BoxPredictor,
    EQLv2Loss,
    FederatedLoss,
    MaskPredictor,
    RoIHeads,
    SeesawLoss,
    SoftmaxCrossEntropy,
    roi_heads,
)
from lazytrain.modeling.sampling import BalancedMaskSampler
from lazytrain.utils.host_syncs import TO_HOST, HostSyncCounter
from tests.modeling.helpers import build_model, load_model_config, make_record

NUM_CLASSES = 3
CHANNELS = 8
IMAGE_SHAPES = [(128, 128), (128, 96)]


def _heads(branch: str, predictor: torch.nn.Module | None = None, heads_class: type = RoIHeads, **options):
    """Small RoI heads on one stride-4 feature map; `branch` adds a mask or keypoint branch."""
    branches = {}
    if branch == "masks":
        branches = dict(
            mask_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),
            mask_head=MaskRCNNHeads(CHANNELS, [CHANNELS], 1),
            mask_predictor=MaskPredictor(CHANNELS, CHANNELS, NUM_CLASSES),
        )
    elif branch == "keypoints":
        branches = dict(
            keypoint_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),
            keypoint_head=KeypointRCNNHeads(CHANNELS, [CHANNELS]),
            keypoint_predictor=KeypointRCNNPredictor(CHANNELS, 3),
        )
    return heads_class(
        MultiScaleRoIAlign(["0"], 7, 2),
        TwoMLPHead(CHANNELS * 49, 32),
        predictor or BoxPredictor(32, NUM_CLASSES),
        fg_iou_thresh=0.5, bg_iou_thresh=0.5, batch_size_per_image=32, positive_fraction=0.25,
        bbox_reg_weights=None, score_thresh=0.01, nms_thresh=0.5, detections_per_img=20, **branches, **options,
    )  # fmt: skip


def _with_torchvision_sampler(heads: RoIHeads) -> RoIHeads:
    """`heads` drawing its training RoIs with torchvision's sampler (its random draws, its RoI order)."""
    sampler = heads.fg_bg_sampler
    heads.fg_bg_sampler = BalancedPositiveNegativeSampler(
        sampler.batch_size_per_image, sampler.positive_fraction
    )
    return heads


def _as_torchvision(heads: RoIHeads) -> TorchvisionRoIHeads:
    """torchvision's RoIHeads with copies of `heads`' modules and settings, and torchvision's sampler."""
    tv = _with_torchvision_sampler(copy.deepcopy(heads))
    tv.__class__ = TorchvisionRoIHeads  # same attributes, torchvision's forward
    return tv


def _inputs(branch: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    features = {"0": torch.randn(2, CHANNELS, 32, 32, generator=generator)}
    proposals, targets = [], []
    for height, width in IMAGE_SHAPES:
        corner = torch.rand(40, 2, generator=generator) * torch.tensor([width * 0.7, height * 0.7])
        size = 8 + torch.rand(40, 2, generator=generator) * 40
        proposals.append(torch.cat([corner, corner + size], 1))
        boxes = torch.tensor([[10.0, 12.0, 50.0, 60.0], [40.0, 30.0, 90.0, 100.0], [5.0, 70.0, 45.0, 120.0]])
        target = {"boxes": boxes, "labels": torch.tensor([1, 3, 2])}
        if branch == "masks":
            target["masks"] = torch.zeros(3, height, width, dtype=torch.uint8)
            for mask, (x0, y0, x1, y1) in zip(target["masks"], boxes.int().tolist()):
                mask[y0:y1, x0:x1] = 1
        if branch == "keypoints":
            centres = (boxes[:, :2] + boxes[:, 2:]) / 2
            points = torch.stack([boxes[:, :2] + 4, centres, boxes[:, 2:] - 4], 1)
            target["keypoints"] = torch.cat([points, torch.ones(3, 3, 1)], 2)
        targets.append(target)
    return features, proposals, targets


@pytest.mark.parametrize("branch", ["boxes", "masks", "keypoints"])
def test_softmax_ce_heads_give_torchvisions_losses_gradients_and_detections(branch):
    torch.manual_seed(0)
    ours = _with_torchvision_sampler(_heads(branch))
    theirs = _as_torchvision(ours)
    features, proposals, targets = _inputs(branch)
    losses = {}
    for name, heads in (("ours", ours), ("theirs", theirs)):
        heads.train()
        torch.manual_seed(1)  # the same RoI sampling
        _, loss = heads(features, proposals, IMAGE_SHAPES, targets)
        sum(loss.values()).backward()
        losses[name] = loss
    assert set(losses["ours"]) == set(losses["theirs"]) and len(losses["ours"]) == (
        2 if branch == "boxes" else 3
    )
    # The mask branch computes one class's logits per RoI (a dot product) where torchvision computes all
    # (a 1x1 convolution): the same sums in another order, so equal up to float rounding.
    # The box loss sums zeros for the background RoIs where torchvision leaves them out: rounding too.
    for key, value in losses["ours"].items():
        _same_up_to_rounding(value, losses["theirs"][key], key)
        assert value.item() > 0
    for (name, ours_p), theirs_p in zip(ours.named_parameters(), theirs.parameters()):
        _same_up_to_rounding(ours_p.grad, theirs_p.grad, name)
    detections = {}
    for name, heads in (("ours", ours), ("theirs", theirs)):
        heads.eval()
        with torch.no_grad():
            detections[name], _ = heads(features, proposals, IMAGE_SHAPES)
    assert sum(len(d["boxes"]) for d in detections["ours"]) > 10
    for mine, reference in zip(detections["ours"], detections["theirs"]):
        assert (
            set(mine)
            == set(reference)
            == {"boxes", "labels", "scores"}
            | {"masks": {"masks"}, "keypoints": {"keypoints", "keypoints_scores"}}.get(branch, set())
        )
        for key in mine:  # inference: the same detections, only the masks' logits summed in another order
            (_same_up_to_rounding if key == "masks" else _identical)(mine[key], reference[key], key)


def _identical(value, expected, name):
    assert torch.equal(value, expected), name


def _same_up_to_rounding(value, expected, name):
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-7, msg=name)


def _postprocess(loss, logits):
    heads = _heads("boxes", BoxPredictor(32, NUM_CLASSES, loss=loss)).eval()
    heads.score_thresh = 0.0
    box = torch.tensor([[10.0, 10.0, 50.0, 50.0]])
    boxes, scores, labels = heads.postprocess_detections(
        logits, torch.zeros(1, 4 * (NUM_CLASSES + 1)), [box], [(64, 64)]
    )
    assert torch.allclose(boxes[0], box.expand(NUM_CLASSES, 4))
    return scores[0], labels[0]


def test_detections_are_scored_with_the_losses_activation():
    logits = torch.tensor([[0.5, 1.0, 3.0, -2.0]])
    scores, labels = _postprocess(SoftmaxCrossEntropy(), logits)
    assert labels.tolist() == [2, 1, 3]
    assert torch.allclose(scores, torch.softmax(logits, 1)[0, [2, 1, 3]])
    scores, labels = _postprocess(FederatedLoss(NUM_CLASSES, [1, 1, 1]), logits)
    assert labels.tolist() == [2, 1, 3]
    assert scores.tolist() == pytest.approx([1 / (1 + math.exp(-v)) for v in (3.0, 1.0, -2.0)], rel=1e-6)
    scores, _ = _postprocess(EQLv2Loss(NUM_CLASSES), logits)
    not_background = 1 - 1 / (1 + math.exp(-0.5))
    assert scores.tolist() == pytest.approx(
        [not_background / (1 + math.exp(-v)) for v in (3, 1, -2)], rel=1e-6
    )
    scores, _ = _postprocess(SeesawLoss(NUM_CLASSES), logits)
    softmax = [math.exp(v) / (math.exp(1) + math.exp(3) + math.exp(-2)) for v in (3, 1, -2)]
    assert scores.tolist() == pytest.approx([not_background * s for s in softmax], rel=1e-6)


def test_heads_train_with_the_predictors_loss():
    torch.manual_seed(0)
    heads = _heads("boxes", BoxPredictor(32, NUM_CLASSES, loss=EQLv2Loss(NUM_CLASSES))).train()
    features, proposals, targets = _inputs("boxes")
    _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
    eqlv2 = heads.box_predictor.loss
    assert heads.get_classification_loss() is eqlv2
    # 32 RoIs per image, 25% of them foreground at most: the accumulated positive gradient says so.
    assert 0 < float(eqlv2.pos_grad.sum()) < float(eqlv2.neg_grad.sum())
    assert losses["loss_classifier"].item() > 1.0  # sigmoid CE over K+1 columns, not torchvision's softmax


def test_rcnn_refuses_a_loss_that_torchvisions_heads_would_ignore():
    heads = _heads("boxes", BoxPredictor(32, NUM_CLASSES, loss=SeesawLoss(NUM_CLASSES)), TorchvisionRoIHeads)
    model = build_model()
    with pytest.raises(
        ValueError, match=r"box_predictor.loss is SeesawLoss, but roi_heads is torchvision\.models"
    ):
        RCNN(model.backbone, model.rpn, heads, num_classes=NUM_CLASSES)
    heads.box_predictor = BoxPredictor(32, NUM_CLASSES)  # softmax CE: torchvision's heads are fine
    RCNN(model.backbone, model.rpn, heads, num_classes=NUM_CLASSES)


def test_recipe_model_matches_torchvisions_heads_in_training_and_eval():
    torch.manual_seed(0)
    model = build_model()
    assert type(model.roi_heads) is RoIHeads
    reference = copy.deepcopy(model)
    reference.roi_heads.__class__ = TorchvisionRoIHeads
    for detector in (model, reference):
        _with_torchvision_sampler(detector.roi_heads)
    records = [make_record(96, 128, seed=1), make_record(64, 64, seed=2)]
    outputs = []
    for detector in (model, reference):
        detector.train()
        torch.manual_seed(1)
        losses = detector(records)
        detector.eval()
        detector.roi_heads.score_thresh = 0.0
        with torch.no_grad():
            outputs.append((losses, detector(records)))
    (losses, detections), (reference_losses, reference_detections) = outputs
    assert set(losses) == set(reference_losses)
    for key, value in losses.items():  # the mask loss from one class's logits: equal up to rounding
        torch.testing.assert_close(value, reference_losses[key], rtol=1e-5, atol=0, msg=key)
    assert len(detections[0]["instances"]["scores"]) > 0
    for mine, theirs in zip(detections, reference_detections):
        for key, value in mine["instances"].items():
            if key == "masks":  # a probability within rounding of the threshold may land either side
                assert (value != theirs["instances"][key]).float().mean() < 1e-4
            else:
                assert torch.equal(value, theirs["instances"][key]), key


LOSS_CONFIGS = {
    "ce": L(SoftmaxCrossEntropy)(),
    "fed": L(FederatedLoss)(
        num_classes="${..num_classes}", class_image_counts=[30, 5, 1], num_sampled_classes=2
    ),
    "eqlv2": L(EQLv2Loss)(num_classes="${..num_classes}"),
    "seesaw": L(SeesawLoss)(num_classes="${..num_classes}"),
}


@pytest.mark.parametrize(
    ("loss", "predictor"),
    [*((name, "linear") for name in LOSS_CONFIGS), ("ce", "cosine"), ("fed", "cosine")],
)
def test_cpu_mask_rcnn_trains_three_steps_with_each_loss(loss, predictor):
    cfg = load_model_config(overrides=("model.num_classes=3",))
    cfg.model.roi_heads.box_predictor.loss = copy.deepcopy(LOSS_CONFIGS[loss])
    if predictor == "cosine":
        cfg.model.roi_heads.box_predictor._target_ = "lazytrain.modeling.CosineBoxPredictor"
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    records = [make_record(64, 64, seed=0), make_record(64, 64, seed=1)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    history = []
    for _ in range(3):
        losses = model(records)
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()
        history.append({key: value.item() for key, value in losses.items()})
    classifier = [step["loss_classifier"] for step in history]
    assert all(math.isfinite(value) for step in history for value in step.values()), history
    assert classifier[0] > 0 and len(set(classifier)) == 3, classifier
    state = model.state_dict()
    buffers = {key for key in state if ".loss." in key}
    expected = {"eqlv2": {"pos_grad", "neg_grad"}, "seesaw": {"class_counts"}}
    assert {key.rsplit(".", 1)[1] for key in buffers} == expected.get(loss, set())
    assert all(float(state[key].sum()) > 0 for key in buffers)
    restored = instantiate(cfg.model)
    restored.load_state_dict(state)
    for key in buffers:
        assert torch.equal(restored.state_dict()[key], state[key])


@pytest.mark.parametrize("channels_last", [param(False, id="nchw"), param(True, id="channels-last")])
def test_mask_predictor_for_given_classes_equals_that_channel_of_all_classes(channels_last):
    # LVIS-sized: 1203 classes; the predictor's weights non-trivial (the init's small std hides errors).
    torch.manual_seed(0)
    predictor = MaskPredictor(16, 8, 1203).double()
    for parameter in predictor.parameters():
        torch.nn.init.normal_(parameter)
    features = torch.randn(10, 16, 14, 14, dtype=torch.float64)
    if channels_last:
        predictor = predictor.to(memory_format=torch.channels_last)
        features = features.contiguous(memory_format=torch.channels_last)
    classes = torch.tensor([0, 1, 1203, 7, 7, 600, 3, 1202, 1, 500])
    selected = predictor(features, classes)
    assert selected.shape == (10, 1, 28, 28)
    full = predictor(features)
    expected = full[torch.arange(10), classes][:, None]
    torch.testing.assert_close(selected, expected, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(selected.shape, dtype=torch.float64)
    got = torch.autograd.grad(selected, list(predictor.parameters()), upstream)
    wanted = torch.autograd.grad(expected, list(predictor.parameters()), upstream)
    for (name, _), grad, reference in zip(predictor.named_parameters(), got, wanted):
        torch.testing.assert_close(grad, reference, rtol=1e-12, atol=1e-12, msg=name)
    assert predictor(features[:0], classes[:0]).shape == (0, 1, 28, 28)


def test_mask_branch_with_torchvisions_predictor_computes_every_class():

    torch.manual_seed(0)
    ours = _heads("masks")
    ours.mask_predictor = MaskRCNNPredictor(CHANNELS, CHANNELS, NUM_CLASSES + 1)
    theirs = _as_torchvision(ours)
    features, proposals, targets = _inputs("masks")
    losses = []
    for heads in (ours, theirs):
        torch.manual_seed(1)
        losses.append(heads.train()(features, proposals, IMAGE_SHAPES, targets)[1]["loss_mask"])
    assert torch.equal(losses[0], losses[1]) and losses[0].item() > 0


def test_mask_loss_under_bf16_autocast_stays_close_to_fp32():
    torch.manual_seed(0)
    heads = _heads("masks").train()
    features, proposals, targets = _inputs("masks")
    losses = []
    for enabled in (False, True):
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            losses.append(heads(features, proposals, IMAGE_SHAPES, targets)[1]["loss_mask"])
    assert losses[1].dtype == torch.float32
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=2e-2)


def test_under_autocast_the_pooled_maps_are_cast_once_with_the_same_results():
    torch.manual_seed(0)
    heads = _heads("masks").train()
    features, proposals, targets = _inputs("masks")
    features = {name: value.bfloat16().requires_grad_() for name, value in features.items()}
    results = []
    for cast_once in (True, False):
        if not cast_once:  # today's behaviour: each roi_align call casts its map under autocast
            heads._pooled_maps_in_float32 = lambda maps: maps
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
        grads = torch.autograd.grad(sum(losses.values()), [features["0"], *heads.parameters()])
        results.append((losses, grads))
    (losses, grads), (expected_losses, expected_grads) = results
    assert losses.keys() == expected_losses.keys()
    for key, value in losses.items():
        assert torch.equal(value, expected_losses[key]), key
    for grad, expected in zip(grads[1:], expected_grads[1:]):
        assert torch.equal(grad, expected)
    # The map's gradient: the two poolers' float32 gradients summed before the one cast back to bfloat16,
    # where autocast rounded each to bfloat16 first.
    assert grads[0].dtype == torch.bfloat16 and grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], expected_grads[0], rtol=1e-2, atol=1e-2 * grads[0].abs().max())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        maps = RoIHeads._pooled_maps_in_float32(heads, {"0": features["0"], "other": features["0"]})
    assert maps["0"].dtype == torch.float32 and maps["other"].dtype == torch.bfloat16


def test_cpu_model_trains_under_bf16_autocast_with_the_dense_roi_align():
    # On the CPU the poolers take the dense RoIAlign in training; under autocast they get float32 maps
    # (`_pooled_maps_in_float32`) and compute their products in bfloat16.
    torch.manual_seed(0)
    model = build_model().train()
    records = [make_record(96, 128, seed=1), make_record(64, 64, seed=2)]
    losses = []
    for enabled in (False, True):
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            losses.append(model(records))
    sum(losses[1].values()).backward()
    for key, value in losses[1].items():
        assert value.item() == pytest.approx(losses[0][key].item(), rel=0.1), key


@pytest.mark.parametrize("branch", ["masks", "keypoints"])
def test_mask_sampler_keeps_torchvisions_losses_when_every_roi_is_drawn(branch):
    # With room for every RoI and no cap on positives both samplers draw all of them: the losses then differ
    # only by the order of the RoIs (foreground first here), so up to float rounding.
    torch.manual_seed(0)
    ours = _heads(branch)
    ours.fg_bg_sampler.batch_size_per_image = 10_000
    ours.fg_bg_sampler.positive_fraction = 1.0
    theirs = _as_torchvision(ours)
    theirs.fg_bg_sampler.batch_size_per_image = 10_000
    theirs.fg_bg_sampler.positive_fraction = 1.0
    features, proposals, targets = _inputs(branch)
    losses = [heads.train()(features, proposals, IMAGE_SHAPES, targets)[1] for heads in (ours, theirs)]
    assert losses[0].keys() == losses[1].keys() and len(losses[0]) == 3
    for key, value in losses[0].items():
        torch.testing.assert_close(value, losses[1][key], rtol=1e-5, atol=0, msg=key)
        assert value.item() > 0


def test_mask_sampler_draws_torchvisions_counts_with_one_host_read():
    torch.manual_seed(0)
    heads = _heads("masks").train()
    assert isinstance(heads.fg_bg_sampler, BalancedMaskSampler)
    features, proposals, targets = _inputs("masks")
    with HostSyncCounter() as counter:
        samples = heads.select_training_samples(proposals, targets)
    assert dict(counter.counts) == {TO_HOST: 1}
    for labels, count in zip(samples.labels, samples.num_foreground):
        # 40 proposals + 3 ground-truth boxes: 32 drawn, at most 8 (25%) foreground, which come first.
        assert len(labels) == 32 and 0 < count <= 8
        assert bool((labels[:count] > 0).all()) and bool((labels[count:] == 0).all())
    boxes, matched = roi_heads._foreground(samples)
    assert [len(b) for b in boxes] == samples.num_foreground
    # The box regression targets are the encoded matched ground-truth boxes.
    for image, (target, index) in enumerate(zip(targets, samples.matched_idxs)):
        encoded = heads.box_coder.encode_single(target["boxes"][index], samples.proposals[image])
        torch.testing.assert_close(samples.regression_targets[image], encoded)


def test_detections_per_class_limits_each_class_per_image_and_none_changes_nothing():
    """``detections_per_class`` (AP-fixed's per-class top-k): at most k of each class per image, the best-scored
    of that class; None gives exactly the detections without it."""
    features, proposals, _ = _inputs("boxes")
    torch.manual_seed(0)
    heads = _heads("boxes").eval()
    heads.score_thresh, heads.detections_per_img = 0.0, 200
    with torch.no_grad():
        unlimited, _ = heads(features, proposals, IMAGE_SHAPES)
        heads.detections_per_class = 2
        limited, _ = heads(features, proposals, IMAGE_SHAPES)
    for full, few in zip(unlimited, limited):
        for label in full["labels"].unique().tolist():
            expected = full["scores"][full["labels"] == label].sort(descending=True).values[:2]
            got = few["scores"][few["labels"] == label].sort(descending=True).values
            assert torch.equal(got, expected), label
        assert len(few["labels"]) < len(full["labels"])
    with pytest.raises(ValueError, match=r"model\.roi_heads\.detections_per_class.*>= 1.*got 0"):
        _heads("boxes", detections_per_class=0)
