"""Model export: the wrapper equals the model, and every target (torch.export's ExportedProgram, ONNX through
torch's exporter, an AOTInductor package, legacy TorchScript) reproduces it on image sizes, original sizes and
detection counts other than the example's, zero detections included."""

import sys
import warnings
import zipfile

import onnx
import pytest
import torch
from torchvision.models.detection import _utils as det_utils

from lazytrain.config import LazyCall as L
from lazytrain.config import instantiate
from lazytrain.modeling import EQLv2Loss
from lazytrain.modeling.box_coding import BoxCoder
from lazytrain.modeling.export import (
    ONNX_OPSET,
    TESTED_VERSIONS,
    ExportableRCNN,
    export_aoti,
    export_onnx,
    export_program,
    export_torchscript,
    input_size_range,
    save_program,
)
from lazytrain.modeling.export_parity import check_parity
from lazytrain.modeling.exported import (
    DetectionLimits,
    ExportedModel,
    get_file_kind,
    load_aoti,
    load_exported,
    load_onnx,
    load_program,
    load_torchscript,
    read_built_in_limits,
)
from tests.modeling.helpers import load_model_config, make_record, needs_torch_export

# A random-init model scores every class near 1/(K+1): threshold 0 keeps 20 detections per image. 1000
# proposals after NMS (not the recipe's 300, which every image here reaches) make the proposal count follow
# the image size, so the exports are checked with counts other than the example's.
OVERRIDES = (
    "model.num_classes=3",
    "model.roi_heads.score_thresh=0.0",
    "model.roi_heads.detections_per_img=20",
    "model.rpn.post_nms_top_n.testing=1000",
)
MASK_HEAD = (
    "~model.roi_heads.mask_roi_pool",
    "~model.roi_heads.mask_head",
    "~model.roi_heads.mask_predictor",
)
# The exported models are small (two FPN levels and the pool level, one mask conv): export, ONNX conversion
# and AOTInductor's compile times follow the size of the graph, and the code paths are those of the recipe's
# four levels. The AOTInductor package is compiled at -O0 (`aot_inductor.debug_compile`): the same kernels,
# less C++ optimisation.
SMALL = (
    *OVERRIDES,
    "model.backbone.returned_layers=[3,4]",
    "model.rpn.anchor_generator.sizes=[32,64,128]",
    "model.roi_heads.box_roi_pool.featmap_names=['0','1']",
    "model.roi_heads.mask_roi_pool.featmap_names=['0','1']",
    "model.roi_heads.mask_head.layers=[64]",
)
EXAMPLE_SIZE = (128, 160)
# Other aspect ratios (wide, tall), one larger than the example on both sides, and a small one (fewer
# proposals than the example's 1000).
SIZES = [EXAMPLE_SIZE, (96, 200), (200, 120), (192, 224), (72, 96)]
# The original sizes the detections are asked in: larger, the input's own, smaller, other aspect ratios.
ORIGINAL_SIZES = [(256, 320), (96, 200), (100, 60), (240, 200), (72, 130)]


def _image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    return make_record(height, width, seed=seed)["image"]


def _build(overrides: tuple[str, ...] = SMALL, loss=None):
    torch.manual_seed(0)
    cfg = load_model_config(overrides=overrides)
    if loss is not None:
        cfg.model.roi_heads.box_predictor.loss = loss
    model = instantiate(cfg.model).eval()
    if model.roi_heads.has_mask():
        # At random init every mask probability lies within 0.5 +- 0.015 (a third of the pixels within 1e-3
        # of the threshold), where any reordering of float sums flips pixels (3% with AOTInductor's kernels).
        # Trained heads are far from that; logits scaled by 10 are too (by 100, rounding differences grow
        # with them).
        with torch.no_grad():
            for parameter in model.roi_heads.mask_predictor.parameters():
                parameter.mul_(10.0)
    return model


def _export_program(model, example: torch.Tensor):
    """Export with torch's deprecation notices as errors: the default path must not use deprecated APIs."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        return export_program(model, example)


def _export_onnx(program, file) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        return export_onnx(program, str(file))


def _image_without_detections() -> torch.Tensor:
    """A flat grey image: the random-init model scores all its detections below those of `images`."""
    return torch.full((3, 96, 112), 120, dtype=torch.uint8)


@pytest.fixture(scope="module")
def images():
    return [_image(height, width, seed) for seed, (height, width) in enumerate(SIZES)]


@pytest.fixture(scope="module")
def mask_model(images):
    """The SMALL mask model with its score threshold between the best score of `_image_without_detections`
    and the 20th best of each of `images`: one model (and one export of it) gives 20 detections on every
    image of `images` and none on the grey one."""
    model = _build()
    wrapper = ExportableRCNN(model)
    with torch.no_grad():
        best_of_grey = float(wrapper(_image_without_detections())[1].max())
        lowest_kept = min(float(wrapper(image)[1].min()) for image in images)
    assert best_of_grey < lowest_kept, (best_of_grey, lowest_kept)  # the premise of every test here
    model.roi_heads.score_thresh = (best_of_grey + lowest_kept) / 2
    return model


@pytest.fixture(scope="module")
def exported(mask_model, tmp_path_factory):
    """model.pt2 and model.onnx of the mask model, written and loaded back."""
    directory = tmp_path_factory.mktemp("exports")
    program = _export_program(mask_model, _image(*EXAMPLE_SIZE))
    files = {
        "program": save_program(program, str(directory / "model.pt2")),
        "onnx": _export_onnx(program, directory / "model.onnx"),
    }
    return program, files


@pytest.fixture(scope="module")
def loaded(exported):
    """`exported`'s files, each loaded once with `load_exported` (a file's load takes as long as a run of
    every test that shares it)."""
    return {target: load_exported(file) for target, file in exported[1].items()}


LOADERS = {"program": load_program, "onnx": load_onnx}


def _proposal_counts(model, images) -> list[int]:
    counts = []
    hook = model.roi_heads.box_roi_pool.register_forward_pre_hook(
        lambda module, args: counts.append(args[1][0].shape[0])
    )
    try:
        with torch.no_grad():
            for image in images:
                model.detect([image.float()])
    finally:
        hook.remove()
    return counts


# ---------------------------------------------------------------- the wrapper


def test_wrapper_equals_the_model_in_the_original_size(mask_model, images):
    wrapper = ExportableRCNN(mask_model)
    assert wrapper.output_names == ("boxes", "scores", "classes", "masks")
    with torch.no_grad():
        for image, (height, width) in zip(images, ORIGINAL_SIZES):
            (output,) = mask_model([{"image": image, "height": height, "width": width}])
            got = dict(zip(wrapper.output_names, wrapper(image, torch.tensor([height, width]))))
            instances = output["instances"]
            assert len(got["scores"]) == 20
            for name in wrapper.output_names:
                assert torch.equal(got[name], instances[name]), name
            assert got["masks"].shape == (20, height, width) and got["masks"].dtype == torch.uint8
            assert got["classes"].dtype == torch.int64 and set(got["classes"].tolist()) <= {0, 1, 2}
            # Without original_size: the input image's own pixels.
            (output,) = mask_model([{"image": image}])
            for name, value in zip(wrapper.output_names, wrapper(image)):
                assert torch.equal(value, output["instances"][name]), name


@needs_torch_export
def test_wrapper_needs_an_eval_mode_rcnn_and_keeps_its_mode(mask_model, exported):
    with pytest.raises(TypeError, match=r"ExportableRCNN\(model=\) must be a lazytrain.modeling.RCNN"):
        ExportableRCNN(torch.nn.Linear(2, 2))
    assert not mask_model.training  # after the `exported` fixture's export
    mask_model.train()
    try:
        with pytest.raises(ValueError, match=r"needs the model in eval mode .* Call model.eval\(\)"):
            ExportableRCNN(mask_model)
    finally:
        mask_model.eval()
    wrapper = ExportableRCNN(mask_model)
    assert not wrapper.training
    wrapper.train()  # reaches the shared model, whose inference path then refuses to run
    try:
        with pytest.raises(ValueError, match=r"RCNN.detect\(\) runs the inference path .* Call model.eval"):
            wrapper(_image(64, 64))
    finally:
        wrapper.eval()


@pytest.mark.parametrize(
    "image",
    [
        pytest.param(torch.zeros(1, 3, 64, 64, dtype=torch.uint8), id="batch"),
        pytest.param(torch.zeros(3, 64, 64), id="float"),
        pytest.param(torch.zeros(64, 64, 3, dtype=torch.uint8), id="hwc"),
    ],
)
def test_wrapper_and_exporters_take_one_uint8_chw_image(mask_model, image, tmp_path):
    with pytest.raises(ValueError, match=r"forward\(image=\) must be ONE uint8 \[3, H, W\] RGB image"):
        ExportableRCNN(mask_model)(image)
    with pytest.raises(ValueError, match=r"export_program\(example_image=\) must be ONE uint8"):
        export_program(mask_model, image)
    with pytest.raises(ValueError, match=r"export_torchscript\(example_image=\) must be ONE uint8"):
        export_torchscript(mask_model, image, str(tmp_path / "model.ts"))


def test_wrapper_takes_the_original_size_as_int64_height_and_width(mask_model):
    with pytest.raises(
        ValueError, match=r"original_size=\) must be an int64 tensor \[2\] .* got torch.float32"
    ):
        ExportableRCNN(mask_model)(_image(64, 64), torch.tensor([64.0, 64.0]))


# ---------------------------------------------------------------- exports reproduce the model


@needs_torch_export
@pytest.mark.parametrize("target", list(LOADERS))
def test_exports_reproduce_the_model_on_other_sizes(target, loaded, mask_model, images):
    assert len(set(_proposal_counts(mask_model, images))) > 1  # the premise: counts differ from the example's
    loaded = loaded[target].detector  # what the target's loader (load_program, load_onnx) returned
    report = check_parity(ExportableRCNN(mask_model), loaded, images, ORIGINAL_SIZES)
    assert report.num_images == 5 and report.num_detections == 100 and report.num_unmatched == 0
    # Measured: the ExportedProgram exactly 0 (the same kernels); onnxruntime boxes <= 4e-5 px, scores <= 1e-7.
    assert report.max_box_diff <= 1e-3 and report.max_score_diff <= 1e-5
    assert report.min_mask_agreement >= 0.999
    boxes, scores, classes, masks = loaded(images[3], torch.tensor([240, 200]))
    assert boxes.shape == (20, 4) and boxes.dtype == torch.float32 and scores.dtype == torch.float32
    assert classes.dtype == torch.int64 and masks.dtype == torch.uint8 and masks.shape == (20, 240, 200)
    assert float(boxes[:, 2].max()) <= 200 and float(boxes[:, 3].max()) <= 240


@needs_torch_export
def test_exports_declare_dynamic_sizes_and_the_tested_opset(exported):
    program, files = exported
    # The FPN's coarsest level (stride 64) must be larger than one pixel: padded to 96, at least 65 px.
    assert input_size_range(program) == {"height": [65, None], "width": [65, None]}
    model = onnx.load(files["onnx"])
    assert [opset.version for opset in model.opset_import if opset.domain in ("", "ai.onnx")] == [ONNX_OPSET]
    assert TESTED_VERSIONS["opset"] == ONNX_OPSET
    dims = {
        value.name: value.type.tensor_type.shape.dim for value in [*model.graph.input, *model.graph.output]
    }
    assert list(dims) == ["image", "original_size", "boxes", "scores", "classes", "masks"]
    assert dims["image"][0].dim_value == 3 and all(d.dim_param for d in dims["image"][1:])
    assert [d.dim_value for d in dims["original_size"]] == [2]
    assert all(d.dim_param for d in dims["masks"])


@needs_torch_export
def test_load_exported_runs_a_file_as_the_model_runs_a_record(exported, loaded, mask_model, images):
    record = {"image": images[2], "height": 100, "width": 60}
    with torch.no_grad():
        (expected,) = mask_model([record])
    for target, file in exported[1].items():
        model = loaded[target]  # load_exported(file)
        assert isinstance(model, ExportedModel) and file in repr(model) and model.limits is None
        (got,) = model([record])
        assert got["instances"].keys() == expected["instances"].keys()
        assert torch.allclose(got["instances"]["boxes"], expected["instances"]["boxes"], atol=1e-3)
        assert got["instances"]["masks"].shape == (20, 100, 60)


def _one_line_error(error_type, file: str, match: str) -> None:
    with pytest.raises(error_type, match=match) as info:
        load_exported(file)
    assert "\n" not in str(info.value)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:FutureWarning:torch")
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning:torch")
def test_load_exported_says_in_one_line_what_a_file_is_and_what_it_takes(tmp_path):
    _one_line_error(FileNotFoundError, str(tmp_path / "missing.pt2"), "missing.pt2 not found")
    (tmp_path / "notes.pt2").write_bytes(b"not an archive")
    _one_line_error(
        ValueError, str(tmp_path / "notes.pt2"), r"neither an ONNX file \(.onnx\) nor a .pt2 archive"
    )
    linear = torch.nn.Linear(2, 2)
    torch.save({"model": linear.state_dict()}, tmp_path / "model_final.pth")
    assert get_file_kind(str(tmp_path / "model_final.pth")) == "checkpoint"
    checkpoint = (
        r"model_final.pth is a PyTorch checkpoint \(weights saved by torch.save\), not an exported model"
    )
    _one_line_error(ValueError, str(tmp_path / "model_final.pth"), checkpoint)
    torch.jit.save(torch.jit.script(linear), str(tmp_path / "model.ts"))
    _one_line_error(ValueError, str(tmp_path / "model.ts"), "legacy TorchScript file")
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07 truncated")
    _one_line_error(
        ValueError, str(tmp_path / "model.onnx"), r"looks like an ONNX model but does not load \("
    )


@needs_torch_export
def test_load_exported_refuses_a_damaged_program_in_one_line(exported, tmp_path):
    with (
        zipfile.ZipFile(exported[1]["program"]) as source,
        zipfile.ZipFile(tmp_path / "model.pt2", "w") as copy,
    ):
        for name in source.namelist():
            if "/weights/" not in name:  # the weights lost on the way
                copy.writestr(name, source.read(name))
    assert get_file_kind(str(tmp_path / "model.pt2")) == "program"
    match = r"looks like a torch.export ExportedProgram but does not load \(.*export it again"
    _one_line_error(ValueError, str(tmp_path / "model.pt2"), match)


def _fixed_detector(scores):
    """A `Detector` returning one box per score, in the given order, classes 0, 1, 2, ..."""
    scores = torch.tensor(scores)
    boxes = torch.arange(len(scores), dtype=torch.float32)[:, None].repeat(1, 4) + torch.tensor([0, 0, 5, 5])
    return lambda image, size: (boxes, scores, torch.arange(len(scores)))


def test_exported_model_keeps_the_best_detections_above_the_asked_threshold():
    model = ExportedModel(_fixed_detector([0.2, 0.9, 0.05, 0.6, 0.6]), "model.pt2")
    record = {"image": torch.zeros(3, 8, 8, dtype=torch.uint8)}
    assert model([record])[0]["instances"]["scores"].tolist() == pytest.approx([0.2, 0.9, 0.05, 0.6, 0.6])
    model.limit(0.1, 10)
    (got,) = model([record])
    assert got["instances"]["scores"].tolist() == pytest.approx([0.9, 0.6, 0.6, 0.2])
    assert got["instances"]["classes"].tolist() == [1, 3, 4, 0]  # best first; ties keep the file's order
    assert got["instances"]["boxes"][:, 0].tolist() == [1, 3, 4, 0]
    model.limit(0.6, 10)  # kept: scoring above the threshold, as RoIHeads keeps them
    assert model([record])[0]["instances"]["classes"].tolist() == [1]
    model.limit(0.0, 2)
    assert model([record])[0]["instances"]["classes"].tolist() == [1, 3]


@pytest.mark.parametrize(
    ("score_thresh", "count", "message"),
    [
        pytest.param(0.001, 10, r"model.roi_heads.score_thresh=0.001 is below the threshold 0.01 that "
                     r"model.pt2 \(model.json beside it\) applies itself.*>= 0.01, or export again", id="below"),
        pytest.param(0.5, 101, r"model.roi_heads.detections_per_img=101 is more than the 100 detections per image "
                     r"that model.pt2 .* keeps", id="more"),
        pytest.param(-0.5, 10, r"limit\(score_thresh=\) must be in \[0, 1\].*got -0.5", id="negative"),
        pytest.param(0.5, 0, r"limit\(detections_per_img=\) must be an int >= 1.*got 0", id="zero"),
        pytest.param(0.5, 2.5, r"limit\(detections_per_img=\) must be an int >= 1.*got 2.5", id="fraction"),
    ],
)  # fmt: skip
def test_exported_model_refuses_what_the_file_cannot_honour(score_thresh, count, message):
    model = ExportedModel(
        _fixed_detector([0.9]), "runs/a/export/model.pt2", built_in=DetectionLimits(0.01, 100)
    )
    with pytest.raises(ValueError, match=message):
        model.limit(score_thresh, count)
    assert model.limits is None
    model.limit(0.01, 100)  # the file's own limits: honoured
    assert model.limits == DetectionLimits(0.01, 100)


def test_built_in_limits_are_read_from_model_json_beside_the_file(tmp_path):
    file = str(tmp_path / "model.onnx")
    assert read_built_in_limits(file) is None
    (tmp_path / "model.json").write_text(
        '{"applied_in_the_file": {"score_thresh": 0.001, "detections_per_img": 300}}'
    )
    assert read_built_in_limits(file) == DetectionLimits(0.001, 300)


@needs_torch_export
@pytest.mark.parametrize("target", list(LOADERS))
def test_a_limited_export_gives_the_eager_models_detections_at_a_higher_threshold(
    target, exported, loaded, mask_model, images
):
    # The file keeps 20 detections down to score 0; asked for fewer, above a threshold in the middle of its
    # scores, it returns what the eager model returns with those keys. (A model of its own around the shared
    # loaded file, so that its limits stay in this test.)
    model = ExportedModel(loaded[target].detector, exported[1][target])
    record = {"image": images[3], "height": 240, "width": 200}
    scores = model([record])[0]["instances"]["scores"]
    threshold = float(scores.median())
    model.limit(threshold, 6)
    roi_heads = mask_model.roi_heads
    kept = (roi_heads.score_thresh, roi_heads.detections_per_img)
    roi_heads.score_thresh, roi_heads.detections_per_img = threshold, 6
    try:
        with torch.no_grad():
            (expected,) = mask_model([record])
    finally:
        roi_heads.score_thresh, roi_heads.detections_per_img = kept
    (got,) = model([record])
    expected, got = expected["instances"], got["instances"]
    assert len(got["scores"]) == len(expected["scores"]) == 6 and float(got["scores"].min()) > threshold
    torch.testing.assert_close(got["scores"], expected["scores"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["boxes"], expected["boxes"], atol=1e-3, rtol=0)
    assert torch.equal(got["classes"], expected["classes"])


QUICK_AOTI = {"aot_inductor.debug_compile": True}


@pytest.fixture(scope="module")
def aoti_package(mask_model, tmp_path_factory):
    """The mask model as an AOTInductor package, compiled from an export of its own: after `exported`'s ONNX
    conversion of its program, AOTInductor fails on that program (`export_aoti` says why)."""
    program = _export_program(mask_model, _image(*EXAMPLE_SIZE))
    file = str(tmp_path_factory.mktemp("aoti") / "model_aoti.pt2")
    return export_aoti(program, file, inductor_configs=QUICK_AOTI)


@needs_torch_export
@pytest.mark.slow
@pytest.mark.parametrize("target", ["program", "aoti", "onnx"])
def test_every_target_gives_an_image_without_detections_and_reproduces_the_model(
    target, loaded, mask_model, images, request
):
    # torchvision's shape-only nms said ">= 2 kept boxes": such a program failed at run time on the grey image.
    if target == "aoti":
        detector = load_aoti(request.getfixturevalue("aoti_package"))
    else:
        detector = loaded[target].detector  # load_program's, load_onnx's
    grey = _image_without_detections()
    boxes, scores, classes, masks = detector(grey, torch.tensor([50, 60]))
    assert boxes.shape == (0, 4) and scores.shape == classes.shape == (0,)
    assert masks.shape == (0, 50, 60)
    checked, sizes = [images[0], grey, *images[1:3]], [(256, 256), (96, 112), (48, 100), (300, 180)]
    report = check_parity(ExportableRCNN(mask_model), detector, checked, sizes)
    assert report.num_detections == 60 and report.max_box_diff <= 1e-3 and report.max_score_diff <= 1e-5
    assert report.min_mask_agreement >= 0.99


@needs_torch_export
@pytest.mark.slow
def test_load_exported_runs_an_aoti_package_with_the_limits_beside_it(
    aoti_package, mask_model, images, tmp_path
):
    assert get_file_kind(aoti_package) == "aoti"
    package = tmp_path / "model_aoti.pt2"
    package.symlink_to(aoti_package)
    (tmp_path / "model.json").write_text(
        '{"applied_in_the_file": {"score_thresh": 0.2, "detections_per_img": 20}}'
    )
    loaded = load_exported(str(package))
    assert isinstance(loaded, ExportedModel) and loaded.built_in == DetectionLimits(0.2, 20)
    with pytest.raises(ValueError, match="more than the 20 detections per image that model_aoti.pt2"):
        loaded.limit(0.5, 21)
    loaded.limit(mask_model.roi_heads.score_thresh, 3)
    (got,) = loaded([{"image": images[0]}])
    with torch.no_grad():
        (expected,) = mask_model([{"image": images[0]}])
    assert len(got["instances"]["scores"]) == 3 and len(expected["instances"]["scores"]) == 20
    torch.testing.assert_close(
        got["instances"]["scores"], expected["instances"]["scores"][:3], atol=1e-5, rtol=0
    )


def _run_program(program):
    """`program` in memory as a `Detector` (what `load_program` returns for its file)."""
    module = program.module()

    def detect(image: torch.Tensor, original_size: torch.Tensor | None = None):
        size = torch.tensor(list(image.shape[1:])) if original_size is None else original_size
        with torch.no_grad():
            return tuple(module(image, size))

    return detect


@pytest.mark.slow
@needs_torch_export
def test_box_only_sigmoid_scoring_model_exports_three_outputs(tmp_path, images):
    model = _build((*SMALL, *MASK_HEAD), loss=L(EQLv2Loss)(num_classes=3))
    assert not model.roi_heads.has_mask()
    assert model.roi_heads.get_classification_loss().activation == "sigmoid"
    wrapper = ExportableRCNN(model)
    assert wrapper.output_names == ("boxes", "scores", "classes")
    program = _export_program(model, _image(*EXAMPLE_SIZE))
    onnx_file = _export_onnx(program, tmp_path / "model.onnx")
    # The program as it was exported (saving and loading a program is the mask model's tests' part).
    detectors = {"program": _run_program(program), "onnx": load_onnx(onnx_file)}
    for loaded in detectors.values():
        assert len(loaded(images[1])) == 3
        report = check_parity(wrapper, loaded, images[1:], ORIGINAL_SIZES[1:])
        assert report.min_mask_agreement is None and report.num_detections == 80
        assert report.max_box_diff <= 1e-3 and report.max_score_diff <= 1e-5
    outputs = [output.name for output in onnx.load(onnx_file).graph.output]
    assert outputs == ["boxes", "scores", "classes"]


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:FutureWarning:torch")
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning:torch")
def test_legacy_torchscript_still_exports_in_the_input_images_pixels(mask_model, images, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)  # lazytrain's code must trace cleanly
        file = export_torchscript(mask_model, _image(*EXAMPLE_SIZE), str(tmp_path / "model.ts"))
    loaded = load_torchscript(file)
    report = check_parity(ExportableRCNN(mask_model), loaded, images)
    assert report.num_detections == 100 and report.max_box_diff == 0.0 and report.num_unmatched == 0
    with pytest.raises(ValueError, match=r"TorchScript export gives detections in the input image's pixels"):
        loaded(images[0], torch.tensor([256, 320]))


def test_export_program_names_the_torch_it_needs(mask_model, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    with pytest.raises(
        RuntimeError, match=r"export_program\(\) needs torch >= 2.14 .* this machine has torch 2.11"
    ):
        export_program(mask_model, _image(*EXAMPLE_SIZE))


# ---------------------------------------------------------------- the parts changed for export


def test_box_decoding_equals_torchvisions_without_a_branch_on_the_count():
    torch.manual_seed(0)
    proposals = [torch.rand(5, 2).repeat(1, 2) * 50 + torch.tensor([0, 0, 10, 10]), torch.zeros(0, 4)]
    codes = torch.randn(5, 12)
    weights = (10.0, 10.0, 5.0, 5.0)
    expected = det_utils.BoxCoder(weights).decode(codes, proposals)
    assert torch.equal(BoxCoder(weights).decode(codes, proposals), expected)
    empty = BoxCoder(weights).decode(torch.zeros(0, 12), [torch.zeros(0, 4)])
    assert empty.shape == (0, 3, 4)  # torchvision's is [0, 12]


# ---------------------------------------------------------------- optional packages


@needs_torch_export
def test_missing_onnx_packages_name_the_extra(exported, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    extra = r'pip install "lazytrain\[export\]"'
    with pytest.raises(
        ImportError, match=rf"export.export_onnx\(\) needs 'onnx', which is not installed.*{extra}"
    ):
        export_onnx(exported[0], str(tmp_path / "model.onnx"))
    with pytest.raises(
        ImportError, match=rf"exported.load_onnx\(\) needs 'onnxruntime', which is not.*{extra}"
    ):
        load_onnx(str(tmp_path / "model.onnx"))


def test_wrapper_drops_empty_detections_as_the_model_does():
    # RCNN(drop_empty_detections=True) drops boxes empty once scaled and clipped to the original size; the
    # exported model did not (its boxes differ from the eager model's by those detections).
    model = _build()
    model.drop_empty_detections = True
    generator = torch.Generator().manual_seed(0)
    detection = {
        # input 128 x 160, original 256 x 320: the 2nd box has no width, the 3rd lies right of the image.
        "boxes": torch.tensor([[0.0, 0, 10, 10], [5, 5, 5, 9], [170, 10, 190, 20], [20, 30, 60, 50]]),
        "scores": torch.tensor([0.9, 0.8, 0.7, 0.6]),
        "labels": torch.tensor([1, 2, 3, 1]),
        "masks": torch.rand(4, 1, 28, 28, generator=generator),
    }
    image = _image(*EXAMPLE_SIZE)
    expected = model._to_original_size(detection, EXAMPLE_SIZE, {"height": 256, "width": 320})
    got = ExportableRCNN(model)._in_original_size(detection, image, torch.tensor([256, 320]))
    assert expected["scores"].tolist() == pytest.approx([0.9, 0.6])
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
