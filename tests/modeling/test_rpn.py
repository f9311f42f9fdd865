"""lazytrain's RegionProposalNetwork: torchvision's proposals and losses, for a whole batch at once and with
one host sync per step."""

import copy
import math
from collections import OrderedDict

import pytest
import torch
from pytest import param
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler, BoxCoder, Matcher
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.rpn import RegionProposalNetwork as TorchvisionRegionProposalNetwork
from torchvision.ops import box_iou

import lazytrain.modeling.nms as nms_module
import lazytrain.modeling.rpn as rpn_module
import lazytrain.modeling.suppression as suppression
from lazytrain.config import instantiate
from lazytrain.modeling import RegionProposalNetwork, matching
from lazytrain.utils.host_syncs import TO_HOST, HostSyncCounter
from tests.modeling.helpers import CPU_RECIPE, R50_RECIPE, build_model, load_model_config

STRIDES = (4, 8, 16, 32, 64)
# (image sizes, padded size): the demo's 192 px images, and 800-1333 px images as the R50 recipe trains on.
DEMO_SIZES = [(192, 160), (160, 192)]
DEMO_BATCH_8 = [(192, 192), (160, 192), (192, 128), (176, 192), (192, 144), (48, 40), (192, 160), (128, 96)]
R50_SIZES = [
    (800, 1333),
    (800, 1202),
    (1333, 800),
    (768, 1024),
    (800, 1066),
    (640, 1333),
    (800, 800),
    (1024, 768),
]


def _recipe_rpn(recipe: str = CPU_RECIPE, *overrides: str) -> RegionProposalNetwork:
    # A narrow FPN for the R50 recipe: its RPN settings, with a head that runs fast on the CPU.
    width = ("model.backbone.out_channels=16",) if recipe == R50_RECIPE else ()
    # batched=True: the path a GPU takes (on the CPU the default is torchvision's per-image loop).
    return instantiate(load_model_config(recipe, (*width, "+model.rpn.batched=true", *overrides)).model.rpn)


def _torchvision_copy(rpn: RegionProposalNetwork) -> TorchvisionRegionProposalNetwork:
    """torchvision's RPN with `rpn`'s settings and weights."""
    reference = TorchvisionRegionProposalNetwork(
        copy.deepcopy(rpn.anchor_generator),
        copy.deepcopy(rpn.head),
        rpn.proposal_matcher.high_threshold,
        rpn.proposal_matcher.low_threshold,
        rpn.fg_bg_sampler.batch_size_per_image,
        rpn.fg_bg_sampler.positive_fraction,
        dict(rpn._pre_nms_top_n),
        dict(rpn._post_nms_top_n),
        rpn.nms_thresh,
        rpn.score_thresh,
    )
    reference.load_state_dict(rpn.state_dict())
    reference.min_size = rpn.min_size
    return reference.train(rpn.training)


def _padded(sizes: list[tuple[int, int]]) -> tuple[int, int]:
    return tuple(math.ceil(max(size[axis] for size in sizes) / 64) * 64 for axis in (0, 1))


def _anchors(
    rpn: RegionProposalNetwork, sizes: list[tuple[int, int]]
) -> tuple[list[torch.Tensor], list[int]]:
    height, width = _padded(sizes)
    images = ImageList(torch.zeros(len(sizes), 3, height, width), sizes)
    maps = [torch.zeros(len(sizes), 1, height // stride, width // stride) for stride in STRIDES]
    per_level = [rpn.anchor_generator.num_anchors_per_location()[0] * m.shape[2] * m.shape[3] for m in maps]
    return rpn.anchor_generator(images, maps), per_level


def _candidates(rpn, sizes, *, seed: int, objects: int = 4, ties: bool = False):
    """What the RPN head gives filter_proposals for images of `sizes`: boxes decoded from the anchors with
    random deltas, and objectness logits with noise plus bumps around a few objects (clusters of high scores
    that NMS thins out, as in a trained RPN). `ties` rounds the logits so that many scores are equal."""
    generator = torch.Generator().manual_seed(seed)
    anchors, per_level = _anchors(rpn, sizes)
    num_images, count = len(sizes), anchors[0].shape[0]
    deltas = torch.randn(num_images * count, 4, generator=generator) * 0.25
    proposals = BoxCoder((1.0, 1.0, 1.0, 1.0)).decode(deltas, anchors).view(num_images, count, 4)
    centers = (proposals[..., :2] + proposals[..., 2:]) / 2
    logits = torch.randn(num_images, count, generator=generator)
    for image, (height, width) in enumerate(sizes):
        for _ in range(objects):
            center = torch.rand(2, generator=generator) * torch.tensor([width, height])
            spread = 10 + 60 * float(torch.rand(1, generator=generator))
            distance = (centers[image] - center).square().sum(-1)
            logits[image] += 4 * torch.exp(-distance / (2 * spread**2))
    # Below 8: sigmoid stays under 1 - 3e-4, where float32 still tells most scores apart (as in trained RPNs;
    # a run of equal scores at the post_nms_top_n cut would make the comparison with torchvision moot).
    logits = 8 * torch.tanh(logits / 8)
    if ties:
        logits = (logits * 2).round() / 2
    return proposals, logits.reshape(-1, 1), sizes, per_level


def _assert_same_proposals(got, expected):
    """Equal boxes and scores per image and in order, except that boxes of equal score may come in any order
    (torchvision's order there depends on an unstable sort, see RegionProposalNetwork.filter_proposals)."""
    assert len(got[0]) == len(expected[0])
    for boxes, scores, expected_boxes, expected_scores in zip(*got, *expected):
        assert torch.equal(scores, expected_scores)
        assert torch.equal(
            _sorted_within_equal_scores(boxes, scores), _sorted_within_equal_scores(expected_boxes, scores)
        )


def _sorted_within_equal_scores(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    rows = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), boxes[i].tolist()))
    return boxes[rows]


def _filter_both(rpn, candidates):
    reference = _torchvision_copy(rpn)
    return rpn.filter_proposals(*candidates), reference.filter_proposals(*candidates)


FILTER_CASES = [
    param(CPU_RECIPE, DEMO_SIZES, False, {}, id="demo recipe, batch 2"),
    param(CPU_RECIPE, DEMO_SIZES, True, {}, id="demo recipe, batch 2, training"),
    param(CPU_RECIPE, DEMO_BATCH_8, True, {}, id="demo recipe, batch 8 with a 48 x 40 image"),
    param(R50_RECIPE, R50_SIZES, False, {}, id="R50 recipe, 800-1333 px, batch 8"),
    param(R50_RECIPE, R50_SIZES[:3], True, {}, id="R50 recipe, 800-1333 px, training"),
    param(CPU_RECIPE, DEMO_SIZES, False, {"score_thresh": 0.9}, id="score threshold"),
    param(CPU_RECIPE, DEMO_SIZES, False, {"min_size": 24.0}, id="small boxes"),
    param(CPU_RECIPE, DEMO_SIZES, False, {"nms_thresh": 0.3}, id="NMS threshold 0.3"),
    param(CPU_RECIPE, DEMO_SIZES, False, {"nms_thresh": 0.0}, id="NMS threshold 0"),
    param(CPU_RECIPE, DEMO_SIZES, False, {"nms_thresh": 1.0}, id="NMS threshold 1"),
]


@pytest.mark.parametrize("recipe, sizes, training, settings", FILTER_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_filter_proposals_equals_torchvision(recipe, sizes, training, settings, seed):
    rpn = _recipe_rpn(recipe).train(training)
    for name, value in settings.items():
        setattr(rpn, name, value)
    got, expected = _filter_both(rpn, _candidates(rpn, sizes, seed=seed))
    _assert_same_proposals(got, expected)
    assert sum(len(boxes) for boxes in expected[0]) > 0


def test_fewer_proposals_than_post_nms_top_n():
    rpn = _recipe_rpn().eval()
    (boxes, scores), expected = _filter_both(rpn, _candidates(rpn, [(32, 24)], seed=0))
    _assert_same_proposals((boxes, scores), expected)
    assert 0 < len(boxes[0]) < rpn.post_nms_top_n()


def test_equal_scores_come_in_position_order_as_in_torchvisions_nms():
    # 64 x 64 images: under 1,000 boxes each, where torchvision's batched_nms runs one nms over all levels
    # (its stable sort orders equal scores by position, as lazytrain does): the same order, ties included.
    rpn = _recipe_rpn().eval()
    candidates = _candidates(rpn, [(64, 64), (64, 48)], seed=0, ties=True)
    got, expected = _filter_both(rpn, candidates)
    assert any(bool((scores[1:] == scores[:-1]).any()) for scores in expected[1])
    for boxes, scores, expected_boxes, expected_scores in zip(*got, *expected):
        assert torch.equal(boxes, expected_boxes) and torch.equal(scores, expected_scores)


def test_equal_scores_in_larger_images_give_the_same_proposals():
    # Above 1,000 boxes per image torchvision loops over the levels and re-sorts with an unstable sort.
    rpn = _recipe_rpn().eval()
    rpn._post_nms_top_n = dict(training=2000, testing=2000)  # no cut through a run of equal scores
    got, expected = _filter_both(rpn, _candidates(rpn, DEMO_SIZES, seed=0, ties=True))
    assert sum(int((scores[1:] == scores[:-1]).sum()) for scores in expected[1]) > 100
    _assert_same_proposals(got, expected)


def _pair_with_iou(target: torch.Tensor) -> torch.Tensor:
    """A box and one inside it whose IoU, as torchvision computes it (float32), is exactly `target`."""
    for side in (10.0, 12.0, 13.0, 17.0, 19.0, 23.0):
        height = target * side
        for _ in range(16):
            pair = torch.tensor([[0.0, 0.0, side, side], [0.0, 0.0, side, float(height)]])
            iou = box_iou(pair[:1], pair[1:])[0, 0]
            if iou == target:
                return pair
            height = torch.nextafter(height, height + (1.0 if iou < target else -1.0))
    raise AssertionError(f"no box pair with IoU {float(target)}")


@pytest.mark.parametrize(
    "compiled", [param(False, id="tiles"), param(True, id="compiled", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("threshold", [0.3, 0.7, 0.5, 0.1])
def test_ious_at_the_threshold_are_decided_as_torchvisions_nms_decides(threshold, compiled):
    # One pair per image: IoU at the float32 nearest to the threshold, one float32 step above and below.
    # torchvision compares in double precision: float32(0.3) is above 0.3, so that pair is suppressed.
    nearest = torch.tensor(threshold, dtype=torch.float32)
    ious = [nearest, torch.nextafter(nearest, torch.tensor(1.0)), torch.nextafter(nearest, torch.tensor(0.0))]
    proposals = torch.stack([_pair_with_iou(iou) for iou in ious])
    logits = torch.tensor([[1.0], [0.0]]).repeat(len(ious), 1)
    rpn = _recipe_rpn().eval()
    rpn.nms_thresh = threshold
    rpn.compiled_nms = compiled
    got, expected = _filter_both(rpn, (proposals, logits, [(16, 16)] * len(ious), [2]))
    _assert_same_proposals(got, expected)
    assert [len(boxes) for boxes in got[0]] == [1 if float(nearest) > threshold else 2, 1, 2]


@pytest.mark.parametrize(
    "module, setting, value",
    [
        param(nms_module, "NMS_STEPS", 1, id="steps that do not settle"),
        param(rpn_module, "DECIDED_PER_RESULT", 0.1, id="too few candidates decided"),
    ],
)
@pytest.mark.parametrize(
    "compiled", [param(False, id="tiles"), param(True, id="compiled", marks=pytest.mark.slow)]
)
def test_when_the_first_pass_is_not_final_the_result_is_still_torchvisions(
    monkeypatch, module, setting, value, compiled
):
    monkeypatch.setattr(module, setting, value)
    rpn = _recipe_rpn().eval()
    rpn.compiled_nms = compiled
    candidates = _candidates(rpn, DEMO_SIZES, seed=0)
    with HostSyncCounter() as counter:
        got = rpn.filter_proposals(*candidates)
    _assert_same_proposals(got, _torchvision_copy(rpn).filter_proposals(*candidates))
    assert counter.counts[TO_HOST] >= 2  # the first read found more work to do


@pytest.mark.parametrize(
    "module, setting, value, bit_matrices",
    [
        param(nms_module, "NMS_STEPS", 1, 1, id="steps that do not settle: the first pass's matrix"),
        param(rpn_module, "DECIDED_PER_RESULT", 0.1, 2, id="too few candidates decided: a larger one"),
    ],
)
@pytest.mark.parametrize(
    "compiled", [param(False, id="tiles"), param(True, id="compiled", marks=pytest.mark.slow)]
)
def test_a_second_pass_computes_a_bit_matrix_only_for_more_candidates(
    monkeypatch, module, setting, value, bit_matrices, compiled
):
    # The R50 recipe's RPN in eval: the first pass decides every candidate (1.5 x 1000 >= 1000 per level).
    monkeypatch.setattr(module, setting, value)
    calls = []
    bits = nms_module.suppression_bits
    monkeypatch.setattr(nms_module, "suppression_bits", lambda *a, **k: calls.append(1) or bits(*a, **k))
    rpn = _recipe_rpn(R50_RECIPE).eval()
    rpn.compiled_nms = compiled
    got, expected = _filter_both(rpn, _candidates(rpn, R50_SIZES[:2], seed=0))
    _assert_same_proposals(got, expected)
    assert len(calls) == bit_matrices


def _inputs(rpn, sizes, *, seed: int, channels: int):
    """An image batch, random FPN features for it, and targets (the last image has no boxes)."""
    generator = torch.Generator().manual_seed(seed)
    height, width = _padded(sizes)
    images = ImageList(torch.zeros(len(sizes), 3, height, width), sizes)
    names = ["0", "1", "2", "3", "pool"]
    features = OrderedDict(
        (name, torch.randn(len(sizes), channels, height // stride, width // stride, generator=generator))
        for name, stride in zip(names, STRIDES)
    )
    targets = []
    for index, (image_height, image_width) in enumerate(sizes):
        count = 0 if index == len(sizes) - 1 and len(sizes) > 1 else 3
        corners = torch.rand(count, 2, generator=generator) * torch.tensor([image_width, image_height]) * 0.6
        extents = 16 + torch.rand(count, 2, generator=generator) * 100
        targets.append({"boxes": torch.cat([corners, corners + extents], dim=1)})
    return images, features, targets


def _spread_scores(rpn: RegionProposalNetwork) -> RegionProposalNetwork:
    # torchvision's head starts with weights of std 0.01: every score within 1e-3 of 0.5, many of them
    # equal in float32. Wider weights spread them, as training does.
    with torch.no_grad():
        rpn.head.cls_logits.weight.normal_(0, 0.3)
    return rpn


FORWARD_CASES = [
    param(CPU_RECIPE, [(192, 160)], 64, id="demo recipe, 1 image"),
    param(CPU_RECIPE, DEMO_SIZES, 64, id="demo recipe, 2 images"),
    param(CPU_RECIPE, DEMO_BATCH_8, 64, id="demo recipe, 8 images"),
    param(R50_RECIPE, [(256, 320)], 16, id="R50 recipe, 1 image"),
    param(R50_RECIPE, [(256, 320), (320, 192)], 16, id="R50 recipe, 2 images"),
    param(R50_RECIPE, [(256, 320), (320, 192), *DEMO_BATCH_8[:6]], 16, id="R50 recipe, 8 images"),
]


@pytest.mark.parametrize("recipe, sizes, channels", FORWARD_CASES)
def test_forward_in_eval_equals_torchvisions_rpn_with_the_same_weights(recipe, sizes, channels):
    rpn = _spread_scores(_recipe_rpn(recipe)).eval()
    reference = _torchvision_copy(rpn)
    images, features, _ = _inputs(rpn, sizes, seed=0, channels=channels)
    with torch.no_grad(), HostSyncCounter() as counter:
        proposals, losses = rpn(images, features)
    expected, expected_losses = reference(images, features)
    assert losses == expected_losses == {}
    scores = [torch.zeros(len(boxes)) for boxes in expected]  # filter_proposals' scores are not returned
    _assert_same_proposals((proposals, scores), (expected, scores))
    assert dict(counter.counts) == {TO_HOST: 1}  # the proposal counts, read once for the batch


def _inject_torchvisions_draw(rpn, reference, images, features, targets):
    """Both RPNs use the anchors torchvision's sampler draws (under seed 0) for these inputs."""
    anchors = reference.anchor_generator(images, list(features.values()))
    labels, _ = reference.assign_targets_to_anchors(anchors, targets)
    torch.manual_seed(0)
    positive, negative = BalancedPositiveNegativeSampler(
        reference.fg_bg_sampler.batch_size_per_image, reference.fg_bg_sampler.positive_fraction
    )(labels)
    reference.fg_bg_sampler = lambda labels: (positive, negative)
    rpn.fg_bg_sampler = lambda labels: (torch.stack(positive).bool(), torch.stack(negative).bool())


@pytest.mark.parametrize("recipe, sizes, channels", [FORWARD_CASES[1], FORWARD_CASES[2], FORWARD_CASES[4]])
def test_training_losses_and_gradients_equal_torchvisions_for_the_same_anchors(recipe, sizes, channels):
    rpn = _spread_scores(_recipe_rpn(recipe)).train()
    reference = _torchvision_copy(rpn)
    images, features, targets = _inputs(rpn, sizes, seed=1, channels=channels)
    _inject_torchvisions_draw(rpn, reference, images, features, targets)
    proposals, losses = rpn(images, features, targets)
    expected_proposals, expected_losses = reference(images, features, targets)
    scores = [torch.zeros(len(boxes)) for boxes in expected_proposals]
    _assert_same_proposals((proposals, scores), (expected_proposals, scores))
    assert losses.keys() == expected_losses.keys() == {"loss_objectness", "loss_rpn_box_reg"}
    for name, loss in losses.items():
        # Equal but for the order of float additions (masked sums over all anchors against sums of the
        # gathered ones).
        torch.testing.assert_close(loss, expected_losses[name], rtol=1e-6, atol=0)
        assert loss > 0
    sum(losses.values()).backward()
    sum(expected_losses.values()).backward()
    for (name, parameter), expected_parameter in zip(
        rpn.head.named_parameters(), reference.head.parameters()
    ):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        torch.testing.assert_close(parameter.grad, expected_parameter.grad, rtol=1e-5, atol=1e-9)


def test_torchvisions_sampler_still_works_and_gives_torchvisions_losses():
    rpn = _spread_scores(_recipe_rpn()).train()
    reference = _torchvision_copy(rpn)
    rpn.fg_bg_sampler = BalancedPositiveNegativeSampler(256, 0.5)  # per-image uint8 masks
    images, features, targets = _inputs(rpn, DEMO_SIZES, seed=7, channels=64)
    torch.manual_seed(0)
    _, losses = rpn(images, features, targets)
    torch.manual_seed(0)
    _, expected = reference(images, features, targets)
    for name, loss in losses.items():
        torch.testing.assert_close(loss, expected[name], rtol=1e-6, atol=0)


def test_training_forward_syncs_the_host_once():
    rpn = _recipe_rpn().train()
    images, features, targets = _inputs(rpn, DEMO_SIZES, seed=2, channels=64)
    with HostSyncCounter() as counter:
        _, losses = rpn(images, features, targets)
        sum(losses.values()).backward()
    assert dict(counter.counts) == {TO_HOST: 1}
    assert all(torch.isfinite(loss) for loss in losses.values())


def test_images_without_boxes_train():
    rpn = _recipe_rpn().train()
    images, features, targets = _inputs(rpn, DEMO_SIZES, seed=3, channels=64)
    targets = [{"boxes": torch.zeros(0, 4)} for _ in targets]
    _, losses = rpn(images, features, targets)
    assert losses["loss_rpn_box_reg"] == 0 and losses["loss_objectness"] > 0
    sum(losses.values()).backward()
    assert rpn.head.cls_logits.weight.grad.abs().sum() > 0


def test_anchor_matching_and_box_coding_equal_torchvisions():
    rpn = _recipe_rpn().train()
    reference = _torchvision_copy(rpn)
    images, features, targets = _inputs(rpn, DEMO_BATCH_8, seed=4, channels=1)
    targets[3] = {"boxes": torch.zeros(0, 4)}  # torchvision's background image: labels 0, zero boxes
    targets[5]["boxes"] = torch.cat((targets[5]["boxes"], targets[5]["boxes"][:1]))  # tied best anchors
    anchors = rpn.anchor_generator(images, list(features.values()))
    labels, matched = rpn.assign_targets_to_anchors(anchors, targets)
    expected_labels, expected_matched = reference.assign_targets_to_anchors(anchors, targets)
    assert all(torch.equal(a, b) for a, b in zip(labels, expected_labels))
    assert all(torch.equal(a, b) for a, b in zip(matched, expected_matched))
    assert all(
        torch.equal(a, b)
        for a, b in zip(rpn.box_coder.encode(matched, anchors), reference.box_coder.encode(matched, anchors))
    )
    deltas = torch.randn(sum(len(a) for a in anchors), 4) * 2
    assert torch.equal(rpn.box_coder.decode(deltas, anchors), reference.box_coder.decode(deltas, anchors))


@pytest.mark.parametrize("seed", range(4))
def test_low_quality_matches_equal_torchvisions_ties_included(seed):
    generator = torch.Generator().manual_seed(seed)
    # Few distinct values: many predictions share a ground truth's best quality.
    quality = (torch.rand(5, 200, generator=generator) * 8).floor() / 10
    quality[3] = 0.0  # a ground truth that overlaps nothing
    matcher = matching.Matcher(0.7, 0.3, allow_low_quality_matches=True)
    expected = Matcher(0.7, 0.3, allow_low_quality_matches=True)(quality)
    with HostSyncCounter() as counter:
        got = matcher(quality)
    assert torch.equal(got, expected) and counter.total == 0


def test_recipes_build_lazytrains_rpn():
    for recipe in (CPU_RECIPE, R50_RECIPE):
        model = build_model(recipe, ("model.num_classes=3",))
        assert type(model.rpn) is RegionProposalNetwork
        assert isinstance(model.rpn, TorchvisionRegionProposalNetwork)  # checkpoints and configs as before


def test_state_dict_and_settings_are_torchvisions():
    rpn = _recipe_rpn()
    reference = _torchvision_copy(rpn)
    assert rpn.state_dict().keys() == reference.state_dict().keys()
    assert (rpn.pre_nms_top_n(), rpn.post_nms_top_n(), rpn.nms_thresh) == (600, 300, 0.7)


# torch's notices that tracing is deprecated, torchvision's TracerWarnings for the values it freezes.
@pytest.mark.filterwarnings(
    "ignore::FutureWarning:torch.jit",
    "ignore::torch.jit.TracerWarning",
    "ignore:To copy construct:UserWarning:torchvision.ops.boxes",
)
def test_under_tracing_the_proposals_come_from_torchvisions_filter():
    rpn = _spread_scores(_recipe_rpn()).eval()
    example = _inputs(rpn, [(128, 128)], seed=5, channels=64)[:2]
    other = _inputs(rpn, [(192, 128)], seed=6, channels=64)[:2]

    class Proposals(torch.nn.Module):
        def __init__(self, rpn):
            super().__init__()
            self.rpn = rpn

        def forward(self, image, *maps):
            images = ImageList(image, [(image.shape[-2], image.shape[-1])])
            return self.rpn(images, OrderedDict(zip(["0", "1", "2", "3", "pool"], maps)))[0][0]

    wrapper = Proposals(rpn)
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, (example[0].tensors, *example[1].values()), check_trace=False)
        got = traced(other[0].tensors, *other[1].values())
    assert torch.equal(got, wrapper(other[0].tensors, *other[1].values()))


def test_rejects_an_nms_threshold_outside_0_1():
    with pytest.raises(
        ValueError, match=r"RegionProposalNetwork\(nms_thresh=\) must be in \[0, 1\]; got 1.5"
    ):
        _recipe_rpn(CPU_RECIPE, "model.rpn.nms_thresh=1.5")


def test_on_the_cpu_the_default_is_torchvisions_loop(monkeypatch):
    rpn = _recipe_rpn(CPU_RECIPE, "model.rpn.batched=null").eval()
    candidates = _candidates(rpn, DEMO_SIZES, seed=5)
    expected = _torchvision_copy(rpn).filter_proposals(*candidates)

    def fail(*args, **kwargs):
        raise AssertionError("the batched selection ran on the CPU")

    monkeypatch.setattr(rpn_module, "GroupedNMS", fail)
    _assert_same_proposals(rpn.filter_proposals(*candidates), expected)
    rpn.batched = True
    with pytest.raises(AssertionError, match="batched selection ran"):
        rpn.filter_proposals(*candidates)


def _count_compiled_calls(monkeypatch) -> list:
    calls = []
    compiled = suppression._compiled_iou_above_words()

    def counted():
        return lambda *args: calls.append(1) or compiled(*args)

    monkeypatch.setattr(suppression, "_compiled_iou_above_words", counted)
    return calls


@pytest.mark.slow  # compiles with inductor once per process (~5-15 s)
@pytest.mark.parametrize(
    "recipe, sizes, training",
    [
        param(CPU_RECIPE, DEMO_BATCH_8, True, id="demo recipe, batch 8 with a 48 x 40 image, training"),
        param(R50_RECIPE, R50_SIZES, False, id="R50 recipe, 800-1333 px, batch 8"),
        param(R50_RECIPE, R50_SIZES[:3], True, id="R50 recipe, 800-1333 px, training"),
    ],
)
def test_compiled_nms_gives_torchvisions_proposals(recipe, sizes, training, monkeypatch):
    rpn = _recipe_rpn(recipe, "model.rpn.compiled_nms=true").train(training)
    calls = _count_compiled_calls(monkeypatch)
    got, expected = _filter_both(rpn, _candidates(rpn, sizes, seed=3))
    _assert_same_proposals(got, expected)
    assert len(calls) == 5  # one per FPN level


@pytest.mark.slow
def test_compiled_nms_takes_the_batched_selection_on_the_cpu_too_and_refuses_batched_false(monkeypatch):
    rpn = _recipe_rpn(CPU_RECIPE, "model.rpn.batched=null", "model.rpn.compiled_nms=true").eval()
    calls = _count_compiled_calls(monkeypatch)
    got, expected = _filter_both(rpn, _candidates(rpn, DEMO_SIZES, seed=4))
    _assert_same_proposals(got, expected)
    assert len(calls) == 5
    with pytest.raises(
        ValueError,
        match=r"RegionProposalNetwork\(compiled_nms=True, batched=False\): the compiled NMS is part of the "
        r"batched proposal selection",
    ):
        _recipe_rpn(CPU_RECIPE, "model.rpn.batched=false", "model.rpn.compiled_nms=true")
