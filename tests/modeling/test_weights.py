import pytest
import torch
from torchvision.models import resnet18
from torchvision.models.detection import maskrcnn_resnet50_fpn

from lazytrain.errors import ConfigError
from lazytrain.modeling.weights import load_init_weights, prefetch_init_weights
from tests.modeling.helpers import R50_RECIPE, build_model, log_messages


def _save(state, path):
    torch.save(state, path)
    return str(path)


def test_torchvision_mask_rcnn_weights_load_key_for_key_except_the_predictors(tmp_path):
    # COCO weights come as a torchvision state dict with 91 classes; the LVIS model has 1203.
    coco = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91)
    path = _save(coco.state_dict(), tmp_path / "maskrcnn_coco.pth")
    model = build_model(R50_RECIPE, overrides=("model.num_classes=1203",))
    report = load_init_weights(model, path)
    assert report.source == "torchvision detection state dict"
    assert report.missing == [] and report.unexpected == []
    assert {key for key, _, _ in report.shape_mismatched} == {
        "roi_heads.box_predictor.cls_score.weight",
        "roi_heads.box_predictor.cls_score.bias",
        "roi_heads.box_predictor.bbox_pred.weight",
        "roi_heads.box_predictor.bbox_pred.bias",
        "roi_heads.mask_predictor.mask_fcn_logits.weight",
        "roi_heads.mask_predictor.mask_fcn_logits.bias",
    }
    own = model.state_dict()
    for key in (
        "backbone.body.layer3.2.conv2.weight",
        "rpn.head.cls_logits.weight",
        "roi_heads.mask_head.0.0.weight",
    ):
        assert torch.equal(own[key], coco.state_dict()[key])
    assert report.reinitialised == [
        "roi_heads.box_predictor.cls_score",
        "roi_heads.box_predictor.bbox_pred",
        "roi_heads.mask_predictor.mask_fcn_logits",
    ]
    text = str(report)
    assert (
        "roi_heads.box_predictor.cls_score.weight: (91, 1024) in the file, (1204, 1024) in the model" in text
    )


def test_imagenet_resnet_loads_into_the_backbone_body(tmp_path):
    classifier = resnet18(weights=None)
    path = _save(classifier.state_dict(), tmp_path / "resnet18_imagenet.pth")
    model = build_model()
    report = load_init_weights(model, path)
    assert report.source.startswith("ImageNet ResNet state dict, loaded into backbone.body.")
    assert (
        report.ignored == ["fc.weight", "fc.bias"]
        and report.unexpected == []
        and report.shape_mismatched == []
    )
    assert all(key.startswith("backbone.body.") for key in report.loaded)
    assert not any(key.startswith("backbone.body.") for key in report.missing)
    assert torch.equal(model.backbone.body.layer1[0].conv1.weight, classifier.layer1[0].conv1.weight)
    assert torch.equal(model.backbone.body.bn1.running_var, classifier.bn1.running_var)
    assert "missing in file (kept at init): backbone.fpn" in str(report)


def test_lazytrain_checkpoint_restores_everything(tmp_path):
    source = build_model()
    path = _save(
        {"model": source.state_dict(), "iteration": 7, "optimizer": {}}, tmp_path / "model_0000007.pth"
    )
    target = build_model()
    report = load_init_weights(target, path)
    assert report.source == "lazytrain checkpoint"
    assert report.missing == report.unexpected == report.shape_mismatched == []
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_ddp_prefix_is_removed(tmp_path):
    source = build_model()
    path = _save({f"module.{k}": v for k, v in source.state_dict().items()}, tmp_path / "ddp.pth")
    assert load_init_weights(build_model(), path).missing == []


def test_imagenet_weights_need_a_resnet(tmp_path):
    path = _save(resnet18(weights=None).state_dict(), tmp_path / "r18.pth")
    with pytest.raises(ValueError, match="the model has no ResNet trunk"):
        load_init_weights(torch.nn.Linear(2, 2), path)


def test_fine_tuning_with_another_class_count_reinitialises_the_predictors_and_says_so(tmp_path):
    # A lazytrain checkpoint trained on 3 classes starts a 5-class model: everything loads but the
    # class-dependent layers, which keep the new model's initialisation, and the log names them.
    source = build_model(overrides=("model.num_classes=3",))
    path = _save({"model": source.state_dict(), "iteration": 9}, tmp_path / "model_final.pth")
    target = build_model(overrides=("model.num_classes=5",))
    fresh = {key: value.clone() for key, value in target.state_dict().items()}
    with log_messages("lazytrain.modeling.weights") as messages:
        report = load_init_weights(target, path)
    reinitialised = [
        "roi_heads.box_predictor.cls_score",
        "roi_heads.box_predictor.bbox_pred",
        "roi_heads.mask_predictor.mask_fcn_logits",
    ]
    assert report.reinitialised == reinitialised
    assert report.missing == report.unexpected == []
    (message,) = messages
    lines = message.splitlines()
    assert (
        lines[0]
        == f"init weights from {path} (lazytrain checkpoint): {len(fresh) - 6} of {len(fresh)} model tensors loaded"
    )
    assert lines[1] == (
        "  re-initialised (shape differs from the file's, e.g. another number of classes): "
        + ", ".join(reinitialised)
    )
    assert (
        "    roi_heads.box_predictor.cls_score.weight: (4, 256) in the file, (6, 256) in the model" in lines
    )
    for key, value in target.state_dict().items():
        expected = fresh[key] if key.rpartition(".")[0] in reinitialised else source.state_dict()[key]
        assert torch.equal(value, expected), key


def test_weights_named_by_url_are_downloaded_once_and_loaded(file_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    classifier = resnet18(weights=None)
    url = file_server.add_weights(classifier.state_dict(), "resnet18")
    name = url.rsplit("/", 1)[1]
    for _ in range(2):
        model = build_model()
        report = load_init_weights(model, url)
        assert report.path == url
        assert report.source == "ImageNet ResNet state dict, loaded into backbone.body."
        assert torch.equal(model.backbone.body.layer4[1].conv2.weight, classifier.layer4[1].conv2.weight)
    assert file_server.requests == {f"/{name}": 1}
    assert prefetch_init_weights(url) == str(tmp_path / "torch" / "hub" / "checkpoints" / name)
    assert prefetch_init_weights("/data/weights.pth") == "/data/weights.pth"  # local paths go through


def test_missing_file_and_unreachable_url_name_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    missing = str(tmp_path / "nope.pth")
    with pytest.raises(FileNotFoundError, match=f"init checkpoint not found: {missing}"):
        load_init_weights(build_model(), missing)
    url = (
        "http://127.0.0.1:9/weights/model_final-0123abcd.pth"  # the discard port: connection refused at once
    )
    cache = tmp_path / "torch" / "hub" / "checkpoints" / "model_final-0123abcd.pth"
    with pytest.raises(ConfigError) as error:
        load_init_weights(build_model(), url)
    assert str(error.value).startswith(f"train.init_checkpoint={url}: could not download it (")
    assert f"copy the file to {cache} " in str(error.value)


def test_files_needing_unpickling_are_refused_unless_allowed(tmp_path):
    source = build_model()
    path = _save({"model": source.state_dict(), "extra": _Opaque()}, tmp_path / "unsafe.pth")
    with pytest.raises(ValueError, match="needs arbitrary unpickling"):
        load_init_weights(build_model(), path)
    assert load_init_weights(build_model(), path, allow_unsafe=True).missing == []


class _Opaque:
    pass
