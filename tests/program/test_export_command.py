"""``python -m lazytrain export`` on a tiny demo run: files written, checked against the eager model, described
in model.json; never overwritten; one-line errors."""

import contextlib
import hashlib
import io
import json
import os
import shutil

import pytest
import torch

from lazytrain.modeling import export, exported
from lazytrain.program.entrypoint import main as lazytrain_main
from lazytrain.program.predictor import Predictor
from lazytrain.program.run_command import load_run
from tests.modeling.helpers import needs_torch_export


def _export(*argv) -> None:
    lazytrain_main(["export", *map(str, argv)])


def _val_files(run) -> list[str]:
    root = os.path.join(run["datasets"], "synthetic_lt")
    images = json.load(open(os.path.join(root, "lvis_v1_val.json")))["images"]
    return [os.path.join(root, image["file_name"]) for image in images]


# Class logits scaled up: the tiny run's scores all lie near 1/31, far below predict's threshold 0.5; scaled,
# they spread over (0, 1) (0-36 detections per val image above 0.5), so a threshold has something to select.
CONFIDENT = 160.0


@pytest.fixture(scope="module", autouse=True)
def _each_program_read_once():
    """`torch.export.load` of a file with the bytes of one read before in this module returns that program
    again: reading a model.pt2 back takes seconds (its symbolic sizes parsed again), and the export command,
    predict and `Predictor` here read the same few files many times. Each caller still gets its own module
    (`ExportedProgram.module()`); tests/modeling/test_export.py reads every file afresh."""
    read = torch.export.load
    programs = {}

    def load_once(file, *args, **kwargs):
        with open(file, "rb") as opened:
            key = hashlib.sha256(opened.read()).hexdigest()
        if key not in programs:
            programs[key] = read(file, *args, **kwargs)
        return programs[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.export, "load", load_once)
        yield


@pytest.fixture(scope="module")
def confident_export(demo_run, tmp_path_factory):
    """The demo run with confident class scores, exported by the command with its defaults into RUN_DIR/export
    (model.pt2 and model.onnx); what the command printed."""
    run_dir = tmp_path_factory.mktemp("confident_run")
    for name in ("config.yaml", "categories.json"):
        shutil.copy(os.path.join(demo_run["dir"], name), run_dir)
    saved = torch.load(os.path.join(demo_run["dir"], "model_final.pth"), weights_only=True)
    for key in ("roi_heads.box_predictor.cls_score.weight", "roi_heads.box_predictor.cls_score.bias"):
        saved["model"][key] = saved["model"][key] * CONFIDENT
    torch.save(saved, run_dir / "model_final.pth")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setenv("LAZYTRAIN_DATASETS", demo_run["datasets"])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            _export(run_dir)
        finally:
            torch.set_num_threads(threads)
    return {**demo_run, "dir": str(run_dir), "export": str(run_dir / "export"), "printed": printed.getvalue()}


@needs_torch_export
def test_export_writes_checked_files_and_says_what_they_apply(confident_export):
    # README's `python -m lazytrain export runs/a` on the demo recipe (tests/test_readme.py runs it as written).
    out = confident_export["export"]
    printed = confident_export["printed"]
    assert sorted(os.listdir(out)) == ["model.json", "model.onnx", "model.pt2"]
    assert printed.count("parity on 4 images (") == 2, printed
    described = json.load(open(os.path.join(out, "model.json")))
    assert described["files"] == {"program": "model.pt2", "onnx": "model.onnx"}
    assert list(described["inputs"]) == ["image", "original_size"]
    assert described["image_size_range"] == {"height": [65, None], "width": [65, None]}
    # The run evaluates down to 0.001 with 20 detections per image: the file keeps at least predict's 100.
    applied = described["applied_in_the_file"]
    assert (applied["score_thresh"], applied["detections_per_img"], applied["nms_thresh"]) == (
        0.001,
        100,
        0.5,
    )
    saved = json.load(open(os.path.join(confident_export["dir"], "categories.json")))
    assert described["classes"] == [c["name"] for c in saved]
    assert described["category_ids"] == [c["id"] for c in saved]
    assert described["test_mapper"]["augmentations"][0]["short_edge_length"] == 96
    assert set(described["parity"]) == {"program", "onnx"}


def _predict_results(run, out, *keys) -> dict[int, list[dict]]:
    """``python -m lazytrain predict`` on four val images: each image's results, best first."""
    lazytrain_main(["predict", run["dir"], *_val_files(run)[2:], f"predict.output_dir={out}", *keys])
    by_image = {}
    for result in json.load(open(os.path.join(out, "results.json"))):
        by_image.setdefault(result["image_id"], []).append(result)
    return {image: sorted(results, key=lambda r: -r["score"]) for image, results in by_image.items()}


@needs_torch_export
def test_predict_with_an_exported_file_gives_the_detections_of_the_weights(
    confident_export, tmp_path, monkeypatch, one_thread
):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", confident_export["datasets"])
    for keys in [(), ("model.roi_heads.score_thresh=0.3",)]:
        # One image per forward, as an exported file runs: in a batch, an image padded to a larger one's size
        # gets slightly other features near its border (the tiny data set's images differ in size).
        expected = _predict_results(
            confident_export, tmp_path / f"weights{len(keys)}", "predict.batch_size=1", *keys
        )
        assert sum(len(results) for results in expected.values()) > 0
        for name in ("model.pt2", "model.onnx"):
            file = os.path.join(confident_export["export"], name)
            got = _predict_results(
                confident_export, tmp_path / f"{name}{len(keys)}", f"predict.exported={file}", *keys
            )
            assert got.keys() == expected.keys(), (name, keys)
            for image, results in expected.items():
                assert len(got[image]) == len(results), (name, keys, image)
                scores = torch.tensor([r["score"] for r in got[image]])
                torch.testing.assert_close(
                    scores, torch.tensor([r["score"] for r in results]), atol=1e-4, rtol=0
                )
                assert sorted(r["category_id"] for r in got[image]) == sorted(
                    r["category_id"] for r in results
                )
                assert float(scores.min()) >= (0.3 if keys else 0.5)


@needs_torch_export
def test_predictor_from_exported_gives_the_weights_boxes_and_masks(confident_export, monkeypatch, one_thread):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", confident_export["datasets"])
    overrides = ["model.roi_heads.score_thresh=0.3"]
    eager = Predictor.from_run(confident_export["dir"], device="cpu", overrides=overrides)
    files = _val_files(confident_export)[4:6]
    expected = eager(files)
    cfg, _ = load_run(confident_export["dir"], overrides)
    exported = Predictor.from_exported(cfg, os.path.join(confident_export["export"], "model.pt2"))
    assert exported.device == torch.device("cpu") and exported.categories == eager.categories
    for want, got in zip(expected, exported(files)):
        assert (got.height, got.width) == (want.height, want.width) and len(got) == len(want) > 0
        assert torch.allclose(got.boxes, want.boxes, atol=1e-3) and torch.equal(got.classes, want.classes)
        assert torch.allclose(got.scores, want.scores, atol=1e-5)
        assert (got.masks != want.masks).float().mean() < 1e-3


@needs_torch_export
def test_predict_with_an_exported_file_refuses_what_it_cannot_honour_in_one_line(
    confident_export, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", confident_export["datasets"])
    run, image = confident_export["dir"], _val_files(confident_export)[0]
    program = f"predict.exported={os.path.join(confident_export['export'], 'model.pt2')}"
    weights = os.path.join(run, "model_final.pth")
    cases = [
        ([program, "model.roi_heads.score_thresh=0.0001"],
         "model.roi_heads.score_thresh=0.0001 is below the threshold 0.001 that model.pt2 (model.json beside it) "
         "applies itself"),
        ([program, "model.roi_heads.detections_per_img=300"],
         "model.roi_heads.detections_per_img=300 is more than the 100 detections per image that model.pt2"),
        ([program, "model.roi_heads.nms_thresh=0.6"],
         "model.roi_heads.nms_thresh is part of the file predict.exported names"),
        ([program, "predict.device=cuda"], "predict.device does not apply with predict.exported"),
        ([f"predict.exported={weights}"],
         f"predict.exported={weights} is a PyTorch checkpoint (weights saved by torch.save), not an exported "
         f"model: predict with it as predict.checkpoint={weights}, or export it first"),
        (["predict.exported=export/missing.pt2"], "predict.exported=export/missing.pt2: no such file"),
        ([program, "model.roi_heads.score_thresh=-1"], "model.roi_heads.score_thresh must be a score in [0, 1]"),
        (["model.roi_heads.score_thresh=-1"], "model.roi_heads.score_thresh must be a score in [0, 1]"),
        (["model.roi_heads.detections_per_img=0"], "model.roi_heads.detections_per_img must be an int >= 1"),
    ]  # fmt: skip
    for keys, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            lazytrain_main(["predict", run, image, f"predict.output_dir={tmp_path / 'out'}", *keys])
        error = capsys.readouterr().err
        assert exit_info.value.code == 1 and message in error, (keys, error)
        assert error.count("\n") == 1, error
    assert not (tmp_path / "out").exists()


@needs_torch_export
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:FutureWarning:torch")
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning:torch")
def test_export_writes_aoti_and_torchscript_when_asked_checks_given_images_and_never_overwrites(
    in_run_datasets, tmp_path, capsys, monkeypatch
):
    # The AOTInductor compile itself (~1 min) is tested in tests/modeling/test_export.py; here, the wiring:
    # the package is written from the program and checked as it loads back.
    compiled = []

    def fake_compile(program, file):
        compiled.append(program)
        # The program's own file, written just before, stands for the package (read back once, not twice).
        shutil.copyfile(os.path.join(os.path.dirname(file), "model.pt2"), file)
        return file

    monkeypatch.setattr(export, "export_aoti", fake_compile)
    monkeypatch.setattr(exported, "load_aoti", exported.load_program)
    images = tmp_path / "images"
    images.mkdir()
    for file in _val_files(in_run_datasets)[:2]:
        shutil.copy(file, images)
    out = tmp_path / "export"
    argv = [
        in_run_datasets["dir"],
        images,
        "export.onnx=false",
        "export.aoti=true",
        "export.torchscript=true",
    ]
    _export(*argv, f"export.output_dir={out}")
    printed = capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["model.json", "model.pt2", "model.ts", "model_aoti.pt2"]
    assert len(compiled) == 1 and printed.count("parity on 2 images") == 3, printed
    assert "legacy TorchScript, which torch deprecates" in printed
    assert set(json.load(open(out / "model.json"))["parity"]) == {"program", "aoti", "torchscript"}
    # Nothing already written is overwritten: the second run stops before exporting.
    before = {name: (out / name).stat().st_mtime_ns for name in os.listdir(out)}
    with pytest.raises(SystemExit) as exit_info:
        _export(*argv, f"export.output_dir={out}")
    assert exit_info.value.code == 1 and len(compiled) == 1
    assert "model.pt2 exists; nothing is overwritten" in capsys.readouterr().err
    assert {name: (out / name).stat().st_mtime_ns for name in os.listdir(out)} == before


@needs_torch_export  # below 2.14 the command stops first at the torch version (the test after this)
def test_export_refuses_bad_input_with_one_line(in_run_datasets, tmp_path, capsys, monkeypatch):
    unweighted = tmp_path / "unweighted"
    unweighted.mkdir()
    shutil.copy(os.path.join(in_run_datasets["dir"], "config.yaml"), unweighted)
    cases = [
        ([in_run_datasets["dir"], "export.onnx=maybe"], "export.onnx must be true or false; got 'maybe'"),
        ([tmp_path], "config.yaml not found"),
        ([unweighted], "has no weights (no last_checkpoint, no model_final.pth)"),
        ([unweighted], "or name a file with export.checkpoint=PATH"),
        ([in_run_datasets["dir"], tmp_path / "missing.png"], "missing.png does not exist"),
        ([], "give a run directory"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            _export(*argv, f"export.output_dir={tmp_path / 'out'}")
        assert message in capsys.readouterr().err, argv
    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path / "no_data"))
    monkeypatch.setattr(
        "lazytrain.data.datasets.builtin.generate_synthetic_lt",
        lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("no data here")),
    )
    with pytest.raises(SystemExit):
        _export(in_run_datasets["dir"], f"export.output_dir={tmp_path / 'out2'}")
    assert "give some (files, folders or globs) after RUN_DIR" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()


def test_export_on_a_torch_too_old_is_one_line(in_run_datasets, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    with pytest.raises(SystemExit):
        _export(in_run_datasets["dir"], f"export.output_dir={tmp_path / 'out'}")
    assert "export() needs torch >= 2.14" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
