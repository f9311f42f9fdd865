"""Activation checkpointing (`lazytrain.modeling.checkpointing`) in the ResNet and timm backbones: the same loss,
gradients and batch-norm statistics as the plain run, blocks recomputed only in training steps, and the one
config key.

Equality is exact (``torch.equal``), not within a tolerance: on the CPU the recompute runs the same kernels on
the same inputs with the same RNG state, so the backward reads bit-identical saved tensors. (A GPU with
non-deterministic kernels, such as atomics in a conv's backward, would need a tolerance.)
"""

import copy
import functools
import os

import pytest
import torch
import torch.distributed as dist
from pytest import param
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lazytrain.config import ConfigError, LazyConfig, instantiate, validate
from lazytrain.modeling.backbone import build_resnet_fpn_backbone
from lazytrain.modeling.checkpointing import CheckpointedSequential, checkpoint_blocks
from lazytrain.modeling.frozen_batch_norm import FrozenBatchNormConv2d
from lazytrain.modeling.timm_backbone import TimmBackbone
from lazytrain.program.default import INJECTED_ARGUMENTS
from tests.modeling.helpers import make_record

timm = pytest.importorskip("timm")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name -> (builder taking grad_checkpointing, input size, the blocks whose forward calls are counted)
BACKBONES = {
    "resnet-bn": lambda gc: build_resnet_fpn_backbone(
        18, norm="BN", trainable_layers=5, out_channels=16, grad_checkpointing=gc
    ),
    # layer1 frozen (its input needs no gradient, and neither does layer2's: the non-reentrant checkpoint still
    # gets gradients to layer2's parameters); frozen batch norms folded into the convs.
    "resnet-frozen-bn": lambda gc: build_resnet_fpn_backbone(
        18, norm="FrozenBN", trainable_layers=3, out_channels=16, grad_checkpointing=gc
    ),
    "timm-resnet": lambda gc: TimmBackbone(
        "resnet10t", out_channels=16, model_kwargs=dict(drop_path_rate=0.2), grad_checkpointing=gc
    ),
    "timm-vit": lambda gc: TimmBackbone(
        "vit_tiny_patch16_224",
        out_indices=[-1],
        out_channels=16,
        model_kwargs=dict(img_size=64, dynamic_img_size=True, drop_path_rate=0.2),
        grad_checkpointing=gc,
    ),
    "timm-swin": lambda gc: TimmBackbone(
        "swin_tiny_patch4_window7_224",
        out_channels=16,
        model_kwargs=dict(strict_img_size=False, drop_path_rate=0.2),
        grad_checkpointing=gc,
    ),
}
# A block inside a checkpointed part of each backbone, by name.
COUNTED_BLOCK = {
    "resnet-bn": "body.layer3.0",
    "resnet-frozen-bn": "body.layer2.1",
    "timm-resnet": "body.layer4.0",
    "timm-vit": "body.model.blocks.11",
    "timm-swin": "body.layers_2.blocks.5",
}


def _count_forwards(module: nn.Module) -> list[int]:
    calls = [0]
    # A pre-hook: the recompute stops early, once it has remade the tensors the backward needs (torch's
    # checkpoint early stop), so a block's forward hook would not see it.
    module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _loss_and_gradients(backbone: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(1)  # the same drop-path masks for both runs
    maps = backbone(images)
    loss = sum((m.double() ** 2).mean() for m in maps.values())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in backbone.named_parameters() if p.requires_grad}


@functools.cache
def _built(name: str, grad_checkpointing: bool, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return BACKBONES[name](grad_checkpointing).to(dtype)


@pytest.fixture(scope="module", autouse=True)
def _drop_built_backbones():
    yield
    _built.cache_clear()  # the built backbones (a Swin-T among them) are not held for the rest of the session


def _build(name: str, grad_checkpointing: bool, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A fresh copy of the backbone (several tests take the same one: a copy is cheaper than a build)."""
    torch.manual_seed(0)
    return copy.deepcopy(_built(name, grad_checkpointing, dtype))


@pytest.mark.parametrize(
    ("name", "dtype"),
    [param(name, torch.float32, id=name) for name in BACKBONES]
    + [param("resnet-bn", torch.float64, id="resnet-bn-float64")],
)
def test_loss_and_every_gradient_equal_the_plain_run_and_blocks_are_recomputed(name, dtype):
    images = torch.randn(2 if name != "timm-swin" else 1, 3, 64, 64, dtype=dtype)
    plain = _build(name, False, dtype)
    checkpointed = _build(name, True, dtype)
    assert plain.state_dict().keys() == checkpointed.state_dict().keys()
    calls = _count_forwards(checkpointed.get_submodule(COUNTED_BLOCK[name]))
    plain_loss, plain_grads = _loss_and_gradients(plain, images)
    loss, grads = _loss_and_gradients(checkpointed, images)
    assert calls == [2]  # the forward, then the recompute in the backward
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    assert all(g is not None for g in plain_grads.values())
    if name.startswith("resnet-"):  # no drop-path, which zeroes the gradients of a block it drops
        assert all(g.abs().sum() > 0 for g in plain_grads.values())
    unequal = [k for k in grads if not torch.equal(grads[k], plain_grads[k])]
    assert not unequal, unequal


@pytest.mark.parametrize("name", ["resnet-bn", "timm-vit", "timm-swin"])
def test_evaluation_and_no_grad_recompute_nothing(name):
    backbone = _build(name, True)
    calls = _count_forwards(backbone.get_submodule(COUNTED_BLOCK[name]))
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        backbone(images)  # training mode, no autograd
    backbone.eval()
    loss = sum(m.sum() for m in backbone(images).values())
    loss.backward()  # evaluation mode with autograd: nothing was checkpointed, so nothing is recomputed
    assert calls == [2]
    backbone.train()
    backbone(images)["0"].sum().backward()
    assert calls == [4]


def test_resnet_checkpoints_the_trainable_stages_and_keeps_frozen_ones_and_the_fold():
    backbone = build_resnet_fpn_backbone(50, trainable_layers=3, out_channels=16, grad_checkpointing=True)
    body = backbone.body
    assert not isinstance(body.layer1, CheckpointedSequential)  # frozen: no graph to save memory on
    assert all(isinstance(getattr(body, f"layer{k}"), CheckpointedSequential) for k in (2, 3, 4))
    assert not any(p.requires_grad for p in body.layer1.parameters())
    assert isinstance(body.layer3[0].conv1, FrozenBatchNormConv2d)  # FrozenBN stays folded into the convs
    plain = build_resnet_fpn_backbone(50, trainable_layers=3, out_channels=16)
    assert plain.state_dict().keys() == backbone.state_dict().keys()
    assert not any(isinstance(m, CheckpointedSequential) for m in plain.modules())


def test_timm_checkpoints_one_block_at_a_time_with_timms_switches_following_the_mode():
    vit = _build("timm-vit", True)
    assert vit._checkpointed == ["model"] and vit.body.model.grad_checkpointing
    assert not vit.eval().body.model.grad_checkpointing and vit.train().body.model.grad_checkpointing
    swin = _build("timm-swin", True)
    # The stages' own switches (block by block), not the feature net's (whole stages).
    assert swin._checkpointed == ["layers_0", "layers_1", "layers_2", "layers_3"]
    assert not swin.body.grad_checkpointing
    assert all(swin.body.get_submodule(name).grad_checkpointing for name in swin._checkpointed)
    assert not any(swin.eval().body.get_submodule(name).grad_checkpointing for name in swin._checkpointed)
    resnet = TimmBackbone("resnet10t", out_channels=16, frozen_stages=1, grad_checkpointing=True)
    # Deep stem (a run of single layers) and the frozen layer1 left alone; the rest checkpointed by lazytrain.
    assert resnet._checkpointed == ["layer2", "layer3", "layer4"]
    assert not isinstance(resnet.body.conv1, CheckpointedSequential)
    assert isinstance(resnet.body.layer2, CheckpointedSequential)


def test_bf16_autocast_gradients_equal_the_plain_run():
    """The recompute runs under the forward's autocast (a ViT: the bf16 recipes' backbone, and matrix products,
    which a CPU without bf16 instructions emulates less slowly than convolutions)."""
    images = torch.randn(2, 3, 64, 64)
    results = []
    for grad_checkpointing in (False, True):
        backbone = _build("timm-vit", grad_checkpointing)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(_loss_and_gradients(backbone, images))
            assert backbone(images)["0"].dtype == torch.bfloat16
    (plain_loss, plain_grads), (loss, grads) = results
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(grads[k], plain_grads[k]) for k in plain_grads)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        param(
            lambda: build_resnet_fpn_backbone(18, grad_checkpointing="yes"),
            r"build_resnet_fpn_backbone\(grad_checkpointing=\) must be True or False; got 'yes'",
            id="resnet-not-bool",
        ),
        param(
            lambda: TimmBackbone("resnet10t", grad_checkpointing=1),
            r"TimmBackbone\(grad_checkpointing=\) must be True or False; got 1",
            id="timm-not-bool",
        ),
        param(
            lambda: TimmBackbone("resnet10t", frozen_stages=4, grad_checkpointing=True),
            r"no trainable stage of blocks to checkpoint .* set grad_checkpointing=False",
            id="all-frozen",
        ),
    ],
)
def test_bad_arguments_are_refused(build, message):
    with pytest.raises((TypeError, ValueError), match=message):
        build()


def test_timm_set_to_reentrant_checkpoints_is_refused(monkeypatch):
    monkeypatch.setattr(timm.layers, "use_reentrant_ckpt", lambda: True)
    with pytest.raises(ValueError, match=r"needs non-reentrant checkpoints: .*TIMM_REENTRANT_CKPT"):
        TimmBackbone("resnet10t", grad_checkpointing=True)


def test_checkpoint_blocks_needs_a_sequential():
    parent = nn.Module()
    parent.conv = nn.Conv2d(1, 1, 1)
    with pytest.raises(TypeError, match=r"'conv' must be an nn.Sequential of blocks; got Conv2d"):
        checkpoint_blocks(parent, ["conv"])


# The ViT-B recipe at toy size: a tiny ViT without pretrained weights, 64 px images, narrow pyramid.
VITDET_TOY = [
    "model.num_classes=3",
    "model.backbone.model_name=vit_tiny_patch16_224",
    "model.backbone.pretrained=false",
    "model.backbone.out_channels=32",
    "model.backbone.model_kwargs={img_size:64,dynamic_img_size:true,drop_path_rate:0.1}",
    "model.roi_heads.batch_size_per_image=32",
]


def _vitdet_config(overrides: list[str]):
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "maskrcnn_vitdet_b_rfs.py"))
    LazyConfig.apply_overrides(cfg, [*VITDET_TOY, *overrides])
    return cfg


def _training_step(cfg) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    model = instantiate(cfg.model).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1)
    losses = model([make_record(64, 64, seed=0), make_record(64, 64, seed=1)])
    loss = sum(losses.values())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    return loss.detach(), grads


def test_the_key_in_the_vitdet_recipe_trains_a_step_with_the_plain_runs_gradients():
    plain_loss, plain_grads = _training_step(_vitdet_config([]))
    cfg = _vitdet_config(["model.backbone.grad_checkpointing=true"])
    validate(cfg, INJECTED_ARGUMENTS)
    loss, grads = _training_step(cfg)
    assert torch.equal(loss, plain_loss) and torch.isfinite(loss)
    assert grads.keys() == plain_grads.keys() and any(
        k.startswith("backbone.body.model.blocks.") for k in grads
    )
    assert all(torch.equal(grads[k], plain_grads[k]) for k in grads)


def test_the_key_in_the_resnet_recipe_builds_checkpointed_stages():
    cfg = LazyConfig.load(os.path.join(REPO, "recipes", "models", "mask_rcnn_r18_fpn_cpu.py"))
    LazyConfig.apply_overrides(cfg, ["model.backbone.grad_checkpointing=true"])
    validate(cfg, INJECTED_ARGUMENTS)
    backbone = instantiate(cfg.model.backbone)
    assert all(isinstance(getattr(backbone.body, f"layer{k}"), CheckpointedSequential) for k in (1, 2, 3, 4))


def test_a_misspelled_key_is_refused():
    cfg = LazyConfig.load(os.path.join(REPO, "conf", "maskrcnn_vitdet_b_rfs.py"))
    with pytest.raises(ConfigError, match=r"grad_checkpointng.* is not in the config.*grad_checkpointing"):
        LazyConfig.apply_overrides(cfg, ["model.backbone.grad_checkpointng=true"])
    LazyConfig.apply_overrides(
        cfg, ["+model.backbone.grad_checkpointng=true"]
    )  # added on purpose: validation
    with pytest.raises(ConfigError, match=r"model\.backbone.*grad_checkpointng.*grad_checkpointing"):
        validate(cfg, INJECTED_ARGUMENTS)


def _toy_stage(grad_checkpointing: bool) -> nn.Module:
    """Three conv blocks with dropout (whose masks the recompute must draw again) as a stage of a parent."""
    torch.manual_seed(0)
    parent = nn.Module()
    parent.stage = nn.Sequential(
        *[nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Dropout(0.3)) for _ in range(3)]
    )
    if grad_checkpointing:
        checkpoint_blocks(parent, ["stage"])
    return parent.stage


def _toy_step(stage: nn.Module, run: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(1)
    loss = (run(torch.randn(2, 4, 8, 8)) ** 2).sum()
    loss.backward()
    return loss.detach(), [p.grad for p in stage.parameters()]


def test_under_torch_compile_the_gradients_equal_the_eager_plain_run():
    """``train.compile`` captures the checkpoints (aot_eager: the same capture as inductor, no code generated)."""
    plain = _toy_stage(False)
    plain_loss, plain_grads = _toy_step(plain, plain)
    stage = _toy_stage(True)
    loss, grads = _toy_step(stage, torch.compile(stage, backend="aot_eager", dynamic=False))
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(g, p) for g, p in zip(grads, plain_grads))


@pytest.mark.parametrize("find_unused_parameters", [False, True])
def test_under_ddp_without_static_graph_the_gradients_equal_the_plain_run(find_unused_parameters, tmp_path):
    """One process: DDP's reducer still hooks every parameter, and would see one marked ready twice."""
    plain = _toy_stage(False)
    plain_loss, plain_grads = _toy_step(plain, plain)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        stage = _toy_stage(True)
        ddp = DistributedDataParallel(stage, find_unused_parameters=find_unused_parameters)
        loss, grads = _toy_step(stage, ddp)
    finally:
        dist.destroy_process_group()
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(g, p) for g, p in zip(grads, plain_grads))


@pytest.mark.parametrize(
    "name",
    sorted(f for f in os.listdir(os.path.join(REPO, "conf")) if f.endswith(".py") and f != "__init__.py"),
)
def test_every_runnable_config_takes_the_one_key(name):
    cfg = LazyConfig.load(os.path.join(REPO, "conf", name))
    LazyConfig.apply_overrides(cfg, ["model.backbone.grad_checkpointing=true"])
    assert cfg.model.backbone.grad_checkpointing is True


def _toy_batch_norm_stage(momentum: float | None, grad_checkpointing: bool) -> nn.Module:
    """Two conv-norm blocks as the stage of a parent, checkpointed with `checkpoint_blocks` or not."""
    torch.manual_seed(0)
    parent = nn.Module()
    blocks = [
        nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=momentum)) for _ in range(2)
    ]
    parent.stage = nn.Sequential(*blocks)
    if grad_checkpointing:
        checkpoint_blocks(parent, ["stage"])
    return parent.stage


# name -> builder taking grad_checkpointing; each has batch norms with running statistics in a checkpointed part.
BATCH_NORM_MODELS = {
    "resnet-bn": lambda gc: build_resnet_fpn_backbone(
        18, norm="BN", trainable_layers=5, out_channels=16, grad_checkpointing=gc
    ),
    # lazytrain's CheckpointedSequential over timm's ResNet layers (BatchNormAct2d), with drop-path.
    "timm-resnet": lambda gc: TimmBackbone(
        "resnet10t", out_channels=16, model_kwargs=dict(drop_path_rate=0.2), grad_checkpointing=gc
    ),
    # timm's own switch: each RegStage checkpoints its blocks with timm's checkpoint_seq.
    "timm-regnet": lambda gc: TimmBackbone("regnetx_002", out_channels=16, grad_checkpointing=gc),
    "toy-momentum-0.1": lambda gc: _toy_batch_norm_stage(0.1, gc),
    # momentum=None: a cumulative average, whose factor 1 / num_batches_tracked a second count would change.
    "toy-cumulative-average": lambda gc: _toy_batch_norm_stage(None, gc),
}


def _train_three_steps(model: nn.Module) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        torch.manual_seed(10 + step)  # the same images and drop-path masks for both runs
        images = torch.randn(2, 4 if isinstance(model, nn.Sequential) else 3, 64, 64)
        outputs = model(images)
        maps = outputs.values() if isinstance(outputs, dict) else [outputs]
        optimizer.zero_grad()
        sum((m.double() ** 2).mean() for m in maps).backward()
        optimizer.step()


@pytest.mark.parametrize("name", list(BATCH_NORM_MODELS))
def test_after_three_steps_every_parameter_gradient_and_batch_norm_statistic_equals_the_plain_run(name):
    """The recompute leaves the running statistics alone: each norm counts one batch per step
    (``num_batches_tracked`` 3, not 6) and moves its running mean and variance once, as the plain run does.
    Exact, as above: the forward's update is the plain run's, and the recompute's is undone by a copy."""
    torch.manual_seed(0)
    plain = BATCH_NORM_MODELS[name](False)
    torch.manual_seed(0)
    checkpointed = BATCH_NORM_MODELS[name](True)
    _train_three_steps(plain)
    _train_three_steps(checkpointed)
    buffers, plain_buffers = dict(checkpointed.named_buffers()), dict(plain.named_buffers())
    counts = {v.item() for k, v in plain_buffers.items() if k.endswith("num_batches_tracked")}
    assert counts == {3}
    assert buffers.keys() == plain_buffers.keys()
    unequal = [k for k in buffers if not torch.equal(buffers[k], plain_buffers[k])]
    assert not unequal, unequal
    parameters, plain_parameters = dict(checkpointed.named_parameters()), dict(plain.named_parameters())
    assert all(torch.equal(parameters[k], plain_parameters[k]) for k in plain_parameters)
    assert all(torch.equal(parameters[k].grad, plain_parameters[k].grad) for k in plain_parameters)


def test_sync_batch_norm_in_a_checkpointed_stage_is_refused_when_built():
    """Its recompute would all-reduce in the backward a second time; refused before any process group exists."""
    with pytest.raises(ValueError, match=r"cannot checkpoint 'layer2\.0\.bn1', a SyncBatchNorm: .*norm='BN'"):
        build_resnet_fpn_backbone(18, norm="SyncBN", trainable_layers=3, grad_checkpointing=True)
    build_resnet_fpn_backbone(18, norm="SyncBN", trainable_layers=3)  # without checkpoints: as before


def test_under_torch_compile_batch_norm_statistics_equal_the_eager_plain_run():
    """The hooks stand aside under a dynamo trace: the compiled graph updates the statistics once by itself."""
    plain, stage = _toy_batch_norm_stage(0.1, False), _toy_batch_norm_stage(0.1, True)
    compiled = torch.compile(stage, backend="aot_eager", dynamic=False)
    for _ in range(3):
        images = torch.randn(2, 4, 8, 8)
        (plain(images) ** 2).sum().backward()
        (compiled(images) ** 2).sum().backward()
    buffers = dict(stage.named_buffers())
    assert all(torch.equal(v, buffers[k]) for k, v in plain.named_buffers())
    assert buffers["0.1.num_batches_tracked"].item() == 3


def test_a_recompute_stopped_by_keyboard_interrupt_leaves_nothing_to_undo_the_next_forward():
    """Ctrl-C inside the recompute (torch runs always-called forward hooks on an Exception only, not on a
    KeyboardInterrupt) must not leave a saved copy that the next training forward would copy back over its own
    update: after the interrupted step and one more forward the statistics equal the plain run's."""
    plain, stage = _toy_batch_norm_stage(None, False), _toy_batch_norm_stage(None, True)
    interrupt = [True]

    def press_ctrl_c_in_the_recompute(module, args):
        if torch._C._current_graph_task_id() != -1 and interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt

    stage[1][1].register_forward_pre_hook(press_ctrl_c_in_the_recompute)
    images = [torch.randn(2, 4, 8, 8) for _ in range(2)]
    plain(images[0])
    with pytest.raises(KeyboardInterrupt):
        (stage(images[0]) ** 2).sum().backward()
    plain(images[1])
    stage(images[1])
    buffers = dict(stage.named_buffers())
    assert buffers["1.1.num_batches_tracked"].item() == 2
    assert all(torch.equal(v, buffers[k]) for k, v in plain.named_buffers())


def test_a_users_reentrant_checkpoint_around_hooked_norms_trains_as_the_plain_run():
    """A user's own ``checkpoint(..., use_reentrant=True)`` around blocks whose norms keep their statistics out
    of the recompute (the blocks of a checkpointed stage, called one by one): the copy back must not bump the
    statistics' version, which the reentrant recompute's graph saved for the norm's backward."""
    plain, stage = _toy_batch_norm_stage(None, False), _toy_batch_norm_stage(None, True)
    for _ in range(3):
        images = torch.randn(2, 4, 8, 8)
        (plain(images) ** 2).sum().backward()
        output = images.requires_grad_()
        for block in stage:
            output = torch.utils.checkpoint.checkpoint(block, output, use_reentrant=True)
        (output**2).sum().backward()
    buffers, parameters = dict(stage.named_buffers()), dict(stage.named_parameters())
    assert buffers["1.1.num_batches_tracked"].item() == 3
    assert all(torch.equal(v, buffers[k]) for k, v in plain.named_buffers())
    assert all(torch.equal(p.grad, parameters[k].grad) for k, p in plain.named_parameters())
