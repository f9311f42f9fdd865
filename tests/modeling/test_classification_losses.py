"""Classification losses against values worked out by hand, their gradients' direction, their scoring."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from lazytrain.launch.launch import launch
from lazytrain.modeling import (
    BoxPredictor,
    CosineBoxPredictor,
    EQLv2Loss,
    FederatedLoss,
    SeesawLoss,
    SoftmaxCrossEntropy,
)
from tests.modeling.loss_dist_worker import accumulate, rank_batch


def softplus(x: float) -> float:
    """log(1 + e^x): the BCE with logits of x against target 0 (against target 1 it is softplus(x) - x)."""
    return math.log1p(math.exp(x))


def logsumexp(*values: float) -> float:
    return math.log(sum(math.exp(v) for v in values))


def test_softmax_cross_entropy_is_the_mean_negative_log_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 3.0]])
    labels = torch.tensor([0, 2])
    expected = ((logsumexp(1, 2, 0) - 1) + (logsumexp(0.5, -1, 3) - 3)) / 2
    assert SoftmaxCrossEntropy()(logits, labels).item() == pytest.approx(expected, abs=1e-6)


def make_loss(name: str):
    """Each loss for 3 foreground classes (the federated loss with made-up train image counts)."""
    losses = {
        "ce": lambda: SoftmaxCrossEntropy(),
        "fed": lambda: FederatedLoss(3, class_image_counts=[1, 2, 3]),
        "eqlv2": lambda: EQLv2Loss(3),
        "seesaw": lambda: SeesawLoss(3),
    }
    return losses[name]()


# ---------------------------------------------------------------- federated loss

FED_LOGITS = [[0.0, 1.0, -1.0, 2.0], [0.0, 0.5, 0.0, -0.5]]  # K = 3; RoI 0 of class 1, RoI 1 background


def _federated(counts, num_sampled_classes):
    return FederatedLoss(3, class_image_counts=counts, num_sampled_classes=num_sampled_classes)


def test_federated_loss_with_every_class_sampled_is_the_sigmoid_ce_over_foreground_classes():
    loss = _federated([5, 1, 2], num_sampled_classes=50)(torch.tensor(FED_LOGITS), torch.tensor([1, 0]))
    roi0 = (softplus(1) - 1) + softplus(-1) + softplus(2)
    roi1 = softplus(0.5) + softplus(0) + softplus(-0.5)
    assert loss.item() == pytest.approx((roi0 + roi1) / 2, abs=1e-6)


def test_federated_loss_keeps_the_batch_classes_when_they_fill_the_subset():
    loss = _federated([5, 1, 2], num_sampled_classes=1)(torch.tensor(FED_LOGITS), torch.tensor([1, 0]))
    assert loss.item() == pytest.approx(((softplus(1) - 1) + softplus(0.5)) / 2, abs=1e-6)


def test_federated_loss_gives_no_gradient_to_unsampled_classes():
    # Class 1 is in the batch; one negative is drawn among classes 2 and 3, and class 2 has no train image,
    # so the draw is class 3 whatever the seed.
    logits = torch.tensor(FED_LOGITS, requires_grad=True)
    loss = _federated([4, 0, 9], num_sampled_classes=2)(logits, torch.tensor([1, 0]))
    roi0 = (softplus(1) - 1) + softplus(2)
    roi1 = softplus(0.5) + softplus(-0.5)
    assert loss.item() == pytest.approx((roi0 + roi1) / 2, abs=1e-6)
    loss.backward()
    assert logits.grad[:, [0, 2]].abs().max().item() == 0.0  # background column and class 2
    sigmoid = torch.sigmoid(torch.tensor(FED_LOGITS))
    expected = (sigmoid - torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0.0]])) / 2
    assert torch.allclose(logits.grad[:, [1, 3]], expected[:, [1, 3]], atol=1e-6)


def test_federated_negatives_are_drawn_in_proportion_to_count_to_the_power():
    loss = FederatedLoss(2, class_image_counts=[1, 81], num_sampled_classes=1, freq_weight_power=0.5)
    torch.manual_seed(0)
    labels = torch.zeros(4, dtype=torch.long)  # no class in the batch: one negative drawn, weights 1 : 9
    draws = torch.stack([loss.sample_classes(labels) for _ in range(2000)])
    assert draws.sum(1).tolist() == [1.0] * 2000
    assert draws[:, 1].mean().item() == pytest.approx(0.9, abs=0.03)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (
            None,
            r"FederatedLoss\(class_image_counts=\) is required: .* 3 classes; got None\. .*get_class_image_counts",
        ),
        (
            [1, 2],
            r"one count per foreground class, 3 \(num_classes\); got shape \(2,\)\..*get_class_image_counts",
        ),
        ([1, -2, 3], r"finite and >= 0; got \[1\.0, -2\.0, 3\.0\]"),
    ],
    ids=["none", "length", "negative"],
)
def test_federated_loss_without_proper_counts_says_where_to_get_them(counts, message):
    with pytest.raises(ValueError, match=message):
        FederatedLoss(3, class_image_counts=counts)


# ---------------------------------------------------------------- EQLv2


def test_eqlv2_starts_as_plain_sigmoid_ce_over_all_columns():
    loss = EQLv2Loss(2).eval()
    value = loss(torch.tensor([[2.0, -1.0, 0.5]]), torch.tensor([0]))  # a background RoI
    assert value.item() == pytest.approx((softplus(2) - 2) + softplus(-1) + softplus(0.5), abs=1e-6)


def test_eqlv2_weights_follow_the_accumulated_gradient_ratio():
    loss = EQLv2Loss(2).eval()
    loss.pos_grad.copy_(torch.tensor([3.0, 0.1]))
    loss.neg_grad.copy_(torch.tensor([2.0, 1.0]))  # ratios 1.5 and 0.1
    neg1 = 1 / (1 + math.exp(-12 * (1.5 - 0.8)))
    neg2 = 1 / (1 + math.exp(-12 * (0.1 - 0.8)))
    pos2 = 1 + 4 * (1 - neg2)
    value = loss(torch.tensor([[0.3, 1.0, -0.5]]), torch.tensor([2]))
    expected = softplus(0.3) + neg1 * softplus(1.0) + pos2 * (softplus(-0.5) + 0.5)
    assert value.item() == pytest.approx(expected, rel=1e-6)
    positive, negative = loss.class_weights()
    assert negative.tolist() == pytest.approx([1.0, neg1, neg2], rel=1e-6)
    assert positive.tolist() == pytest.approx([1.0, 1 + 4 * (1 - neg1), pos2], rel=1e-6)


def test_eqlv2_accumulates_weighted_gradient_magnitudes_in_training_only():
    loss = EQLv2Loss(2)
    third = math.log(3)  # sigmoid(+-log 3) = 0.75 / 0.25
    logits = torch.tensor([[0.0, 0.0, 0.0], [0.0, third, -third]])
    loss(logits, torch.tensor([1, 0]))  # weights are all 1 before anything is accumulated
    assert loss.pos_grad.tolist() == pytest.approx([0.5, 0.0])
    assert loss.neg_grad.tolist() == pytest.approx([0.75, 0.75])
    # Now the ratios are 0.5 / 0.75 and 0: a background RoI's |gradient| 0.5 is weighted by neg_w.
    loss(torch.zeros(1, 3), torch.tensor([0]))
    neg1, neg2 = (1 / (1 + math.exp(-12 * (ratio - 0.8))) for ratio in (0.5 / 0.75, 0.0))
    assert loss.neg_grad.tolist() == pytest.approx([0.75 + 0.5 * neg1, 0.75 + 0.5 * neg2], rel=1e-6)
    assert loss.pos_grad.tolist() == pytest.approx([0.5, 0.0])
    loss.eval()
    before = loss.neg_grad.clone()
    loss(logits, torch.tensor([1, 0]))
    assert torch.equal(loss.neg_grad, before)
    restored = EQLv2Loss(2)
    restored.load_state_dict(loss.state_dict())
    assert torch.equal(restored.pos_grad, loss.pos_grad) and torch.equal(restored.neg_grad, loss.neg_grad)


def test_eqlv2_suppresses_negative_gradients_of_a_rare_class_after_accumulation():
    loss = EQLv2Loss(2)
    for _ in range(10):  # class 1 frequent (half the RoIs), class 2 never seen
        loss(torch.zeros(8, 3), torch.tensor([1, 1, 1, 1, 0, 0, 0, 0]))
    logits = torch.zeros(1, 3, requires_grad=True)
    loss(logits, torch.tensor([0])).backward()  # a background RoI pushes both classes down
    frequent, rare = logits.grad[0, 1].item(), logits.grad[0, 2].item()
    assert frequent > 0.1 and 0 < rare < 1e-3 * frequent
    positive, _ = loss.class_weights()
    assert positive[2] > 4.9 and positive[1] < positive[2]  # and its positive gradients are raised


# ---------------------------------------------------------------- Seesaw


def test_seesaw_loss_matches_the_mitigation_and_compensation_factors_by_hand():
    loss = SeesawLoss(3).eval()  # eval: the counts stay as set
    loss.class_counts.copy_(torch.tensor([100.0, 10.0, 1.0]))
    logits = torch.tensor(
        [
            [0.3, 1.0, 0.5, -0.5],  # class 1 (frequent): mitigation on classes 2 and 3
            [-0.2, 2.0, 0.0, 1.0],  # class 3 (rarest): no mitigation; class 1 scores above it -> compensation
            [0.7, 0.0, 0.0, 0.0],  # background: objectness only
        ]
    )
    value = loss(logits, torch.tensor([1, 3, 0]))
    frequent = logsumexp(1.0, 0.5 + 0.8 * math.log(0.1), -0.5 + 0.8 * math.log(0.01)) - 1.0
    # softmax(2, 0, 1): sigma_1 / sigma_3 = e^(2 - 1) > 1, so class 1's logit gets + q * 1 = +2.
    rare = logsumexp(2.0 + 2.0, 0.0, 1.0) - 1.0
    objectness = softplus(0.3) + softplus(-0.2) + softplus(-0.7)
    assert value.item() == pytest.approx((objectness + frequent + rare) / 3, abs=1e-6)


def test_seesaw_counts_the_foreground_rois_of_each_class_while_training():
    loss = SeesawLoss(3)
    loss(torch.zeros(5, 4), torch.tensor([1, 1, 3, 0, 0]))
    assert loss.class_counts.tolist() == [2.0, 0.0, 1.0]
    assert torch.equal(loss.state_dict()["class_counts"], torch.tensor([2.0, 0.0, 1.0]))
    loss.eval()
    loss(torch.zeros(2, 4), torch.tensor([2, 2]))
    assert loss.class_counts.tolist() == [2.0, 0.0, 1.0]


def test_seesaw_mitigation_lowers_the_penalty_a_frequent_sample_puts_on_a_rare_class():
    def gradient(p, label):
        loss = SeesawLoss(3, p=p, q=0.0).eval()
        loss.class_counts.copy_(torch.tensor([1000.0, 100.0, 1.0]))
        logits = torch.zeros(1, 4, requires_grad=True)
        loss(logits, torch.tensor([label])).backward()
        return logits.grad[0]

    seesaw, plain = gradient(0.8, label=1), gradient(0.0, label=1)
    assert plain[3].item() == pytest.approx(1 / 3, abs=1e-6)  # plain softmax CE over 3 equal logits
    assert 0 < seesaw[3].item() < 0.02 * plain[3].item()  # its logit weighted by (1/1000)^0.8
    assert 0 < seesaw[2].item() < plain[2].item()
    # A rare sample's penalty on the frequent classes is not mitigated.
    rare_seesaw, rare_plain = gradient(0.8, label=3), gradient(0.0, label=3)
    assert torch.allclose(rare_seesaw[1:], rare_plain[1:], atol=1e-7)


# ---------------------------------------------------------------- scores at inference


def test_each_loss_scores_with_its_own_activation():
    logits = torch.tensor([[0.0, math.log(3), -math.log(3), 1.0], [2.0, -1.0, 0.5, 0.0]])
    expected = {
        "ce": F.softmax(logits, dim=1),
        "fed": torch.sigmoid(logits),
        "eqlv2": torch.cat(
            [torch.sigmoid(logits[:, :1]), torch.sigmoid(logits[:, 1:]) * (1 - torch.sigmoid(logits[:, :1]))],
            1,
        ),
        "seesaw": torch.cat(
            [torch.sigmoid(logits[:, :1]), F.softmax(logits[:, 1:], 1) * (1 - torch.sigmoid(logits[:, :1]))],
            1,
        ),
    }
    activations = {"ce": "softmax", "fed": "sigmoid", "eqlv2": "sigmoid", "seesaw": "softmax"}
    for name, scores in expected.items():
        loss = make_loss(name)
        got = loss.scores(logits)
        assert torch.allclose(got, scores, atol=1e-7), name
        assert loss.activation == activations[name]
        assert float(got.min()) >= 0 and float(got.max()) <= 1
    # Worked out: EQLv2's first row is sigmoid(log 3) * (1 - sigmoid(0)) = 0.75 * 0.5.
    assert make_loss("eqlv2").scores(logits)[0, 1].item() == pytest.approx(0.375)
    # Softmax-based scores sum to 1 over the K+1 columns; sigmoid ones need not.
    assert torch.allclose(make_loss("seesaw").scores(logits).sum(1), torch.ones(2))
    assert make_loss("fed").scores(logits).sum(1)[0].item() > 1.5
    plain = EQLv2Loss(3, score_with_objectness=False).scores(logits)
    assert torch.equal(plain, torch.sigmoid(logits))


# ---------------------------------------------------------------- counts, predictors


def test_federated_loss_needs_the_train_image_counts():
    with pytest.raises(ValueError, match=r"FederatedLoss\(class_image_counts=\) is required"):
        FederatedLoss(3)


def test_predictor_and_loss_must_agree_on_the_classes():
    with pytest.raises(
        ValueError, match=r"BoxPredictor\(num_classes=3\) disagrees with its loss SeesawLoss\(num_classes=4\)"
    ):
        BoxPredictor(8, 3, loss=SeesawLoss(4))
    with pytest.raises(ValueError, match=r"CosineBoxPredictor\(loss=\) must be a ClassificationLoss"):
        CosineBoxPredictor(8, 3, loss=torch.nn.CrossEntropyLoss())
    with pytest.raises(
        ValueError, match=r"SeesawLoss: class_logits must be \[N, num_classes \+ 1\] = \[N, 4\]"
    ):
        SeesawLoss(3)(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long))
    assert isinstance(BoxPredictor(8, 3).loss, SoftmaxCrossEntropy)


def test_cosine_predictor_logits_are_scale_times_cosine():
    predictor = CosineBoxPredictor(2, 2, scale=20.0)
    assert predictor.cls_score.bias is None
    with torch.no_grad():
        predictor.cls_score.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
    logits, deltas = predictor(torch.tensor([[3.0, 0.0], [0.0, -0.5]]))
    half = 1 / math.sqrt(2)
    assert torch.allclose(logits, torch.tensor([[20.0, 0.0, 20 * half], [0.0, -20.0, -20 * half]]), atol=1e-4)
    assert deltas.shape == (2, 12)
    # Only the feature's direction matters, and the logits stay within [-scale, scale].
    scaled, _ = predictor(torch.tensor([[300.0, 0.0], [0.0, -50.0]]))
    assert torch.allclose(scaled, logits, atol=1e-4)
    with torch.no_grad():
        assert float(predictor(torch.randn(50, 2) * 100)[0].abs().max()) <= 20.0 + 1e-4


def test_cosine_predictor_trains_with_softmax_ce_through_the_normalisation():
    predictor = CosineBoxPredictor(4, 2, scale=10.0, loss=SoftmaxCrossEntropy())
    logits, _ = predictor(torch.randn(6, 4))
    predictor.loss(logits, torch.tensor([0, 1, 2, 0, 1, 2])).backward()
    weight = predictor.cls_score.weight
    # The gradient through the normalisation is orthogonal to each weight row (its norm does not matter).
    cosine = F.cosine_similarity(weight.grad, weight.detach(), dim=1)
    assert float(cosine.abs().max()) < 1e-3 and float(weight.grad.norm(dim=1).min()) > 0
    with pytest.raises(ValueError, match=r"CosineBoxPredictor\(scale=\) must be > 0"):
        CosineBoxPredictor(4, 2, scale=0)


@pytest.mark.slow
def test_loss_state_is_summed_over_ranks(tmp_path):
    launch(accumulate, 2, use_gpu=False, args=(str(tmp_path),))
    states = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in (0, 1)]
    assert states[0] == states[1]
    # One process seeing both ranks' RoIs accumulates the same numbers.
    batches = [rank_batch(rank) for rank in (0, 1)]
    logits, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    eqlv2, seesaw = EQLv2Loss(3), SeesawLoss(3)
    eqlv2(logits, labels)
    seesaw(logits, labels)
    assert states[0]["seesaw"] == seesaw.class_counts.tolist() == [3.0, 1.0, 3.0]
    for key, value in eqlv2.state_dict().items():
        assert states[0]["eqlv2"][key] == pytest.approx(value.tolist(), rel=1e-6)
