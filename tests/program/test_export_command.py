"""``python -m lazytrain export`` on a tiny demo run: files written, checked against the eager model, described
in model.json; never overwritten; one-line errors."""

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


@needs_torch_export
def test_export_writes_a_checked_program_and_describes_it(in_run_datasets, tmp_path, capsys):
    # ONNX of the demo run: README's `python -m lazytrain export runs/a` (tests/test_readme.py); here the program.
    out = tmp_path / "export"
    _export(
        in_run_datasets["dir"],
        "model.roi_heads.score_thresh=0.0",
        "export.onnx=false",
        f"export.output_dir={out}",
    )
    printed = capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["model.json", "model.pt2"]
    assert printed.count("parity on 4 images (80 detections)") == 1, printed  # 4 test images x 20
    described = json.load(open(out / "model.json"))
    assert described["files"] == {"program": "model.pt2"}
    assert list(described["inputs"]) == ["image", "original_size"]
    assert described["image_size_range"] == {"height": [65, None], "width": [65, None]}
    assert described["score_thresh"] == 0.0 and described["detections_per_img"] == 20
    saved = json.load(open(os.path.join(in_run_datasets["dir"], "categories.json")))
    assert described["classes"] == [c["name"] for c in saved]
    assert described["category_ids"] == [c["id"] for c in saved]
    assert described["test_mapper"]["augmentations"][0]["short_edge_length"] == 96
    assert set(described["parity"]) == {"program"}
    # The files predict as the eager model does, on images the check did not see, in their original sizes.
    overrides = ["model.roi_heads.score_thresh=0.0"]
    eager = Predictor.from_run(in_run_datasets["dir"], device="cpu", overrides=overrides)
    files = _val_files(in_run_datasets)[4:6]
    expected = eager(files)
    cfg, _ = load_run(in_run_datasets["dir"], overrides)
    for name in ("model.pt2",):
        exported = Predictor.from_exported(cfg, str(out / name), categories=eager.categories)
        assert exported.device == torch.device("cpu")
        for want, got in zip(expected, exported(files)):
            assert (got.height, got.width) == (want.height, want.width) and len(got) == len(want) == 20
            assert torch.allclose(got.boxes, want.boxes, atol=1e-3) and torch.equal(got.classes, want.classes)
            assert torch.allclose(got.scores, want.scores, atol=1e-5)
            assert (got.masks != want.masks).float().mean() < 1e-3
    # The command line: predict.exported in place of the weights.
    predictions = tmp_path / "predictions"
    lazytrain_main(
        ["predict", in_run_datasets["dir"], *files, f"predict.exported={out / 'model.pt2'}",
         f"predict.output_dir={predictions}"]
    )  # fmt: skip
    results = json.load(open(predictions / "results.json"))
    assert len(results) == 40 and {r["category_id"] for r in results} <= set(described["category_ids"])


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
        return export.save_program(program, file)

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


def test_export_on_a_torch_too_old_is_one_line(in_run_datasets, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    with pytest.raises(SystemExit):
        _export(in_run_datasets["dir"], f"export.output_dir={tmp_path / 'out'}")
    assert "export() needs torch >= 2.14" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
