"""``python -m lazytrain export`` on a tiny demo run: files written, checked against the eager model, described
in model.json; never overwritten; one-line errors."""

import json
import os
import shutil

import pytest
import torch

from lazytrain.modeling import export
from lazytrain.program.entrypoint import main as lazytrain_main
from lazytrain.program.predictor import Predictor, to_image_tensor

pytestmark = [
    # torch's deprecation notices for TorchScript and its ONNX exporter (the command filters them itself;
    # loading the files again here shows them).
    pytest.mark.filterwarnings("ignore::FutureWarning:torch"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch"),
]


def _export(*argv) -> None:
    lazytrain_main(["export", *map(str, argv)])


def _val_files(run) -> list[str]:
    root = os.path.join(run["datasets"], "synthetic_lt")
    images = json.load(open(os.path.join(root, "lvis_v1_val.json")))["images"]
    return [os.path.join(root, image["file_name"]) for image in images]


def test_export_writes_checked_torchscript_and_onnx_and_describes_them(in_run_datasets, tmp_path, capsys):
    out = tmp_path / "export"
    _export(in_run_datasets["dir"], "model.roi_heads.score_thresh=0.0", f"export.output_dir={out}")
    printed = capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["model.json", "model.onnx", "model.ts"]
    assert printed.count("parity on 4 images (80 detections)") == 2, printed  # 4 test images x 20
    assert "opset 17" in printed and f"this machine: torch {torch.__version__}" in printed
    described = json.load(open(out / "model.json"))
    assert described["files"] == {"torchscript": "model.ts", "onnx": "model.onnx"}
    assert described["score_thresh"] == 0.0 and described["detections_per_img"] == 20
    saved = json.load(open(os.path.join(in_run_datasets["dir"], "categories.json")))
    assert described["classes"] == [c["name"] for c in saved]
    assert described["category_ids"] == [c["id"] for c in saved]
    assert described["test_mapper"]["augmentations"][0]["short_edge_length"] == 96
    assert set(described["parity"]) == {"torchscript", "onnx"}
    # The files work on an image the check did not see, after the test mapper's resize.
    predictor = Predictor.from_run(
        in_run_datasets["dir"], device="cpu", overrides=["model.roi_heads.score_thresh=0.0"]
    )
    image = predictor.mapper.map_image(to_image_tensor(_val_files(in_run_datasets)[5]))
    eager = export.ExportableRCNN(predictor.model)
    for load, name in ((export.load_torchscript, "model.ts"), (export.load_onnx, "model.onnx")):
        report = export.check_parity(eager, load(str(out / name)), [image])
        assert report.num_detections == 20 and report.max_box_diff < 1e-3


def test_export_checks_on_the_given_images_and_never_overwrites(in_run_datasets, tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    for file in _val_files(in_run_datasets)[:2]:
        shutil.copy(file, images)
    out = tmp_path / "export"
    _export(in_run_datasets["dir"], images, "export.format=torchscript", f"export.output_dir={out}")
    assert "parity on 2 images" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["model.json", "model.ts"]
    before = {name: (out / name).stat().st_mtime_ns for name in os.listdir(out)}
    with pytest.raises(SystemExit) as exit_info:
        _export(in_run_datasets["dir"], images, "export.format=onnx", f"export.output_dir={out}")
    assert exit_info.value.code == 1
    assert "model.json exists; nothing is overwritten" in capsys.readouterr().err
    assert {name: (out / name).stat().st_mtime_ns for name in os.listdir(out)} == before


def test_export_refuses_bad_input_with_one_line(in_run_datasets, tmp_path, capsys, monkeypatch):
    unweighted = tmp_path / "unweighted"
    unweighted.mkdir()
    shutil.copy(os.path.join(in_run_datasets["dir"], "config.yaml"), unweighted)
    cases = [
        ([in_run_datasets["dir"], "export.format=tflite"], "export.format must be all, onnx or torchscript"),
        ([tmp_path], "config.yaml not found"),
        ([unweighted], "has no weights"),
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
