"""`Predictor` and ``python -m lazytrain predict`` on a tiny demo run (2 iterations on a 12-image data set)."""

import argparse
import json
import os
import pickle
import shutil
import socket

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from lazytrain.config import LazyConfig, instantiate
from lazytrain.data.mappers import read_image
from lazytrain.program.entrypoint import main as lazytrain_main
from lazytrain.program.predictor import Predictor, to_image_tensor
from lazytrain.program.run_command import without_initial_weights
from tests.modeling.helpers import needs_torch_export
from tests.modeling.test_detectron2_weights import _detectron2_checkpoint
from tests.program.conftest import REPO, SMALLER_MODEL
from tests.scripts.loading import load_script
from tests.smoke import smoke_overrides


def _val_images(demo_run) -> list[dict]:
    root = os.path.join(demo_run["datasets"], "synthetic_lt")
    images = json.load(open(os.path.join(root, "lvis_v1_val.json")))["images"]
    return [{**image, "path": os.path.join(root, image["file_name"])} for image in images]


def test_predictions_equal_the_evaluators_detections(in_run_datasets):
    run_dir = in_run_datasets["dir"]
    evaluated = json.load(open(os.path.join(run_dir, "lvis_instances_results.json")))
    assert evaluated, "the tiny run must detect something for this test to mean anything"
    predictor = Predictor.from_run(run_dir, device="cpu")
    assert predictor.batch_size == 2  # the run's dataloader.test.batch_size: the same batches as evaluation
    images = _val_images(in_run_datasets)
    predictions = predictor([image["path"] for image in images])
    predicted = [e for image, p in zip(images, predictions) for e in p.to_coco(image["id"])]
    key = lambda e: (e["image_id"], -e["score"], e["category_id"], e["bbox"])  # noqa: E731
    assert sorted(predicted, key=key) == sorted(evaluated, key=key)


def test_boxes_and_masks_come_back_in_the_original_image_coordinates(in_run_datasets):
    predictor = Predictor.from_run(
        in_run_datasets["dir"], device="cpu", overrides=["model.roi_heads.score_thresh=0.0"]
    )
    original = to_image_tensor(_val_images(in_run_datasets)[0]["path"])
    image = torch.nn.functional.interpolate(original[None].float(), size=(60, 150), mode="bilinear")
    image = image.round().to(torch.uint8)[0]  # 150x60: the test mapper resizes it to 128x51
    prediction = predictor(image)
    assert (prediction.height, prediction.width) == (60, 150)
    assert prediction.masks.shape == (len(prediction), 60, 150) and len(prediction) == 20
    mapped = predictor.mapper.map_image(image)
    assert tuple(mapped.shape[1:]) == (51, 128)
    with torch.inference_mode():  # the same image at the model's input size, not scaled back
        small = predictor.model([{"image": mapped}])[0]["instances"]
    scale = torch.tensor([150 / 128, 60 / 51, 150 / 128, 60 / 51])
    expected = (small["boxes"] * scale).clamp(min=0)
    expected[:, 0::2] = expected[:, 0::2].clamp(max=150)
    expected[:, 1::2] = expected[:, 1::2].clamp(max=60)
    torch.testing.assert_close(prediction.boxes, expected)
    torch.testing.assert_close(prediction.scores, small["scores"])
    assert prediction.class_names == [predictor.categories.names[c] for c in small["classes"].tolist()]


def test_every_image_form_gives_the_same_prediction(in_run_datasets):
    predictor = Predictor.from_run(
        in_run_datasets["dir"], device="cpu", overrides=["model.roi_heads.score_thresh=0.0"], batch_size=1
    )
    path = _val_images(in_run_datasets)[1]["path"]
    array = read_image(path)
    forms = [path, Image.open(path), array, torch.from_numpy(array).permute(2, 0, 1)]
    predictions = predictor(forms)
    assert isinstance(predictions, list) and len(predictions) == 4
    for prediction in predictions[1:]:
        torch.testing.assert_close(prediction.boxes, predictions[0].boxes)
        assert torch.equal(prediction.masks, predictions[0].masks)
    single = predictor(path)
    assert not isinstance(single, list) and torch.equal(single.classes, predictions[0].classes)
    assert set(single.category_ids) <= set(predictor.categories.ids)


def test_bad_images_and_runs_without_weights_are_named(in_run_datasets, tmp_path):
    predictor = Predictor.from_run(in_run_datasets["dir"], device="cpu")
    with pytest.raises(ValueError, match=r"uint8 \[3, H, W\].*float32.*round\(\)"):
        predictor(torch.rand(3, 20, 20))
    with pytest.raises(ValueError, match=r"numpy images must be uint8 \[H, W, 3\]"):
        predictor(np.zeros((20, 20), dtype=np.uint8))
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        predictor(str(tmp_path / "missing.jpg"))
    unweighted = tmp_path / "unweighted"
    unweighted.mkdir()
    shutil.copy(os.path.join(in_run_datasets["dir"], "config.yaml"), unweighted / "config.yaml")
    with pytest.raises(
        FileNotFoundError, match=r"unweighted has no weights .*name a file with checkpoint=PATH"
    ):
        Predictor.from_run(unweighted)
    with pytest.raises(FileNotFoundError, match=r"config.yaml not found"):
        Predictor.from_run(tmp_path)
    named = Predictor.from_run(in_run_datasets["dir"], checkpoint="model_final.pth", device="cpu")
    assert named.categories == predictor.categories


def test_a_run_trained_with_ema_predicts_with_the_ema_weights(in_run_datasets, tmp_path):
    run_dir = tmp_path / "ema_run"
    run_dir.mkdir()
    for name in ("config.yaml", "categories.json"):
        shutil.copy(os.path.join(in_run_datasets["dir"], name), run_dir / name)
    saved = torch.load(os.path.join(in_run_datasets["dir"], "model_final.pth"), weights_only=True)
    # A checkpoint of train.ema.enabled=true: "model" is the average, "training_model" the trained weights.
    trained = saved["model"]
    average = {k: v * 0.5 if v.is_floating_point() else v for k, v in trained.items()}
    ema = {"updates": 2, "decay": 0.5, "tau": 0.0}
    torch.save(
        {**saved, "model": average, "training_model": trained, "ema": ema}, run_dir / "model_final.pth"
    )
    predictor = Predictor.from_run(run_dir, device="cpu")
    state = predictor.model.state_dict()
    assert all(torch.equal(state[name], value) for name, value in average.items())


def test_a_run_predicts_with_its_class_names_where_its_data_set_is_missing(
    in_run_datasets, tmp_path, monkeypatch
):
    saved = json.load(open(os.path.join(in_run_datasets["dir"], "categories.json")))
    val = json.load(open(os.path.join(in_run_datasets["datasets"], "synthetic_lt", "lvis_v1_val.json")))
    assert saved == [
        {"id": c["id"], "name": c["name"]} for c in sorted(val["categories"], key=lambda c: c["id"])
    ]
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path / "elsewhere"))
    predictor = Predictor.from_run(in_run_datasets["dir"], device="cpu")
    assert predictor.categories.names == [c["name"] for c in saved]
    assert predictor.categories.ids == [c["id"] for c in saved]
    assert not (tmp_path / "elsewhere").exists()  # nothing generated or read


def _predict(*argv) -> None:
    lazytrain_main(["predict", *map(str, argv)])


def test_predict_command_writes_coco_results_and_drawn_images(in_run_datasets, tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    images = _val_images(in_run_datasets)
    for image in images[:3]:
        shutil.copy(image["path"], folder / os.path.basename(image["path"]))
    (folder / "broken.png").write_bytes(b"not a picture")
    (folder / "notes.txt").write_text("not an image: ignored")
    out = tmp_path / "out"
    _predict(in_run_datasets["dir"], folder, images[3]["path"], "predict.draw=true", "model.roi_heads.score_thresh=0.0",
             "model.roi_heads.detections_per_img=5", f"predict.output_dir={out}")  # fmt: skip
    printed = capsys.readouterr().out
    assert "Predicted 4 images (20 detections)" in printed and "Skipped 1 unreadable images" in printed
    assert "broken.png" in printed
    listing = json.load(open(out / "images.json"))
    assert [os.path.basename(i["file_name"]) for i in listing["images"]] == sorted(
        os.path.basename(i["path"]) for i in images[:3]
    ) + [os.path.basename(images[3]["path"])]
    json_ids = {c["id"] for c in json.load(open(os.path.join(in_run_datasets["datasets"], "synthetic_lt",
                                                              "lvis_v1_val.json")))["categories"]}  # fmt: skip
    assert {c["id"] for c in listing["categories"]} == json_ids
    results = json.load(open(out / "results.json"))
    assert len(results) == 20 and {r["image_id"] for r in results} == {0, 1, 2, 3}
    assert {r["category_id"] for r in results} <= json_ids
    assert all(set(r) == {"image_id", "category_id", "bbox", "score", "segmentation"} for r in results)
    drawn = sorted(os.listdir(out / "drawn"))
    assert len(drawn) == 4
    picture = np.asarray(Image.open(out / "drawn" / drawn[0]))
    source = read_image(str(folder / drawn[0].replace(".png", ".jpg")))
    assert picture.shape == source.shape and picture.std() > 5
    assert (picture != source).any(axis=2).mean() > 0.01  # boxes, masks and labels were drawn on it


def test_predict_command_refuses_bad_input_with_one_line(in_run_datasets, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    image = _val_images(in_run_datasets)[0]["path"]
    cases = [
        ([in_run_datasets["dir"], empty], "no images in folder"),
        ([in_run_datasets["dir"], tmp_path / "nope.jpg"], "nope.jpg does not exist"),
        ([tmp_path, image], "config.yaml not found"),
        ([in_run_datasets["dir"], image, "predict.on_bad_image=maybe"], "must be skip or stop"),
        ([in_run_datasets["dir"], image, "predict.no_such_key=1"], "no_such_key"),
        (
            [in_run_datasets["dir"], image, "predict.score_thresh=0.3"],
            "predict.score_thresh is model.roi_heads.score_thresh (one key for predict, evaluation and export); "
            "write model.roi_heads.score_thresh=0.3",
        ),
        ([in_run_datasets["dir"], image, "predict.max_dets=5"], "write model.roi_heads.detections_per_img=5"),
        ([in_run_datasets["dir"]], "at least one image"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            _predict(*argv)
        assert exit_info.value.code == 1
        assert message in capsys.readouterr().err, argv
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.jpg").write_bytes(b"\x00")
    with pytest.raises(SystemExit):
        _predict(
            in_run_datasets["dir"], bad, "predict.on_bad_image=stop", f"predict.output_dir={tmp_path / 'o'}"
        )
    assert "broken.jpg" in capsys.readouterr().err
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "results.json").write_text("[1]")
    with pytest.raises(SystemExit):
        _predict(in_run_datasets["dir"], image, f"predict.output_dir={kept}")
    assert "exists; nothing is overwritten" in capsys.readouterr().err
    assert (kept / "results.json").read_text() == "[1]"


@pytest.mark.slow
@needs_torch_export
def test_benchmark_predict_prints_images_per_second_for_each_path(in_run_datasets, capsys):
    folder = os.path.dirname(_val_images(in_run_datasets)[0]["path"])
    argv = [
        in_run_datasets["dir"],
        folder,
        "--images",
        "2",
        "--batch-sizes",
        "1,2",
        "--score-thresholds",
        "0.5",
    ]
    rows = load_script("benchmark_predict").main([*argv, "--exports"])
    assert [row[:2] for row in rows] == [
        ("Predictor", 1), ("Predictor", 2), ("eager, one image per call", 1), ("ExportedProgram", 1),
        ("ONNX Runtime (CPU)", 1), ("TorchScript (legacy)", 1),
    ]  # fmt: skip
    assert all(row[3] > 0 for row in rows) and all(row[5] > 0 for row in rows[3:])
    # Every path finds the same detections (the demo run's own threshold, two images).
    assert len({row[4] for row in rows[2:]}) == 1
    table = capsys.readouterr().out
    assert table.count("\n| ") == 7 and "images/s" in table and "export s" in table


def test_predict_command_takes_a_config_and_named_weights(in_run_datasets, tmp_path, capsys):
    config = os.path.join(in_run_datasets["dir"], "config.yaml")
    weights = os.path.join(in_run_datasets["dir"], "model_final.pth")
    image = _val_images(in_run_datasets)[0]["path"]
    out = tmp_path / "out"
    _predict(
        config, image, f"predict.checkpoint={weights}", f"predict.output_dir={out}",
        "model.roi_heads.score_thresh=0",
    )  # fmt: skip
    assert "Predicted 1 images (100 detections)" in capsys.readouterr().out  # predict's detections_per_img
    assert json.load(open(out / "images.json"))["categories"][0] == {"id": 1, "name": "red_circle"}
    with pytest.raises(SystemExit):
        _predict(config, image, f"predict.output_dir={tmp_path / 'other'}")
    assert "is a config: name its weights with predict.checkpoint=PATH" in capsys.readouterr().err
    unweighted = tmp_path / "unweighted"
    unweighted.mkdir()
    shutil.copy(config, unweighted)
    with pytest.raises(SystemExit):
        _predict(unweighted, image, f"predict.output_dir={tmp_path / 'other'}")
    assert "or name a file with predict.checkpoint=PATH" in capsys.readouterr().err


def test_predict_command_takes_the_models_score_threshold_from_the_command_line(in_run_datasets, tmp_path):
    # The regression: model.roi_heads.score_thresh=... on predict's command line was overwritten by predict's
    # own 0.5 after the overrides. The tiny run's scores are all far below 0.5.
    image = _val_images(in_run_datasets)[0]["path"]
    counts = {}
    for threshold in (None, 0.0001):
        out = tmp_path / f"out_{threshold}"
        extra = [] if threshold is None else [f"model.roi_heads.score_thresh={threshold}"]
        _predict(in_run_datasets["dir"], image, f"predict.output_dir={out}", *extra)
        results = json.load(open(out / "results.json"))
        counts[threshold] = len(results)
        if threshold is not None:
            assert results and min(r["score"] for r in results) >= threshold
    assert counts[None] == 0 < counts[0.0001] <= 100


def _refuse_downloads(monkeypatch) -> None:
    """Every way a model's initial weights could be fetched fails loudly."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a download or initial-weights load was attempted: {args[:2]}")

    monkeypatch.setattr("timm.models._builder.load_pretrained", refuse)
    monkeypatch.setattr("lazytrain.modeling.timm_backbone.download_to_cache", refuse)
    monkeypatch.setattr("lazytrain.modeling.download.download_to_cache", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("pretrained", ["true", "https://example.invalid/resnet18d.pth"], ids=["hub", "url"])
def test_a_run_that_started_from_pretrained_weights_loads_offline(
    in_run_datasets, tmp_path, monkeypatch, pretrained
):
    # A timm run's config asks for its backbone's initial weights (timm's hub, or a URL) and for a URL
    # train.init_checkpoint; its checkpoint holds every weight, so predicting reads nothing else.
    pytest.importorskip("timm")
    config = os.path.join(REPO, "conf", "rfs_maskrcnn_demo_timm.py")
    cfg = LazyConfig.load(config)
    LazyConfig.apply_overrides(cfg, [*smoke_overrides(), "model.backbone.pretrained=false"])
    weights = {"model": instantiate(cfg.model).state_dict()}  # what training saved: every tensor
    run_dir = tmp_path / "timm_run"
    LazyConfig.apply_overrides(
        cfg,
        [f"model.backbone.pretrained={pretrained}", "train.init_checkpoint=https://example.invalid/init.pth"],
    )
    LazyConfig.save(cfg, run_dir / "config.yaml")
    torch.save(weights, run_dir / "model_final.pth")
    shutil.copy(os.path.join(in_run_datasets["dir"], "categories.json"), run_dir)
    _refuse_downloads(monkeypatch)
    predictor = Predictor.from_run(run_dir, device="cpu", overrides=["model.roi_heads.score_thresh=0.0"])
    state = predictor.model.state_dict()
    assert all(torch.equal(state[name], value) for name, value in weights["model"].items())
    image = _val_images(in_run_datasets)[0]["path"]
    assert len(predictor(image)) > 0
    _predict(run_dir, image, f"predict.output_dir={tmp_path / 'out'}", "model.roi_heads.score_thresh=0.0")
    assert json.load(open(tmp_path / "out" / "results.json"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("score_thresh", 0.1, "model.roi_heads.score_thresh=0.1 is below the threshold 0.3"),
        ("detections_per_img", 80, "model.roi_heads.detections_per_img=80 is more than the 50"),
        ("score_thresh", 1.5, r"must be in \[0, 1\]"),
    ],
)
def test_limits_an_exported_file_cannot_honour_are_refused_before_it_is_read(tmp_path, key, value, message):
    # Not a program at all: reading it would fail with another error.
    (tmp_path / "model.pt2").write_bytes(b"not a program")
    applied = {"score_thresh": 0.3, "detections_per_img": 50}
    (tmp_path / "model.json").write_text(json.dumps({"applied_in_the_file": applied}))
    roi_heads = {"score_thresh": 0.5, "detections_per_img": 20, key: value}
    cfg = OmegaConf.create({"model": {"roi_heads": roi_heads}})
    with pytest.raises(ValueError, match=message):
        Predictor.from_exported(cfg, str(tmp_path / "model.pt2"))


def test_predict_reads_a_detectron2_checkpoint_as_init_checkpoint_does(in_run_datasets, tmp_path, capsys):
    # A detectron2 zoo-style .pkl (numpy arrays, detectron2's names) is converted, not refused as unsafe.
    config = os.path.join(in_run_datasets["dir"], "config.yaml")
    cfg = LazyConfig.load(config)
    state = _detectron2_checkpoint(instantiate(without_initial_weights(cfg).model))
    pkl = tmp_path / "model_final_abc.pkl"
    with open(pkl, "wb") as file:
        pickle.dump({"model": state, "__author__": "Detectron2 Model Zoo"}, file)
    own = Predictor.from_config(cfg, str(pkl), device="cpu").model.state_dict()
    conv1 = torch.from_numpy(state["backbone.bottom_up.stem.conv1.weight"])
    assert torch.equal(own["backbone.body.conv1.weight"], conv1.flip(1))  # BGR to RGB
    scores = torch.from_numpy(state["roi_heads.box_predictor.cls_score.bias"])
    assert torch.equal(own["roi_heads.box_predictor.cls_score.bias"], torch.cat((scores[-1:], scores[:-1])))
    image = _val_images(in_run_datasets)[0]["path"]
    _predict(config, image, f"predict.checkpoint={pkl}", f"predict.output_dir={tmp_path / 'out'}")
    assert "Predicted 1 images" in capsys.readouterr().out


def test_predict_honours_the_unsafe_checkpoint_key_its_refusal_names(in_run_datasets, tmp_path, capsys):
    config = os.path.join(in_run_datasets["dir"], "config.yaml")
    weights = torch.load(os.path.join(in_run_datasets["dir"], "model_final.pth"), weights_only=True)
    unsafe = tmp_path / "unsafe.pth"
    torch.save({**weights, "args": argparse.Namespace(lr=1)}, unsafe)  # not loadable weights-only
    image = _val_images(in_run_datasets)[0]["path"]
    with pytest.raises(SystemExit):
        _predict(config, image, f"predict.checkpoint={unsafe}", f"predict.output_dir={tmp_path / 'a'}")
    assert "train.allow_unsafe_checkpoint=true" in capsys.readouterr().err
    _predict(
        config, image, f"predict.checkpoint={unsafe}", f"predict.output_dir={tmp_path / 'b'}",
        "train.allow_unsafe_checkpoint=true",
    )  # fmt: skip
    assert "Predicted 1 images" in capsys.readouterr().out


def test_predict_takes_a_shipped_config_by_its_lazytrain_name(in_run_datasets, tmp_path, capsys):
    weights = os.path.join(in_run_datasets["dir"], "model_final.pth")
    image = _val_images(in_run_datasets)[0]["path"]
    _predict(
        "lazytrain://rfs_maskrcnn_demo", image, f"predict.checkpoint={weights}",
        f"predict.output_dir={tmp_path / 'out'}", *SMALLER_MODEL,
    )  # fmt: skip
    assert "Predicted 1 images" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        _predict("lazytrain://rfs_maskrcnn_dem", image, f"predict.checkpoint={weights}")
    assert "Did you mean lazytrain://rfs_maskrcnn_demo" in capsys.readouterr().err
