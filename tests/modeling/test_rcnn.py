import math

import pytest
import torch
from torchvision.models.detection import maskrcnn_resnet50_fpn

from lazytrain.modeling import RCNN, NoResizeTransform
from tests.modeling.helpers import build_model, make_record


@pytest.fixture(scope="module")
def cpu_model():
    torch.manual_seed(0)
    return build_model()


def _capture(model):
    """Record the tensor the backbone receives and the image sizes the RPN is told about."""
    seen = {}
    handles = [
        model.backbone.register_forward_pre_hook(
            lambda m, args: seen.update(backbone=args[0].detach().clone())
        ),
        model.rpn.register_forward_pre_hook(lambda m, args: seen.update(sizes=list(args[0].image_sizes))),
    ]
    return seen, handles


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_backbone_sees_the_mapper_size(cpu_model, training):
    record = make_record(100, 70)  # non-square, not a multiple of 32
    seen, handles = _capture(cpu_model)
    try:
        cpu_model.train(training)
        with torch.inference_mode(not training):
            cpu_model([record])
    finally:
        for handle in handles:
            handle.remove()
    assert seen["sizes"] == [(100, 70)]
    assert tuple(seen["backbone"].shape) == (1, 3, 128, 96)  # padded to multiples of 32, not resized


def test_pixels_are_normalised_on_the_0_255_scale(cpu_model):
    mean, std = cpu_model.transform.image_mean, cpu_model.transform.image_std
    image = torch.stack([torch.full((64, 64), round(m)) for m in mean]).to(torch.uint8)
    seen, handles = _capture(cpu_model)
    try:
        cpu_model.eval()
        with torch.inference_mode():
            cpu_model([{"image": image}])
    finally:
        for handle in handles:
            handle.remove()
    expected = torch.tensor([(round(m) - m) / s for m, s in zip(mean, std)])
    assert torch.allclose(seen["backbone"][0, :, 5, 5], expected, atol=1e-5)
    assert isinstance(cpu_model.transform, NoResizeTransform)


def test_eval_outputs_are_in_the_original_size(cpu_model):
    cpu_model.eval()
    cpu_model.roi_heads.score_thresh = 0.0  # an untrained model must still return some detections
    records = [
        make_record(96, 128, seed=1, original_scale=1.5),
        make_record(80, 64, seed=2, original_scale=0.5),
    ]
    with torch.inference_mode():
        outputs = cpu_model(records)
    cpu_model.roi_heads.score_thresh = 0.05
    for record, output in zip(records, outputs):
        instances = output["instances"]
        n = len(instances["scores"])
        assert n > 0
        assert instances["boxes"].shape == (n, 4) and instances["classes"].dtype == torch.int64
        assert instances["masks"].shape == (n, record["height"], record["width"])
        assert instances["masks"].dtype == torch.uint8 and set(instances["masks"].unique().tolist()) <= {0, 1}
        assert int(instances["classes"].min()) >= 0 and int(instances["classes"].max()) < 3
        assert float(instances["boxes"][:, 2].max()) <= record["width"]
        assert float(instances["boxes"][:, 3].max()) <= record["height"]


def test_boxes_and_masks_are_rescaled(cpu_model, monkeypatch):
    # Fix the detector's output (in mapper coordinates) to check the rescaling alone.
    detection = {
        "boxes": torch.tensor([[10.0, 20.0, 30.0, 40.0]]),
        "labels": torch.tensor([2]),
        "scores": torch.tensor([0.9]),
        "masks": torch.ones(1, 1, 28, 28),
    }
    monkeypatch.setattr(cpu_model.roi_heads, "forward", lambda *args, **kwargs: ([dict(detection)], {}))
    cpu_model.eval()
    with torch.inference_mode():
        (output,) = cpu_model(
            [{"image": torch.zeros(3, 50, 100, dtype=torch.uint8), "height": 100, "width": 300}]
        )
    instances = output["instances"]
    assert instances["boxes"].tolist() == [[30.0, 40.0, 90.0, 80.0]]
    assert instances["classes"].tolist() == [1]
    mask = instances["masks"][0]
    assert mask.shape == (100, 300)
    ys, xs = torch.nonzero(mask, as_tuple=True)
    assert abs(int(xs.min()) - 30) <= 1 and abs(int(xs.max()) - 89) <= 1
    assert abs(int(ys.min()) - 40) <= 1 and abs(int(ys.max()) - 79) <= 1


def test_training_returns_finite_losses_and_drops_degenerate_boxes(cpu_model):
    cpu_model.train()
    record = make_record(96, 128)
    record["instances"]["boxes"] = torch.cat(
        [record["instances"]["boxes"], torch.tensor([[5.0, 5.0, 5.0, 9.0]])]
    )
    record["instances"]["classes"] = torch.cat([record["instances"]["classes"], torch.tensor([0])])
    record["instances"]["masks"] = torch.cat(
        [record["instances"]["masks"], torch.zeros(1, 96, 128, dtype=torch.uint8)]
    )
    empty = make_record(64, 64, seed=3)
    empty["instances"] = {
        "boxes": torch.zeros(0, 4),
        "classes": torch.zeros(0, dtype=torch.int64),
        "masks": torch.zeros(0, 64, 64, dtype=torch.uint8),
    }
    losses = cpu_model([record, empty])
    assert set(losses) == {
        "loss_classifier",
        "loss_box_reg",
        "loss_mask",
        "loss_objectness",
        "loss_rpn_box_reg",
    }
    assert all(math.isfinite(float(v.detach())) for v in losses.values())
    sum(losses.values()).backward()


def test_training_without_instances_or_masks_is_an_error(cpu_model):
    cpu_model.train()
    record = make_record(64, 64)
    with pytest.raises(ValueError, match="training inputs need 'instances'"):
        cpu_model([{"image": record["image"]}])
    del record["instances"]["masks"]
    with pytest.raises(ValueError, match="has a mask head but 'instances' has no 'masks'"):
        cpu_model([record])


def test_from_torchvision_wraps_a_torchvision_model():
    # 10 detections, not 100: the mask head and the pasting run on each, and 10 show the same path.
    torchvision_model = maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, box_detections_per_img=10
    )
    model = RCNN.from_torchvision(torchvision_model)
    assert model.num_classes == 4
    assert model.roi_heads is torchvision_model.roi_heads
    assert model.transform.image_mean == pytest.approx([0.485 * 255, 0.456 * 255, 0.406 * 255])
    assert set(model.state_dict()) == set(torchvision_model.state_dict())
    model.eval()
    with torch.inference_mode():
        (output,) = model([{"image": torch.zeros(3, 64, 96, dtype=torch.uint8), "height": 32, "width": 48}])
    assert output["instances"]["masks"].shape[1:] == (32, 48)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            ("model.roi_heads.box_predictor.num_classes=4",),
            r"RCNN\(num_classes=3\) disagrees",
            id="num-classes",
        ),
        pytest.param(
            ("model.roi_heads.mask_predictor.num_classes=4",), "mask_predictor predicts 4", id="mask-classes"
        ),
        pytest.param(
            ("model.rpn.anchor_generator.sizes=[16,32,64,128]",), "returns 5 feature maps", id="levels"
        ),
        pytest.param(("model.rpn.head.num_anchors=2",), "rpn.head predicts 2", id="anchors"),
        pytest.param(
            ("model.backbone.returned_layers=[2,3,4]", "model.rpn.anchor_generator.sizes=[32,64,128,256]"),
            r"refers to \['3'\]",
            id="pool-names",
        ),
        pytest.param(("model.pixel_std=[1,0,1]",), r"pixel_std=\) must be 3", id="std"),
    ],
)
def test_inconsistent_configs_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model(overrides=("model.num_classes=3", *overrides))


def test_channels_last_model_matches_the_contiguous_one():
    torch.manual_seed(0)
    fast = build_model()  # the CPU recipe: channels-last, dense RoIAlign in training
    plain = build_model(overrides=("model.num_classes=3", "model.channels_last=false"))
    plain.load_state_dict(fast.state_dict())  # checkpoints move between the two layouts
    conv = fast.backbone.body.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert plain.backbone.body.conv1.weight.is_contiguous()
    records = [make_record(96, 128, seed=1), make_record(96, 128, seed=2)]
    losses = {}
    for name, model in (("fast", fast), ("plain", plain)):
        model.train()
        torch.manual_seed(1)  # the same proposal and ROI sampling
        loss = model(records)
        sum(loss.values()).backward()
        losses[name] = {key: value.item() for key, value in loss.items()}
    for key, value in losses["plain"].items():
        assert math.isclose(losses["fast"][key], value, rel_tol=1e-3, abs_tol=1e-5), (key, losses)
    # The backbone alone (no proposal sampling to reorder), in float64 so rounding cannot hide a real
    # difference: same gradients.
    images = torch.stack([record["image"] for record in records]).double()
    grads = []
    for model in (fast, plain):
        model.double().zero_grad()
        features = model.backbone(images.contiguous(memory_format=model.memory_format))
        sum(feature.square().mean() for feature in features.values()).backward()
        grads.append(model.backbone.body.conv1.weight.grad)
    assert (grads[0] - grads[1]).norm() <= 1e-9 * grads[1].norm()


def test_channels_last_by_default_follows_the_device():
    model = build_model(overrides=("model.num_classes=3", "model.channels_last=null"))
    assert model.memory_format == torch.contiguous_format and model.backbone.body.conv1.weight.is_contiguous()
    model.to("meta")  # any device but the CPU, as a GPU would be
    assert model.memory_format == torch.channels_last
    convolutions = [p for p in model.parameters() if p.dim() == 4]
    assert convolutions and all(p.is_contiguous(memory_format=torch.channels_last) for p in convolutions)
    assert model.transform.pixel_mean.device.type == "meta"  # the normalisation constants moved too
    pinned = build_model(overrides=("model.num_classes=3", "model.channels_last=false")).to("meta")
    assert (
        pinned.memory_format == torch.contiguous_format and pinned.backbone.body.conv1.weight.is_contiguous()
    )
