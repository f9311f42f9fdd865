"""CascadeRoIHeads: stage targets at their IoU thresholds, training with every classification loss, inference
scores averaged over the stages, checkpoints, and the cascade demo model (training, TorchScript export)."""

import copy
import math
import os
from unittest import mock

import pytest
import torch
from pytest import param
from torchvision.models.detection.faster_rcnn import TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads
from torchvision.ops import clip_boxes_to_image

from lazytrain.config import LazyConfig, instantiate
from lazytrain.modeling import (
    BoxPredictor,
    CascadeRoIHeads,
    EQLv2Loss,
    ExportableRCNN,
    FederatedLoss,
    MaskPredictor,
    MultiScaleRoIAlign,
    SeesawLoss,
    SoftmaxCrossEntropy,
    cascade_roi_heads,
    check_parity,
    export_torchscript,
    load_torchscript,
)
from lazytrain.modeling.box_coding import BoxCoder
from tests.modeling.helpers import make_record

NUM_CLASSES = 3
CHANNELS = 8
IMAGE_SHAPES = [(128, 128), (128, 96)]
DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "conf", "cascade_maskrcnn_demo.py")

LOSSES = {
    "ce": lambda: SoftmaxCrossEntropy(),
    "fed": lambda: FederatedLoss(NUM_CLASSES, class_image_counts=[30, 5, 1], num_sampled_classes=2),
    "eqlv2": lambda: EQLv2Loss(NUM_CLASSES),
    "seesaw": lambda: SeesawLoss(NUM_CLASSES),
}


def _heads(loss: str = "ce", **settings) -> CascadeRoIHeads:
    """Small cascade heads with a mask branch on one stride-4 map; each stage its own `loss`."""
    settings = {"batch_size_per_image": 32, "score_thresh": 0.01, "detections_per_img": 20, **settings}
    return CascadeRoIHeads(
        MultiScaleRoIAlign(["0"], 7, 2),
        [TwoMLPHead(CHANNELS * 49, 32) for _ in range(3)],
        [BoxPredictor(32, NUM_CLASSES, LOSSES[loss](), cls_agnostic_bbox_reg=True) for _ in range(3)],
        mask_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),
        mask_head=MaskRCNNHeads(CHANNELS, [CHANNELS], 1),
        mask_predictor=MaskPredictor(CHANNELS, CHANNELS, NUM_CLASSES),
        **settings,
    )


def _inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    features = {"0": torch.randn(2, CHANNELS, 32, 32, generator=generator)}
    proposals, targets = [], []
    boxes = torch.tensor([[10.0, 12.0, 50.0, 60.0], [40.0, 30.0, 90.0, 100.0], [5.0, 70.0, 45.0, 120.0]])
    for height, width in IMAGE_SHAPES:
        corner = torch.rand(40, 2, generator=generator) * torch.tensor([width * 0.7, height * 0.7])
        size = 8 + torch.rand(40, 2, generator=generator) * 40
        proposals.append(torch.cat([corner, corner + size], 1))
        masks = torch.zeros(3, height, width, dtype=torch.uint8)
        for mask, (x0, y0, x1, y1) in zip(masks, boxes.int().tolist()):
            mask[y0:y1, x0:x1] = 1
        targets.append({"boxes": boxes, "labels": torch.tensor([1, 3, 2]), "masks": masks})
    return features, proposals, targets


# One ground-truth box (class 2) and RoIs of IoU 0.75, 0.65, 0.55, 0.45 and 0 with it (same x extent, so the
# IoU is the height ratio).
GT_BOX = torch.tensor([[0.0, 0.0, 100.0, 100.0]])
HAND_MADE = torch.tensor(
    [[0.0, 0.0, 100.0, 75.0], [0.0, 0.0, 100.0, 65.0], [0.0, 0.0, 100.0, 55.0], [0.0, 0.0, 100.0, 45.0]]
    + [[110.0, 110.0, 120.0, 120.0]]
)
HAND_MADE_IOU = [0.75, 0.65, 0.55, 0.45, 0.0]


@pytest.mark.parametrize(("stage", "threshold"), [(1, 0.6), (2, 0.7)])
def test_later_stages_relabel_hand_made_boxes_at_their_iou(stage, threshold):
    heads = _heads()
    targets = [
        {"boxes": GT_BOX, "labels": torch.tensor([2])},
        {"boxes": GT_BOX[:0], "labels": GT_BOX[:0, 0].long()},
    ]
    labels, regression_targets = heads.label_proposals(stage, [HAND_MADE, HAND_MADE], targets)
    expected = [2 if iou >= threshold else 0 for iou in HAND_MADE_IOU]
    assert labels[0].tolist() == expected
    assert labels[1].tolist() == [0] * 5  # no ground truth: all background
    weights = [(20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0)][stage - 1]
    torch.testing.assert_close(
        regression_targets[0], BoxCoder(weights).encode_single(GT_BOX.expand(5, 4), HAND_MADE)
    )
    # By hand, the 0.75 RoI at stage 2: centres 50 vs 37.5 over height 75, heights 100 vs 75.
    if stage == 2:
        expected_deltas = torch.tensor([0.0, 30 * 12.5 / 75, 0.0, 15 * math.log(100 / 75)])
        torch.testing.assert_close(regression_targets[0][0], expected_deltas)


def test_first_stage_samples_at_iou_half_with_the_ground_truth_added():
    heads = _heads(batch_size_per_image=64, positive_fraction=1.0)
    target = {
        "boxes": GT_BOX,
        "labels": torch.tensor([2]),
        "masks": torch.ones(1, 128, 128, dtype=torch.uint8),
    }
    samples = heads.select_training_samples([HAND_MADE], [target])
    drawn = {tuple(box.tolist()): int(label) for box, label in zip(samples.proposals[0], samples.labels[0])}
    expected = {tuple(box.tolist()): 2 if iou >= 0.5 else 0 for box, iou in zip(HAND_MADE, HAND_MADE_IOU)}
    assert drawn == {**expected, tuple(GT_BOX[0].tolist()): 2}
    assert heads.box_coder.weights == (10.0, 10.0, 5.0, 5.0)
    assert [matcher.high_threshold for matcher in heads.stage_matchers] == [0.5, 0.6, 0.7]


@pytest.mark.parametrize("loss", list(LOSSES))
def test_each_classification_loss_trains_a_step_with_its_own_state_per_stage(loss):
    torch.manual_seed(0)
    heads = _heads(loss).train()
    features, proposals, targets = _inputs()
    features["0"].requires_grad_(True)
    _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
    stage_keys = {f"loss_{name}_stage{k}" for name in ("classifier", "box_reg") for k in range(3)}
    assert set(losses) == stage_keys | {"loss_mask"}
    assert all(math.isfinite(value.item()) for value in losses.values()), losses
    sum(losses.values()).backward()
    assert features["0"].grad.abs().sum() > 0
    state = heads.state_dict()
    buffer = {"eqlv2": "pos_grad", "seesaw": "class_counts"}.get(loss)
    if buffer is not None:  # box_predictor.<stage>.loss.<buffer>: the stages saw different labels
        first, last = (state[f"box_predictor.{stage}.loss.{buffer}"] for stage in (0, 2))
        assert first.sum() > 0 and not torch.equal(first, last)


def test_losses_are_finite_and_decrease_over_a_few_steps():
    torch.manual_seed(0)
    heads = _heads().train()
    features, proposals, targets = _inputs()
    optimizer = torch.optim.SGD(heads.parameters(), lr=0.02, momentum=0.9)
    totals = []
    for _ in range(6):
        _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
        total = sum(losses.values())
        assert all(math.isfinite(value.item()) for value in losses.values()), losses
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(total.item())
    assert totals[-1] < totals[0], totals


@pytest.mark.parametrize("loss", ["ce", "eqlv2"])  # softmax and sigmoid scores
def test_inference_scores_are_the_mean_of_the_stages_scores(loss):
    torch.manual_seed(0)
    heads = _heads(loss, score_thresh=0.0, nms_thresh=1.0, detections_per_img=1000).eval()
    for predictor in heads.box_predictor:  # zero deltas: every stage sees the same RoIs
        torch.nn.init.normal_(predictor.cls_score.weight, std=0.5)
        torch.nn.init.zeros_(predictor.bbox_pred.weight)
        torch.nn.init.zeros_(predictor.bbox_pred.bias)
    features, proposals, _ = _inputs()
    # Inside the image, so that clipping the regressed boxes leaves them as they are.
    proposals = [clip_boxes_to_image(p[:5], shape) for p, shape in zip(proposals, IMAGE_SHAPES)]
    with torch.no_grad():
        result, _ = heads(features, proposals, IMAGE_SHAPES)
        pooled = heads.box_roi_pool(features, proposals, IMAGE_SHAPES)
        stage_scores = [
            predictor.loss.scores(predictor(head(pooled))[0])
            for head, predictor in zip(heads.box_head, heads.box_predictor)
        ]
    expected = (stage_scores[0] + stage_scores[1] + stage_scores[2]) / 3
    for detections, image_scores in zip(result, expected.split(5)):
        foreground = image_scores[:, 1:]
        assert len(detections["scores"]) == foreground.numel()
        torch.testing.assert_close(detections["scores"].sort().values, foreground.flatten().sort().values)
        # each detection's score is its class's column
        assert all(
            float(foreground[:, c - 1].sub(s).abs().min()) < 1e-5
            for s, c in zip(detections["scores"], detections["labels"])
        )


def test_checkpoint_round_trip_restores_the_stages_and_their_loss_state(tmp_path):
    torch.manual_seed(0)
    heads = _heads("eqlv2").train()
    features, proposals, targets = _inputs()
    _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
    sum(losses.values()).backward()
    torch.save(heads.state_dict(), tmp_path / "heads.pth")
    torch.manual_seed(1)
    restored = _heads("eqlv2")
    restored.load_state_dict(torch.load(tmp_path / "heads.pth", weights_only=True))
    for key, value in heads.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key
    heads.eval(), restored.eval()
    with torch.no_grad():
        mine, theirs = (
            heads(features, proposals, IMAGE_SHAPES)[0],
            restored(features, proposals, IMAGE_SHAPES)[0],
        )
    for a, b in zip(mine, theirs):
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_a_stateful_loss_shared_by_stages_is_refused():
    loss = EQLv2Loss(NUM_CLASSES)
    with pytest.raises(ValueError, match=r"stages 0 and 1 share one EQLv2Loss.*copy.deepcopy"):
        CascadeRoIHeads(
            MultiScaleRoIAlign(["0"], 7, 2),
            [TwoMLPHead(CHANNELS * 49, 32) for _ in range(3)],
            [BoxPredictor(32, NUM_CLASSES, loss, cls_agnostic_bbox_reg=True) for _ in range(3)],
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        param(
            {"class_specific": True},
            r"stage 0: BoxPredictor regresses 16 deltas.*cls_agnostic_bbox_reg=True",
            id="class-specific",
        ),
        param(
            {"stage_iou_thresholds": [0.5, 0.6]},
            r"one entry per stage.*'stage_iou_thresholds': 2",
            id="stage-count",
        ),
        param(
            {"stage_bbox_reg_weights": [[10, 10, 5]] * 3},
            r"needs 4 weights .* stage 0 has \[10, 10, 5\]",
            id="weights",
        ),
    ],
)
def test_wrong_stage_settings_are_refused(change, message):
    change = dict(change)
    agnostic = not change.pop("class_specific", False)
    with pytest.raises(ValueError, match=message):
        CascadeRoIHeads(
            MultiScaleRoIAlign(["0"], 7, 2),
            [TwoMLPHead(CHANNELS * 49, 32) for _ in range(3)],
            [BoxPredictor(32, NUM_CLASSES, cls_agnostic_bbox_reg=agnostic) for _ in range(3)],
            **change,
        )


def test_demo_config_builds_a_cascade_whose_stages_have_their_own_loss():
    cfg = LazyConfig.load(DEMO)
    LazyConfig.apply_overrides(cfg, ["losses.use=seesaw", "model.num_classes=3"])
    model = instantiate(cfg.model)
    predictors = list(model.roi_heads.box_predictor)
    assert isinstance(model.roi_heads, CascadeRoIHeads) and len(predictors) == 3
    assert [type(p.loss) for p in predictors] == [SeesawLoss] * 3
    assert len({id(p.loss) for p in predictors}) == 3
    assert model.roi_heads.score_thresh == cfg.model.roi_heads.score_thresh == 0.001
    model.train()
    losses = model([make_record(64, 64, seed=0), make_record(64, 64, seed=1)])
    assert all(math.isfinite(v.item()) for v in losses.values()) and "loss_classifier_stage2" in losses
    model.eval()
    with torch.no_grad():
        (output,) = model([make_record(64, 64, seed=2)])
    assert set(output["instances"]) == {"boxes", "scores", "classes", "masks"}
    state = copy.deepcopy(model.state_dict())
    assert {"roi_heads.box_predictor.2.loss.class_counts", "roi_heads.box_head.2.fc7.weight"} <= set(state)


def test_cascade_model_exports_to_torchscript_with_the_eager_detections(tmp_path):
    cfg = LazyConfig.load(DEMO)
    LazyConfig.apply_overrides(cfg, ["model.num_classes=3", "model.roi_heads.detections_per_img=20"])
    model = instantiate(cfg.model).eval()
    images = [make_record(64, 64, seed=seed)["image"] for seed in (0, 1)]
    exported = load_torchscript(export_torchscript(model, images[0], str(tmp_path / "model.pt")))
    report = check_parity(ExportableRCNN(model), exported, images)
    assert report.num_detections > 0 and report.num_unmatched == 0


def test_each_stage_sends_a_third_of_its_gradient_into_the_shared_features():
    torch.manual_seed(0)
    heads = _heads().train()
    features, proposals, targets = _inputs()
    features["0"].requires_grad_(True)
    torch.manual_seed(1)  # the same RoIs sampled both times
    _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
    losses["loss_classifier_stage1"].backward()
    scaled = features["0"].grad.clone()
    # The same stage's loss with the scale taken out: three times the gradient.
    features["0"].grad = None
    torch.manual_seed(1)
    with mock.patch.object(cascade_roi_heads._ScaleGradient, "apply", lambda tensor, scale: tensor):
        _, losses = heads(features, proposals, IMAGE_SHAPES, targets)
    losses["loss_classifier_stage1"].backward()
    torch.testing.assert_close(scaled * 3, features["0"].grad)
