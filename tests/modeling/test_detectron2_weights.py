"""detectron2 checkpoints: names, values, the safe unpickler, loading through ``train.init_checkpoint`` and the
``convert-detectron2`` command, on a small synthetic checkpoint."""

from __future__ import annotations

import os
import pickle
import re

import numpy as np
import pytest
import torch

from lazytrain.config import LazyConfig, instantiate
from lazytrain.errors import CheckpointError
from lazytrain.modeling.detectron2_weights import convert_detectron2_state_dict
from lazytrain.modeling.weights import load_init_weights

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_CLASSES = 3


def _small_model(num_classes: int = NUM_CLASSES) -> torch.nn.Module:
    cfg = LazyConfig.load(os.path.join(REPO, "recipes/models/mask_rcnn_r18_fpn_cpu.py"))
    cfg.model.num_classes = num_classes
    return instantiate(cfg.model)


# lazytrain name -> detectron2 name, written from detectron2's module names (the inverse of the converter).
_TO_DETECTRON2 = (
    (r"backbone\.body\.conv1\.", "backbone.bottom_up.stem.conv1."),
    (r"backbone\.body\.bn1\.", "backbone.bottom_up.stem.conv1.norm."),
    (r"backbone\.body\.layer(\d)\.(\d+)\.conv(\d)\.", lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}."),
    (r"backbone\.body\.layer(\d)\.(\d+)\.bn(\d)\.", lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm."),
    (r"backbone\.body\.layer(\d)\.(\d+)\.downsample\.0\.", lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.shortcut."),
    (r"backbone\.body\.layer(\d)\.(\d+)\.downsample\.1\.", lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.shortcut.norm."),
    (r"backbone\.fpn\.inner_blocks\.(\d)\.0\.", lambda m: f"backbone.fpn_lateral{int(m[1]) + 2}."),
    (r"backbone\.fpn\.layer_blocks\.(\d)\.0\.", lambda m: f"backbone.fpn_output{int(m[1]) + 2}."),
    (r"rpn\.head\.conv\.0\.0\.", "proposal_generator.rpn_head.conv."),
    (r"rpn\.head\.cls_logits\.", "proposal_generator.rpn_head.objectness_logits."),
    (r"rpn\.head\.bbox_pred\.", "proposal_generator.rpn_head.anchor_deltas."),
    (r"roi_heads\.box_head\.fc6\.", "roi_heads.box_head.fc1."),
    (r"roi_heads\.box_head\.fc7\.", "roi_heads.box_head.fc2."),
    (r"roi_heads\.box_predictor\.", "roi_heads.box_predictor."),
    (r"roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"roi_heads.mask_head.mask_fcn{int(m[1]) + 1}."),
    (r"roi_heads\.mask_predictor\.conv5_mask\.", "roi_heads.mask_head.deconv."),
    (r"roi_heads\.mask_predictor\.mask_fcn_logits\.", "roi_heads.mask_head.predictor."),
)  # fmt: skip


def _detectron2_checkpoint(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's weights (random values) as detectron2 stores them: its names, BGR conv1, background last,
    no background rows in the box regressor and the mask predictor."""
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        for pattern, name in _TO_DETECTRON2:
            match = re.match(pattern, key)
            if match:
                new = (name if isinstance(name, str) else name(match)) + key[match.end() :]
                break
        else:
            raise AssertionError(key)
        value = torch.randn(value.shape, generator=generator)
        if key.startswith("roi_heads.box_predictor.cls_score"):
            value = torch.cat((value[1:], value[:1]))  # detectron2: background last
        elif key.startswith(
            ("roi_heads.box_predictor.bbox_pred", "roi_heads.mask_predictor.mask_fcn_logits")
        ):
            value = value[4:] if "bbox_pred" in key else value[1:]  # no background rows
        state[new] = value.numpy()
    return state


def _expected(model_key: str, detectron2: dict[str, np.ndarray], detectron2_key: str) -> torch.Tensor:
    value = torch.from_numpy(detectron2[detectron2_key])
    if model_key == "backbone.body.conv1.weight":
        return value.flip(1)
    if model_key.startswith("roi_heads.box_predictor.cls_score"):
        return torch.cat((value[-1:], value[:-1]))
    if model_key.startswith("roi_heads.box_predictor.bbox_pred"):
        return torch.cat((torch.zeros(4, *value.shape[1:]), value))
    if model_key.startswith("roi_heads.mask_predictor.mask_fcn_logits"):
        return torch.cat((torch.zeros(1, *value.shape[1:]), value))
    return value


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("detectron2")
    state = _detectron2_checkpoint(_small_model())
    pkl, pth = folder / "model_final_abc.pkl", folder / "model_final.pth"
    with open(pkl, "wb") as file:
        pickle.dump({"model": state, "__author__": "Detectron2 Model Zoo", "matching_heuristics": True}, file)
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}, "iteration": 9}, pth)
    return state, str(pkl), str(pth)


@pytest.mark.parametrize("kind", ["pkl", "pth"])
def test_detectron2_checkpoint_loads_through_init_checkpoint_converted(checkpoints, kind, caplog):
    state, pkl, pth = checkpoints
    model = _small_model()
    with caplog.at_level("INFO"):
        report = load_init_weights(model, pkl if kind == "pkl" else pth)
    assert report.missing == [] and report.unexpected == [] and report.shape_mismatched == []
    assert len(report.loaded) == len(state)
    assert "detectron2" in report.source and "BGR to RGB" in report.source and "background" in caplog.text
    own = model.state_dict()
    for model_key, pattern_key in zip(
        ("backbone.body.conv1.weight", "roi_heads.box_predictor.cls_score.bias",
         "roi_heads.box_predictor.bbox_pred.weight", "roi_heads.mask_predictor.mask_fcn_logits.weight",
         "backbone.body.layer2.0.downsample.1.running_var", "rpn.head.conv.0.0.weight"),
        ("backbone.bottom_up.stem.conv1.weight", "roi_heads.box_predictor.cls_score.bias",
         "roi_heads.box_predictor.bbox_pred.weight", "roi_heads.mask_head.predictor.weight",
         "backbone.bottom_up.res3.0.shortcut.norm.running_var", "proposal_generator.rpn_head.conv.weight"),
    ):  # fmt: skip
        assert torch.equal(own[model_key], _expected(model_key, state, pattern_key)), model_key


def test_unsupported_lsj_parts_are_refused_by_name():
    state = {
        "backbone.bottom_up.stem.conv1.weight": np.zeros((2, 3, 1, 1), np.float32),
        "proposal_generator.rpn_head.conv.conv0.weight": np.zeros((2, 2, 3, 3), np.float32),
        "roi_heads.box_head.conv1.norm.weight": np.zeros(2, np.float32),
    }
    with pytest.raises(ValueError, match="box head with convs .4conv1fc.*RPN head with several convs"):
        convert_detectron2_state_dict(state)


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_holding_more_than_numpy_arrays_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "model_final_evil.pkl"
    with open(path, "wb") as file:
        pickle.dump({"model": {"backbone.bottom_up.stem.conv1.weight": _Payload(str(marker))}}, file)
    with pytest.raises(
        CheckpointError, match=r"refused to read .*evil.pkl as a detectron2 pickle: it holds \S+system"
    ):
        load_init_weights(_small_model(), str(path))
    assert not marker.exists()


def test_convert_command_writes_a_lazytrain_checkpoint_once(checkpoints, tmp_path, capsys):
    from lazytrain.program.entrypoint import main

    _, pkl, _ = checkpoints
    out = str(tmp_path / "converted.pth")
    main(["convert-detectron2", pkl, out])
    assert "BGR to RGB" in capsys.readouterr().out
    direct, converted = _small_model(), _small_model()
    load_init_weights(direct, pkl)
    report = load_init_weights(converted, out)
    assert report.source == "lazytrain checkpoint" and report.missing == []
    assert all(
        torch.equal(a, b) for a, b in zip(direct.state_dict().values(), converted.state_dict().values())
    )
    written = os.path.getmtime(out)
    with pytest.raises(SystemExit):
        main(["convert-detectron2", pkl, out])
    assert "exists" in capsys.readouterr().err and os.path.getmtime(out) == written
    main(["convert-detectron2", pkl, out, "--force"])


def test_a_single_class_mask_rcnn_keeps_its_mask_predictor(tmp_path):
    # K = 1: detectron2's mask predictor has one row, as a class-agnostic one has; it is class 1's map.
    state = _detectron2_checkpoint(_small_model(1))
    assert state["roi_heads.mask_head.predictor.weight"].shape[0] == 1
    path = tmp_path / "model_final_k1.pkl"
    with open(path, "wb") as file:
        pickle.dump({"model": state}, file)
    model = _small_model(1)
    report = load_init_weights(model, str(path))
    assert report.shape_mismatched == [] and report.missing == []
    assert "mask_fcn_logits: 1 zero background row(s) added" in report.source
    own = model.state_dict()
    for key, detectron2_key in (
        ("roi_heads.mask_predictor.mask_fcn_logits.weight", "roi_heads.mask_head.predictor.weight"),
        ("roi_heads.mask_predictor.mask_fcn_logits.bias", "roi_heads.mask_head.predictor.bias"),
        ("roi_heads.box_predictor.bbox_pred.weight", "roi_heads.box_predictor.bbox_pred.weight"),
    ):
        assert torch.equal(own[key], _expected(key, state, detectron2_key)), key


def _minimal(classes: int, box_rows: int, mask_rows: int) -> dict[str, np.ndarray]:
    """The parts every detectron2 R-CNN has, with a box regressor and mask predictor of the given rows."""
    return {
        "backbone.bottom_up.stem.conv1.weight": np.zeros((2, 3, 1, 1), np.float32),
        "proposal_generator.rpn_head.objectness_logits.weight": np.zeros((3, 2, 1, 1), np.float32),
        "roi_heads.box_predictor.cls_score.weight": np.zeros((classes + 1, 8), np.float32),
        "roi_heads.box_predictor.cls_score.bias": np.zeros(classes + 1, np.float32),
        "roi_heads.box_predictor.bbox_pred.weight": np.zeros((box_rows, 8), np.float32),
        "roi_heads.box_predictor.bbox_pred.bias": np.zeros(box_rows, np.float32),
        "roi_heads.mask_head.predictor.weight": np.zeros((mask_rows, 4, 1, 1), np.float32),
        "roi_heads.mask_head.predictor.bias": np.zeros(mask_rows, np.float32),
    }


@pytest.mark.parametrize(
    "box_rows, mask_rows, message",
    [
        (12, 1, r"roi_heads\.mask_head\.predictor has 1 rows for 3 classes, class-agnostic "
                r"\(MODEL\.ROI_MASK_HEAD\.CLS_AGNOSTIC_MASK=True\)"),
        (4, 3, r"roi_heads\.box_predictor\.bbox_pred has 4 rows for 3 classes, class-agnostic "
               r"\(MODEL\.ROI_BOX_HEAD\.CLS_AGNOSTIC_BBOX_REG=True\)"),
        (12, 2, r"roi_heads\.mask_head\.predictor has 2 rows for 3 classes; .* trained without"),
    ],
)  # fmt: skip
def test_class_agnostic_predictors_are_refused_by_their_detectron2_key(box_rows, mask_rows, message):
    with pytest.raises(ValueError, match=message):
        convert_detectron2_state_dict(_minimal(3, box_rows, mask_rows))
    converted, notes = convert_detectron2_state_dict(_minimal(3, 12, 3))
    assert converted["roi_heads.box_predictor.bbox_pred.weight"].shape[0] == 16
    assert converted["roi_heads.mask_predictor.mask_fcn_logits.weight"].shape[0] == 4


def test_a_faster_rcnn_gets_no_note_of_a_mask_map():
    state = _minimal(3, 12, 3)
    del state["roi_heads.mask_head.predictor.weight"], state["roi_heads.mask_head.predictor.bias"]
    _, notes = convert_detectron2_state_dict(state)
    assert not any("mask" in note for note in notes)


def test_a_weight_without_its_bias_and_a_partial_checkpoint_are_refused_by_name():
    state = _minimal(3, 12, 3)
    del state["roi_heads.box_predictor.bbox_pred.bias"]
    with pytest.raises(
        ValueError, match=r"has no roi_heads\.box_predictor\.bbox_pred\.bias \(it has its weight\)"
    ):
        convert_detectron2_state_dict(state)
    one_tensor = {"backbone.bottom_up.stem.conv1.weight": np.zeros((2, 3, 1, 1), np.float32)}
    with pytest.raises(
        ValueError,
        match=r"x.pkl is not a whole Mask/Faster R-CNN: it has no RPN \(proposal_generator.*, box predictor",
    ):
        convert_detectron2_state_dict(one_tensor, path="x.pkl")


def test_convert_command_keeps_a_file_made_while_it_converted(checkpoints, tmp_path, monkeypatch, capsys):
    from lazytrain.program import convert_command
    from lazytrain.program.entrypoint import main

    out = tmp_path / "converted.pth"
    convert = convert_command.convert_detectron2_state_dict

    def convert_while_another_writes(*args, **kwargs):
        out.write_text("another program's file")
        return convert(*args, **kwargs)

    monkeypatch.setattr(convert_command, "convert_detectron2_state_dict", convert_while_another_writes)
    with pytest.raises(SystemExit):
        main(["convert-detectron2", checkpoints[1], str(out)])
    assert out.read_text() == "another program's file" and "exists" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["converted.pth"]  # no temporary file left


@pytest.mark.parametrize("kind", ["detectron2", "lazytrain"])
def test_evaluating_a_checkpoint_of_another_class_count_is_an_error(checkpoints, tmp_path, kind, caplog):
    path = checkpoints[1]
    if kind == "lazytrain":
        path = str(tmp_path / "model_final.pth")
        torch.save({"model": _small_model().state_dict()}, path)
    model = _small_model(5)
    with pytest.raises(ValueError) as error:
        load_init_weights(model, path, for_evaluation=True)
    assert str(error.value) == (
        f"load_init_weights: train.eval_only=true with model.num_classes=5 but {path} has 3 classes: "
        "roi_heads.box_predictor.cls_score, roi_heads.box_predictor.bbox_pred, "
        "roi_heads.mask_predictor.mask_fcn_logits would be evaluated at their random initialisation. "
        "Set model.num_classes=3."
    )
    with caplog.at_level("INFO", logger="lazytrain.modeling.weights"):
        report = load_init_weights(model, path)  # training: re-initialised heads are a warning
    (record,) = [r for r in caplog.records if r.name == "lazytrain.modeling.weights"]
    assert record.levelname == "WARNING" and len(report.reinitialised) == 3
    assert record.getMessage().endswith(
        "These heads start from random weights: roi_heads.box_predictor.cls_score, "
        "roi_heads.box_predictor.bbox_pred, roi_heads.mask_predictor.mask_fcn_logits."
    )


def test_eval_only_evaluates_only_checkpoints_that_fill_the_heads(checkpoints):
    from omegaconf import OmegaConf

    from lazytrain.program.default import load_init_checkpoint

    cfg = OmegaConf.create({"train": {"init_checkpoint": checkpoints[1], "eval_only": True}})
    with pytest.raises(ValueError, match="model.num_classes=5 but .* has 3 classes"):
        load_init_checkpoint(cfg, _small_model(5))
    load_init_checkpoint(cfg, _small_model())
    cfg.train.eval_only = False
    load_init_checkpoint(cfg, _small_model(5))


def _with_buffers(state: dict[str, np.ndarray], std: float) -> dict[str, np.ndarray]:
    """`state` with the buffers older detectron2 versions saved: BGR pixel statistics and 5 cell anchors."""
    buffers = {
        "pixel_mean": np.array([103.53, 116.28, 123.675], np.float32).reshape(3, 1, 1),
        "pixel_std": np.full((3, 1, 1), std, np.float32),
    }
    buffers |= {
        f"proposal_generator.anchor_generator.cell_anchors.{i}": np.zeros((3, 4), np.float32)
        for i in range(5)
    }
    return {**state, **buffers}


def test_buffers_older_detectron2_saved_are_dropped_with_a_note(checkpoints, tmp_path, caplog):
    state, _, _ = checkpoints
    pkl = tmp_path / "old.pkl"
    with open(pkl, "wb") as file:
        pickle.dump({"model": _with_buffers(state, 1.0)}, file)
    with caplog.at_level("INFO"):
        report = load_init_weights(_small_model(), str(pkl))
    assert report.missing == [] and report.unexpected == [] and len(report.loaded) == len(state)
    assert "7 buffers that are not weights dropped" in report.source and "differ" not in caplog.text


def test_pixel_statistics_other_than_detectron2s_are_named_with_their_keys(checkpoints, caplog):
    state, _, _ = checkpoints
    with caplog.at_level("WARNING"):
        _, notes = convert_detectron2_state_dict(_with_buffers(state, 57.5), path="old.pkl")
    assert (
        "old.pkl's pixel_mean/pixel_std differ" in notes[-1]
        and "model.pixel_std=[57.5,57.5,57.5]" in notes[-1]
    )
    assert "model.pixel_mean" not in notes[-1] and "model.pixel_std=[57.5,57.5,57.5]" in caplog.text


def test_lsj_checkpoint_through_init_checkpoint_is_a_checkpoint_error_naming_the_file(checkpoints, tmp_path):
    state, _, _ = checkpoints
    pkl = tmp_path / "lsj.pkl"
    with open(pkl, "wb") as file:
        pickle.dump(
            {"model": {**state, "roi_heads.box_head.conv1.norm.weight": np.zeros(2, np.float32)}}, file
        )
    # A LazytrainError: a run stops with its message in one line (lazytrain.program.job), not a traceback.
    with pytest.raises(CheckpointError, match=f"{re.escape(str(pkl))} holds parts .*4conv1fc"):
        load_init_weights(_small_model(), str(pkl))
