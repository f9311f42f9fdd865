"""Model export: the single-image wrapper equals the model, and TorchScript and ONNX exports reproduce it on
image sizes, aspect ratios and detection counts other than the example's."""

import sys
import warnings

import onnx
import pytest
import torch

from lazytrain.config import LazyCall as L
from lazytrain.config import instantiate
from lazytrain.modeling import EQLv2Loss, FederatedLoss
from lazytrain.modeling.export import (
    ONNX_OPSET,
    TESTED_VERSIONS,
    ExportableRCNN,
    check_parity,
    export_onnx,
    export_torchscript,
    load_onnx,
    load_torchscript,
)
from tests.modeling.helpers import load_model_config, make_record

# torch deprecates TorchScript and its ONNX exporter (lazytrain.modeling.export says why it still uses them);
# those notices are expected here, every other warning still shows.
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:FutureWarning:torch"),
    pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning:torch"),
    pytest.mark.filterwarnings(
        "ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning"
    ),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning:torch.onnx"),
]

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
EXAMPLE_SIZE = (128, 160)
# Other aspect ratios (wide, tall), one larger than the example on both sides, and a small one (fewer
# proposals than the example's 1000).
SIZES = [EXAMPLE_SIZE, (96, 200), (200, 120), (192, 224), (64, 96)]
EXPORTERS = {"torchscript": (export_torchscript, load_torchscript), "onnx": (export_onnx, load_onnx)}


def _image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    return make_record(height, width, seed=seed)["image"]


def _build(overrides: tuple[str, ...] = OVERRIDES, loss=None):
    torch.manual_seed(0)
    cfg = load_model_config(overrides=overrides)
    if loss is not None:
        cfg.model.roi_heads.box_predictor.loss = loss
    return instantiate(cfg.model).eval()


def _export(kind: str, model, example: torch.Tensor, directory) -> str:
    """Export, with trace warnings from lazytrain's code as errors (the exporters silence torchvision's)."""
    export, _ = EXPORTERS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        return export(model, example, str(directory / f"model.{kind}"))


@pytest.fixture(scope="module")
def mask_model():
    return _build()


@pytest.fixture(scope="module")
def images():
    return [_image(height, width, seed) for seed, (height, width) in enumerate(SIZES)]


@pytest.fixture(scope="module")
def exported_files(mask_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("exports")
    return {kind: _export(kind, mask_model, _image(*EXAMPLE_SIZE), directory) for kind in EXPORTERS}


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


def test_wrapper_equals_the_model_at_the_input_size(mask_model, images):
    wrapper = ExportableRCNN(mask_model)
    assert wrapper.output_names == ("boxes", "scores", "classes", "masks")
    with torch.no_grad():
        for image in images:
            height, width = image.shape[1:]
            (output,) = mask_model([{"image": image, "height": height, "width": width}])
            got = dict(zip(wrapper.output_names, wrapper(image)))
            instances = output["instances"]
            assert len(got["scores"]) == 20
            for name in wrapper.output_names:
                assert torch.equal(got[name], instances[name]), name
            assert got["masks"].shape == (20, height, width) and got["masks"].dtype == torch.uint8
            assert got["classes"].dtype == torch.int64 and set(got["classes"].tolist()) <= {0, 1, 2}


def test_wrapper_needs_an_eval_mode_rcnn_and_keeps_its_mode(mask_model, tmp_path):
    with pytest.raises(TypeError, match=r"ExportableRCNN\(model=\) must be a lazytrain.modeling.RCNN"):
        ExportableRCNN(torch.nn.Linear(2, 2))
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
    # torch.onnx.export restores the module's mode with train(mode): the model must come back in eval.
    _export("onnx", mask_model, _image(96, 96), tmp_path)
    assert not mask_model.training


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
    with pytest.raises(ValueError, match=r"export_torchscript\(example_image=\) must be ONE uint8"):
        export_torchscript(mask_model, image, str(tmp_path / "model.ts"))


# ---------------------------------------------------------------- exports reproduce the model


@pytest.mark.parametrize("kind", list(EXPORTERS))
def test_exports_reproduce_the_model_on_other_sizes(kind, exported_files, mask_model, images):
    assert len(set(_proposal_counts(mask_model, images))) > 1  # the premise: counts differ from the example's
    loaded = EXPORTERS[kind][1](exported_files[kind])
    report = check_parity(ExportableRCNN(mask_model), loaded, images)
    assert report.num_images == 5 and report.num_detections == 100 and report.num_unmatched == 0
    # Measured: TorchScript exactly 0 (the same kernels); onnxruntime boxes <= 4e-5 px, scores <= 1e-6.
    assert report.max_box_diff <= 1e-3 and report.max_score_diff <= 1e-5
    assert report.min_mask_agreement >= 0.999
    assert "parity on 5 images (100 detections)" in str(report)
    boxes, scores, classes, masks = loaded(images[3])
    assert boxes.shape == (20, 4) and boxes.dtype == torch.float32 and scores.dtype == torch.float32
    assert classes.dtype == torch.int64 and masks.dtype == torch.uint8 and masks.shape == (20, 192, 224)
    assert float(boxes[:, 2].max()) <= 224 and float(boxes[:, 3].max()) <= 192


def test_onnx_file_declares_dynamic_sizes_and_the_tested_opset(exported_files):
    model = onnx.load(exported_files["onnx"])
    assert [opset.version for opset in model.opset_import if opset.domain in ("", "ai.onnx")] == [ONNX_OPSET]
    assert TESTED_VERSIONS["opset"] == ONNX_OPSET
    dims = {
        value.name: value.type.tensor_type.shape.dim for value in [*model.graph.input, *model.graph.output]
    }
    assert list(dims) == ["image", "boxes", "scores", "classes", "masks"]
    assert [d.dim_value or d.dim_param for d in dims["image"]] == [3, "height", "width"]
    assert [d.dim_param for d in dims["masks"]] == ["detections", "height", "width"]
    assert {dims[name][0].dim_param for name in ("boxes", "scores", "classes")} == {"detections"}


@pytest.mark.parametrize("kind", list(EXPORTERS))
def test_an_image_without_detections_through_a_graph_traced_with_some(kind, tmp_path):
    # score_thresh is frozen into the graph: put it between the best scores of two images, export with the
    # one above it, then run the one below it.
    model = _build()
    first, second = _image(128, 128, seed=5), torch.zeros(3, 96, 112, dtype=torch.uint8)
    wrapper = ExportableRCNN(model)
    with torch.no_grad():
        best = [float(wrapper(image)[1].max()) for image in (first, second)]
    assert best[0] != best[1]
    model.roi_heads.score_thresh = sum(best) / 2
    high, low = (first, second) if best[0] > best[1] else (second, first)
    loaded = EXPORTERS[kind][1](_export(kind, model, high, tmp_path))
    boxes, scores, classes, masks = loaded(low)
    assert boxes.shape == (0, 4) and scores.shape == classes.shape == (0,)
    assert masks.shape == (0, *low.shape[1:])
    report = check_parity(wrapper, loaded, [high, low])
    assert report.num_detections == len(wrapper(high)[0]) > 0


def test_box_only_model_exports_three_outputs(tmp_path, images):
    model = _build((*OVERRIDES, *MASK_HEAD))
    assert not model.roi_heads.has_mask()
    wrapper = ExportableRCNN(model)
    assert wrapper.output_names == ("boxes", "scores", "classes")
    for kind, (_, load) in EXPORTERS.items():
        loaded = load(_export(kind, model, _image(*EXAMPLE_SIZE), tmp_path))
        assert len(loaded(images[1])) == 3
        report = check_parity(wrapper, loaded, images[1:])
        assert report.min_mask_agreement is None and report.num_detections == 80
        assert report.max_box_diff <= 1e-3 and report.max_score_diff <= 1e-5
    assert [output.name for output in onnx.load(str(tmp_path / "model.onnx")).graph.output] == [
        "boxes",
        "scores",
        "classes",
    ]


@pytest.mark.parametrize(
    "loss",
    [
        pytest.param(L(FederatedLoss)(num_classes=3, class_image_counts=[5, 3, 1]), id="federated"),
        pytest.param(L(EQLv2Loss)(num_classes=3), id="eqlv2"),
    ],
)
def test_sigmoid_scoring_model_exports_with_parity(loss, tmp_path, images):
    model = _build(loss=loss)
    assert model.roi_heads.get_classification_loss().activation == "sigmoid"
    wrapper = ExportableRCNN(model)
    loaded = load_onnx(_export("onnx", model, _image(*EXAMPLE_SIZE), tmp_path))
    report = check_parity(wrapper, loaded, images[1:])
    assert report.num_detections == 80 and report.max_score_diff <= 1e-5 and report.max_box_diff <= 1e-3


# ---------------------------------------------------------------- check_parity


def _perturbed(wrapper, change):
    def detect(image):
        with torch.no_grad():
            return change(list(wrapper(image)))

    return detect


def _shift_boxes(outputs):
    outputs[0] = outputs[0] + torch.tensor([0.5, 0.0, 0.0, 0.0])
    return outputs


def _raise_scores(outputs):
    outputs[1] = outputs[1] + 0.01
    return outputs


def _drop_best_seven(outputs):
    return [t[7:] for t in outputs]


def _relabel_best_four(outputs):
    outputs[2] = outputs[2].clone()
    outputs[2][:4] = (outputs[2][:4] + 1) % 3
    return outputs


def _flip_mask_pixels(outputs):
    outputs[3] = outputs[3].clone()
    outputs[3][0, :40, :40] ^= 1
    return outputs


FIRST = r"First, image 0: detection 0 \(class \d, score 0.\d+\)"
NO_OVERLAP = "has no detection of its class overlapping it"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            _shift_boxes,
            r"40 detections of 40 \(both outputs\) have no match within box_atol=0.05 and score_atol=0.0005, "
            rf"more than max_unmatched=0.01 \(and 6\) allow. {FIRST}: boxes differ by 0.5 px and scores by 0 "
            r"from the export's detection 0",
            id="boxes",
        ),
        pytest.param(
            _raise_scores,
            rf"40 detections of 40 .* {FIRST}: boxes differ by 0 px and scores by 0.01",
            id="scores",
        ),
        pytest.param(_drop_best_seven, rf"7 detections of 33 .* {FIRST} {NO_OVERLAP}", id="missing"),
        pytest.param(_relabel_best_four, rf"8 detections of 40 .* {FIRST} {NO_OVERLAP}", id="classes"),
        pytest.param(
            _flip_mask_pixels, r"image 0: masks agree on \d+.\d+% of their pixels, less than", id="masks"
        ),
        pytest.param(
            lambda outputs: outputs[:3],
            r"image 0: the reference returns 4 outputs, the export 3",
            id="outputs",
        ),
    ],
)
def test_check_parity_names_the_image_and_the_quantity_out_of_tolerance(mask_model, images, change, message):
    wrapper = ExportableRCNN(mask_model)
    with pytest.raises(ValueError, match=rf"check_parity: {message}"):
        check_parity(wrapper, _perturbed(wrapper, change), images[:1])


def test_check_parity_matches_swapped_detections_and_allows_a_few_unmatched(mask_model, images):
    wrapper = ExportableRCNN(mask_model)

    def swap_two_and_drop_worst_four(outputs):
        order = torch.tensor([1, 0, *range(2, len(outputs[0]) - 4)])
        return [t[order] for t in outputs]

    report = check_parity(wrapper, _perturbed(wrapper, swap_two_and_drop_worst_four), images[:1])
    assert report.num_detections == 20 and report.num_unmatched == 4
    assert report.max_box_diff == report.max_score_diff == 0.0 and report.min_mask_agreement == 1.0
    assert str(report).endswith("masks agree on 100.0000%, 4 unmatched (ties)")
    # Above the floor of 6, the share decides: 8 of 192 detections is 4.2%.
    drops = iter([8, 0, 0, 0, 0] * 2)  # in the first of the five images, for each of the two calls

    def drop_worst(outputs):
        count = len(outputs[0]) - next(drops)
        return [t[:count] for t in outputs]

    eight = _perturbed(wrapper, drop_worst)
    assert check_parity(wrapper, eight, images[:5], max_unmatched=0.05).num_unmatched == 8
    with pytest.raises(ValueError, match=r"8 detections of 192 .* more than max_unmatched=0.03"):
        check_parity(wrapper, eight, images[:5], max_unmatched=0.03)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param({"box_atol": -1.0}, r"check_parity\(box_atol=\) must be >= 0; got -1.0", id="box"),
        pytest.param({"mask_agreement": 1.5}, r"\(mask_agreement=\) must be a share in \[0, 1\]", id="mask"),
        pytest.param(
            {"max_unmatched": -0.1}, r"check_parity\(max_unmatched=\) must be a share", id="unmatched"
        ),
    ],
)
def test_check_parity_rejects_bad_tolerances(arguments, message):
    with pytest.raises(ValueError, match=message):
        check_parity(None, None, [], **arguments)


# ---------------------------------------------------------------- optional packages


def test_missing_onnx_packages_name_the_extra(mask_model, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    extra = r'pip install "lazytrain\[export\]"'
    with pytest.raises(ImportError, match=rf"export_onnx\(\) needs the 'onnx' package.*{extra}"):
        export_onnx(mask_model, _image(64, 64), str(tmp_path / "model.onnx"))
    with pytest.raises(ImportError, match=rf"load_onnx\(\) needs the 'onnxruntime' package.*{extra}"):
        load_onnx(str(tmp_path / "model.onnx"))
