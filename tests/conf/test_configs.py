"""Every runnable config loads, validates, instantiates on CPU and trains 2 iterations in a smoke setting,
on small stand-in data laid out as the real data set (generated here, nothing downloaded: the ImageNet
weights the R50 recipes start from are stood in for by a small file served from 127.0.0.1)."""

import json
import math
import os
import shutil

import pytest
import torch
from torchvision.models import resnet50

from lazytrain.config import LazyConfig, instantiate, validate
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.modeling import suppression
from lazytrain.program.default import INJECTED_ARGUMENTS, run
from lazytrain.program.preflight.backends import find_backend_problems
from lazytrain.program.preflight.builtin_data import find_missing_data
from lazytrain.program.preflight.json_data import find_json_dataset_problems
from tests.smoke import FEW_PROPOSALS, TINY_SYNTHETIC_LT, lsj_smoke_overrides, smoke_overrides

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(
    f for f in os.listdir(os.path.join(REPO, "conf")) if f.endswith(".py") and f != "__init__.py"
)
# torchvision's ResNet50_Weights.IMAGENET1K_V1, the backbone of its own Mask R-CNN (torchvision/models/resnet.py).
IMAGENET_R50 = "https://download.pytorch.org/models/resnet50-0676ba61.pth"
# The CPU-sized demos (ResNet-18s with trainable BN) start from scratch on purpose.
RANDOM_INIT = {
    "rfs_maskrcnn_demo.py",
    "cascade_maskrcnn_demo.py",
    "rfs_maskrcnn_demo_timm.py",
    "rfs_maskrcnn_custom_cpu.py",
}
# Recipes whose timm backbone brings its own ImageNet weights (model.backbone.pretrained=True): the timm model
# whose stand-in file the smoke run gets.
TIMM_PRETRAINED = {
    "rfs_maskrcnn_convnext_t.py": "convnext_tiny",
    "maskrcnn_vitdet_b_rfs.py": "vit_base_patch16_224",
    "cascade_maskrcnn_swin_b_rfs.py": "swin_base_patch4_window7_224",
}
# Recipes for detectron2's weights (recipes/models/mask_rcnn_fpn_detectron2.py): the file each starts from.
DETECTRON2_WEIGHTS = {
    "detectron2_lvis_maskrcnn_r50.py": "",  # the user's file: train.init_checkpoint=PATH
    "detectron2_coco_maskrcnn_r50.py": "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/"
    "mask_rcnn_R_50_FPN_3x/137849600/model_final_f10217.pkl",
}
# What timm's loaders need to see in a stand-in file besides the stem: ConvNeXt's marker of timm's own key format.
_TIMM_FORMAT_KEYS = ("head.norm.",)
# The recipes that train in bf16 autocast on GPUs (recipes/schedules.py's use_vitdet_lvis_schedule).
BF16_RECIPES = {"maskrcnn_vitdet_b_rfs.py", "cascade_maskrcnn_swin_b_rfs.py"}
# The bf16 recipes' parts at demo scale, in bf16 autocast: the cascade heads with the federated loss (the Swin
# recipe's) here, the Swin and ViT backbones with the LayerNorm FPN in TIMM_FAMILIES.
BF16_AT_DEMO_SCALE = {"cascade_maskrcnn_demo.py": ["train.amp.enabled=true", "losses.use=fed"]}

COMMON_SMOKE = [
    "model.num_classes=30",  # the stand-in data sets have 30 categories
    # The recipes' 512 RoIs per image make the RoI heads most of a 2-step run's time on CPU; 16 (4 of them
    # positive at most) test the same code.
    "model.roi_heads.batch_size_per_image=16",
    # The plot hook stays in each run but writes nothing: drawing the figures (matplotlib) costs more CPU than a
    # demo's training steps; tests/engine/test_run_report.py tests the plots of a demo run.
    "train.hooks.plots.output_dir=''",
    "train.device=cpu",
    # A CPU without bf16 instructions (AVX512-BF16, AMX) emulates bf16: convolutions ~35x and matrix products
    # ~9x slower than fp32, most of a bf16 recipe's smoke run. On the CPU these train in fp32; bf16 autocast is
    # trained end to end at demo scale (BF16_AT_DEMO_SCALE, the timm families below), and
    # test_bf16_recipes_keep_autocast checks that the recipes still ask for it.
    "train.amp.enabled=false",
    # The mask head runs per detection: 5 per image run the evaluation's code as the recipes' 100-300 do.
    "model.roi_heads.detections_per_img=5",
    *FEW_PROPOSALS,
]
# 64-96 px images (the stand-in data's sizes): the backbones' cost grows with the area.
SMOKE = [*smoke_overrides(64, 96), *COMMON_SMOKE]


def _smoke(cfg) -> list[str]:
    """The smoke overrides that fit the config's train augmentations (multi-scale resizing or LSJ)."""
    first = cfg.dataloader.train.mapper.augmentations[0]._target_
    return SMOKE if first.endswith("ResizeShortestEdge") else [*lsj_smoke_overrides(64), *COMMON_SMOKE]


def _custom_data(datasets_root: str) -> list[str]:
    """The user-data recipes read the stand-in data set's LVIS-format jsons through their data.* keys."""
    root = os.path.join(datasets_root, "synthetic_lt")
    return [
        f"data.{split}.{key}={value}"
        for split in ("train", "val")
        for key, value in (("json", os.path.join(root, f"lvis_v1_{split}.json")), ("images", root))
    ]


def _relayout(source_json, split, root, coco_style):
    """Write `source_json` as COCO's/LVIS's files: images under coco/<split>2017/, json where they expect it."""
    data = json.load(open(source_json))
    image_dir = os.path.join(root, "coco", f"{split}2017")
    os.makedirs(image_dir, exist_ok=True)
    for image in data["images"]:
        base = os.path.basename(image["file_name"])
        shutil.copy(
            os.path.join(os.path.dirname(source_json), image["file_name"]), os.path.join(image_dir, base)
        )
        image["file_name"] = base if coco_style else f"{split}2017/{base}"
    if coco_style:
        path = os.path.join(root, "coco", "annotations", f"instances_{split}2017.json")
    else:
        path = os.path.join(root, "lvis", f"lvis_v1_{split}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump(data, open(path, "w"))


@pytest.fixture(scope="module")
def datasets_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("datasets"))
    generated = generate_synthetic_lt(
        os.path.join(root, "generated"),
        # 2 val images, not 6: each run's final evaluation costs about as much per image as a training step.
        **{**TINY_SYNTHETIC_LT, "num_val": 2},
    )
    shutil.copytree(generated, os.path.join(root, "synthetic_lt"))
    for split in ("train", "val"):
        _relayout(os.path.join(generated, f"lvis_v1_{split}.json"), split, root, coco_style=False)
        _relayout(os.path.join(generated, f"lvis_v1_{split}.json"), split, root, coco_style=True)
    return root


def _imagenet_stand_in(file_server) -> tuple[str, dict]:
    """A small ImageNet-format ResNet-50 file (stem and first stage, random values) served as torch hub
    names files: its URL and tensors."""
    prefixes = ("conv1.", "bn1.", "layer1.")
    state = {k: v for k, v in resnet50(weights=None).state_dict().items() if k.startswith(prefixes)}
    return file_server.add_weights(state, "resnet50stem"), state


def _timm_stand_in(file_server, model_name: str) -> str:
    """A small file of timm's weights format for `model_name` (stem, random values) served from 127.0.0.1."""
    import timm

    prefixes = ("stem.", "patch_embed.", "pos_embed", "cls_token", *_TIMM_FORMAT_KEYS)
    with torch.device("meta"):  # the names and shapes only: initialising a Swin-B's weights takes seconds
        state = timm.create_model(model_name, pretrained=False).state_dict()
    stem = {k: torch.randn(v.shape) for k, v in state.items() if k.startswith(prefixes)}
    return file_server.add_weights(stem, model_name)


def _keep_final_checkpoint_unwritten(monkeypatch, keys: tuple[str, ...]) -> dict:
    """When the run saves ``model_final``, let `Checkpointer.save` do all but the serialisation, and keep the
    dict it would have written (its model keys and the values of `keys` go into the returned dict, with the
    path the save returns). The GPU recipes' checkpoints (weights and the optimizer's moments) are 0.35-1.6 GB:
    writing and reading them back costs seconds of CPU and of disk per smoke run, and
    tests/engine/test_checkpoint.py tests the writing."""
    final = {}
    save = Checkpointer.save

    def keep(data: dict, file) -> None:
        model = data["model"]
        final.update(keys=set(model), values={key: model[key].clone() for key in keys})

    def save_unwritten(self, name: str, **extra):
        if name != "model_final":
            return save(self, name, **extra)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch, "save", keep)
            final["path"] = save(self, name, **extra)
        return final["path"]

    monkeypatch.setattr(Checkpointer, "save", save_unwritten)
    return final


@pytest.mark.parametrize("name", CONFIGS)
def test_gpu_recipes_start_from_imagenet_weights_and_the_demos_from_scratch(name):
    cfg = LazyConfig.load(os.path.join(REPO, "conf", name))
    backbone = cfg.model.backbone
    if name in TIMM_PRETRAINED:
        assert cfg.train.init_checkpoint == "" and backbone.pretrained is True
        assert backbone.model_name.startswith(TIMM_PRETRAINED[name])
    elif name in RANDOM_INIT:
        assert cfg.train.init_checkpoint == "" and backbone.get("depth", 18) == 18
        assert not backbone.get("pretrained", False)
    elif name in DETECTRON2_WEIGHTS:
        assert cfg.train.init_checkpoint == DETECTRON2_WEIGHTS[name] and backbone.stride_in_1x1 is True
    else:
        assert cfg.train.init_checkpoint == IMAGENET_R50 and backbone.depth == 50


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads_validates_and_trains_two_iterations(
    name, datasets_root, file_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets_root)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    torch.set_num_threads(1)
    cfg = LazyConfig.load(os.path.join(REPO, "conf", name))
    data = _custom_data(datasets_root) if "data" in cfg else []
    weights, imagenet = [], None
    if name in TIMM_PRETRAINED:
        weights = [f"model.backbone.pretrained={_timm_stand_in(file_server, TIMM_PRETRAINED[name])}"]
    elif name not in RANDOM_INIT:
        url, imagenet = _imagenet_stand_in(file_server)
        weights = [f"train.init_checkpoint={url}"]
    bf16 = BF16_AT_DEMO_SCALE.get(name, [])
    LazyConfig.apply_overrides(cfg, [*_smoke(cfg), *data, *weights, *bf16, f"train.output_dir={tmp_path}"])
    validate(cfg, INJECTED_ARGUMENTS)
    assert find_missing_data(cfg) == []
    assert find_json_dataset_problems(cfg) == []
    # The stem and layer1 are frozen in the R50 recipes: their final weights are the file's.
    frozen = ("conv1.weight", "layer1.2.conv3.weight", "layer1.0.bn1.running_mean") if imagenet else ()
    frozen = tuple(f"backbone.body.{key}" for key in frozen)
    final = {} if name in RANDOM_INIT else _keep_final_checkpoint_unwritten(monkeypatch, frozen)
    run(cfg)
    lines = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    losses = [line["total_loss"] for line in lines if "total_loss" in line]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    if name in RANDOM_INIT:
        assert (tmp_path / "model_final.pth").exists()
    else:
        assert final["path"] == str(tmp_path / "model_final.pth")
        assert {key.split(".")[0] for key in final["keys"]} == {"backbone", "rpn", "roi_heads"}
    assert LazyConfig.load(str(tmp_path / "config.yaml")).train.max_iter == 2
    assert sum(file_server.requests.values()) == len(weights)
    for key in frozen:
        assert torch.equal(final["values"][key], imagenet[key.removeprefix("backbone.body.")]), key


@pytest.mark.parametrize("name", sorted(BF16_RECIPES))
def test_bf16_recipes_keep_autocast(name):
    cfg = LazyConfig.load(os.path.join(REPO, "conf", name))
    assert cfg.train.amp.enabled is True and cfg.train.amp.dtype == "bfloat16"


@pytest.mark.parametrize("name", CONFIGS)
def test_config_docstring_gives_command_hardware_runtime_expectation(name):
    text = open(os.path.join(REPO, "conf", name)).read()
    for field in ("Command:", "Hardware:", "Runtime:", "Expected:"):
        assert field in text, f"conf/{name} docstring lacks '{field}'"


def test_max_iter_override_moves_lvis_schedule_steps():
    from lazytrain.config import instantiate

    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn.py"))
    assert instantiate(cfg.lr_multiplier).milestones == [120000, 160000]
    LazyConfig.apply_overrides(cfg, ["train.max_iter=90000"])
    assert instantiate(cfg.lr_multiplier).milestones == [60000, 80000]


@pytest.mark.slow
def test_demo_trains_with_large_scale_jitter_and_its_saved_config_rebuilds_it(
    datasets_root, tmp_path, monkeypatch
):
    from lazytrain.config import instantiate
    from recipes.data.lsj import lsj_augmentations

    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets_root)
    torch.set_num_threads(1)
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    LazyConfig.apply_overrides(cfg, [*SMOKE, f"train.output_dir={tmp_path}"])
    cfg.dataloader.train.mapper.augmentations = lsj_augmentations(96)
    cfg.dataloader.train.mapper.recompute_boxes = True
    cfg.dataloader.train.aspect_ratio_grouping = False
    validate(cfg, INJECTED_ARGUMENTS)
    run(cfg)
    losses = [json.loads(line).get("total_loss") for line in open(tmp_path / "metrics.json")]
    logged = [x for x in losses if x is not None]
    assert len(logged) == 2 and all(math.isfinite(x) and x > 0 for x in logged), losses
    saved = LazyConfig.load(str(tmp_path / "config.yaml"))
    mapper = instantiate(saved.dataloader.train.mapper)
    assert [type(a).__name__ for a in mapper.augmentations] == ["RandomFlip", "ResizeScale", "FixedSizeCrop"]
    assert mapper.augmentations[2].crop_size == (96, 96) and mapper.recompute_boxes


LOSS_CLASSES = {
    "ce": "SoftmaxCrossEntropy",
    "fed": "FederatedLoss",
    "eqlv2": "EQLv2Loss",
    "seesaw": "SeesawLoss",
}


@pytest.mark.parametrize(
    ("loss", "predictor"), [*((loss, "BoxPredictor") for loss in LOSS_CLASSES), ("fed", "CosineBoxPredictor")]
)
def test_demo_trains_and_evaluates_with_each_classification_loss(
    loss, predictor, datasets_root, tmp_path, monkeypatch
):
    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets_root)
    torch.set_num_threads(1)
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    chosen = [
        f"losses.use={loss}",
        f"model.roi_heads.box_predictor._target_=lazytrain.modeling.{predictor}",
        "model.roi_heads.detections_per_img=10",
    ]
    LazyConfig.apply_overrides(cfg, [*SMOKE, *chosen, f"train.output_dir={tmp_path}"])
    validate(cfg, INJECTED_ARGUMENTS)
    results = run(cfg)
    assert 0.0 <= results["bbox"]["AP"] <= 100.0 and 0.0 <= results["segm"]["APr"] <= 100.0
    lines = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    classifier = [line["loss_classifier"] for line in lines if "loss_classifier" in line]
    assert len(classifier) == 2 and all(math.isfinite(value) for value in classifier), lines
    saved = LazyConfig.load(str(tmp_path / "config.yaml"))
    built = instantiate(saved.model)
    assert type(built.roi_heads.box_predictor).__name__ == predictor
    assert type(built.roi_heads.box_predictor.loss).__name__ == LOSS_CLASSES[loss]


# The demo with a timm backbone of each family: BatchNorm CNN, ConvNeXt (LayerNorm), Swin (NHWC maps) and a plain
# ViT through the simple feature pyramid. Swin and ViT train in bf16 autocast with a LayerNorm FPN (the simple
# pyramid's default), as their GPU recipes (BF16_RECIPES) do.
TIMM_FAMILIES = {
    "resnet": ["model.backbone.model_name=resnet10t"],
    "convnext": ["model.backbone.model_name=convnext_atto"],
    "swin": [
        "model.backbone.model_name=swin_tiny_patch4_window7_224",
        "model.backbone.model_kwargs={strict_img_size:false}",
        "+model.backbone.fpn_norm=LN",
        "train.amp.enabled=true",
        # 64 px: the emulated bf16 matrix products of Swin's windows are most of the run, and grow with the area.
        *smoke_overrides(64, 64),
    ],
    "vit": [
        "model.backbone.model_name=vit_tiny_patch16_224",
        "model.backbone.out_indices=[-1]",
        "model.backbone.model_kwargs={img_size:96,dynamic_img_size:true}",
        "train.amp.enabled=true",
    ],
}


# Swin's bf16 run takes over the suite's 20 s mark (slow: the floor's quick suite has bf16 through the ViT).
@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.slow) if f == "swin" else f for f in TIMM_FAMILIES]
)
def test_timm_demo_trains_and_evaluates_with_each_family(family, datasets_root, tmp_path, monkeypatch):
    pytest.importorskip("timm")
    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets_root)
    torch.set_num_threads(1)
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo_timm.py"))
    overrides = [*SMOKE, *TIMM_FAMILIES[family], "model.roi_heads.detections_per_img=10"]
    LazyConfig.apply_overrides(cfg, [*overrides, f"train.output_dir={tmp_path}"])
    validate(cfg, INJECTED_ARGUMENTS)
    results = run(cfg)
    assert 0.0 <= results["bbox"]["AP"] <= 100.0 and 0.0 <= results["segm"]["AP"] <= 100.0
    losses = [json.loads(line).get("total_loss") for line in open(tmp_path / "metrics.json")]
    logged = [x for x in losses if x is not None]
    assert len(logged) == 2 and all(math.isfinite(x) for x in logged), losses
    saved = LazyConfig.load(str(tmp_path / "config.yaml"))
    assert saved.model.backbone.model_name == cfg.model.backbone.model_name


@pytest.mark.slow
def test_demo_trains_with_a_compiled_backbone_and_nms_at_padded_sizes_and_refuses_varying_shapes(
    datasets_root, tmp_path, monkeypatch
):
    """``train.compile`` on the demo recipe (aot_eager here: the same capture as inductor without generating
    code; tests/modeling/test_compiled_backbone.py compiles with inductor), with ``model.rpn.compiled_nms``
    (inductor)."""
    monkeypatch.setenv("LAZYTRAIN_DATASETS", datasets_root)
    torch.set_num_threads(1)
    compiled = ["train.compile.enabled=true", "train.compile.backend=aot_eager", "train.max_iter=4"]
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    fixed = [
        "model.pad_to_sizes=[[128,128]]",
        "model.rpn.compiled_nms=true",
        f"train.output_dir={tmp_path / 'fixed'}",
        "train.eval_period=0",
    ]
    LazyConfig.apply_overrides(cfg, [*SMOKE, *compiled, *fixed, "~train.hooks.eval"])
    validate(cfg, INJECTED_ARGUMENTS)
    assert find_backend_problems(cfg) == []
    nms_calls = []
    compiled_words = suppression._compiled_iou_above_words()
    monkeypatch.setattr(
        suppression, "_compiled_iou_above_words", lambda: lambda *a: nms_calls.append(1) or compiled_words(*a)
    )
    run(cfg)
    log = open(tmp_path / "fixed" / "log.txt").read()
    assert "train.compile: the backbone runs through torch.compile (mode None, backend aot_eager)" in log
    losses = [json.loads(line).get("total_loss") for line in open(tmp_path / "fixed" / "metrics.json")]
    assert sum(math.isfinite(x) for x in losses if x is not None) == 4, losses
    assert len(nms_calls) == 4 * 5  # 4 steps, 5 FPN levels
    # The smoke data's images have several shapes: without fixed sizes the second shape stops the run. Here
    # dynamo's capture alone (backend eager): the refusal comes before any compiling, and aot_eager's tracing of
    # the backward graph costs seconds.
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py"))
    varying = ["train.compile.backend=eager", f"train.output_dir={tmp_path / 'varying'}"]
    LazyConfig.apply_overrides(cfg, [*SMOKE, *compiled, *varying])
    with pytest.raises(ValueError, match=r"the backbone was compiled for the input shape \[2, 3, \d+, \d+\]"):
        run(cfg)
