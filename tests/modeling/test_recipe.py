import math

import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from lazytrain.config import LazyConfig, find_problems, instantiate
from tests.modeling.helpers import CPU_RECIPE, R50_RECIPE, build_model, load_model_config, make_record


@pytest.fixture(scope="module")
def r50_model():
    """The full recipe's model, built once: the structure test reads it, the step test only adds gradients."""
    return build_model(R50_RECIPE, overrides=())


def test_full_recipe_builds_resnet50_fpn_with_torchvision_defaults(r50_model):
    model = r50_model
    assert model.num_classes == 80
    assert model.backbone.out_channels == 256
    assert isinstance(model.backbone.body.bn1, FrozenBatchNorm2d)
    assert model.roi_heads.box_head.fc6.in_features == 256 * 7 * 7
    assert model.roi_heads.box_predictor.cls_score.out_features == 81
    assert model.roi_heads.mask_predictor.mask_fcn_logits.out_channels == 81
    assert model.roi_heads.detections_per_img == 100 and model.roi_heads.score_thresh == 0.05
    assert [len(s) for s in model.rpn.anchor_generator.sizes] == [1] * 5
    trainable = {name.split(".")[0] for name, p in model.backbone.body.named_parameters() if p.requires_grad}
    assert trainable == {"layer2", "layer3", "layer4"}


def test_full_recipe_forward_backward_step(r50_model):
    model = r50_model.train()
    losses = model([make_record(64, 96)])
    total = sum(losses.values())
    assert math.isfinite(float(total.detach()))
    total.backward()
    assert model.roi_heads.box_predictor.cls_score.weight.grad is not None


def test_overrides_reach_the_modules():
    cfg = load_model_config(
        CPU_RECIPE,
        (
            "model.num_classes=1203",
            "model.roi_heads.detections_per_img=300",
            "model.roi_heads.score_thresh=0.0001",
            "model.rpn.anchor_generator.sizes=[8,16,32,64,128]",
            "model.rpn.pre_nms_top_n.testing=123",
            "model.backbone.out_channels=32",
            "model.pixel_mean=[1,2,3]",
        ),
    )
    model = instantiate(cfg.model)
    assert model.roi_heads.detections_per_img == 300 and model.roi_heads.score_thresh == 0.0001
    assert model.roi_heads.box_predictor.cls_score.out_features == 1204
    assert model.roi_heads.mask_predictor.mask_fcn_logits.out_channels == 1204
    assert [list(s) for s in model.rpn.anchor_generator.sizes] == [[8], [16], [32], [64], [128]]
    assert model.rpn._pre_nms_top_n["testing"] == 123
    # The FPN width follows into the RPN head, box head and mask head through interpolation.
    assert model.rpn.head.conv[0][0].in_channels == 32
    assert model.roi_heads.box_head.fc6.in_features == 32 * 7 * 7
    assert model.transform.image_mean == [1.0, 2.0, 3.0]


def test_cpu_recipe_is_the_narrow_model():
    model = build_model()
    assert model.backbone.out_channels == 64
    assert isinstance(model.backbone.body.layer1[0].bn1, torch.nn.BatchNorm2d)
    assert all(p.requires_grad for p in model.parameters())
    assert model.roi_heads.box_head.fc7.out_features == 256
    assert sum(p.numel() for p in model.parameters()) < 14_000_000


def test_recipe_survives_save_and_load(tmp_path):
    cfg = load_model_config(CPU_RECIPE, ("model.num_classes=7",))
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    reloaded = LazyConfig.load(str(tmp_path / "config.yaml"))
    assert instantiate(reloaded.model).num_classes == 7


def test_cpu_model_overfits_two_images_and_evaluates():
    torch.manual_seed(0)
    model = build_model()
    records = [make_record(128, 128, seed=0), make_record(96, 128, seed=1)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    totals = []
    for _ in range(10):  # the loss falls to ~0.4 of its start by step 10 and then levels off
        losses = model(records)
        total = sum(losses.values())
        assert all(math.isfinite(float(v.detach())) for v in losses.values())
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(float(total.detach()))
    assert sum(totals[-3:]) / 3 < 0.7 * sum(totals[:3]) / 3, totals
    model.eval()
    model.roi_heads.score_thresh = 0.0
    with torch.inference_mode():
        outputs = model(records)
    for record, output in zip(records, outputs):
        instances = output["instances"]
        assert set(instances) == {"boxes", "scores", "classes", "masks"}
        assert instances["masks"].shape[1:] == (record["height"], record["width"])


def test_recipes_validate_without_building():
    for recipe in (CPU_RECIPE, R50_RECIPE):
        assert find_problems(LazyConfig.load(recipe)) == []


def test_dropping_the_mask_branch_gives_faster_rcnn():
    model = build_model(
        overrides=(
            "model.num_classes=3",
            "~model.roi_heads.mask_roi_pool",
            "~model.roi_heads.mask_head",
            "~model.roi_heads.mask_predictor",
        )
    )
    assert not model.roi_heads.has_mask()
    record = make_record(64, 96)
    del record["instances"]["masks"]
    model.train()
    assert "loss_mask" not in model([record])
    model.eval()
    model.roi_heads.score_thresh = 0.0
    with torch.inference_mode():
        (output,) = model([record])
    assert set(output["instances"]) == {"boxes", "scores", "classes"}
