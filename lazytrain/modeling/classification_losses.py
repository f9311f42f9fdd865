"""Classification losses of the R-CNN box predictor, each a module that also says how inference scores.

`lazytrain.modeling.RoIHeads` asks the box predictor's ``loss`` (a `ClassificationLoss`) for the training
loss and for the scores that postprocessing ranks, so that a sigmoid loss scores with a sigmoid and a
softmax loss with a softmax. Every loss sees torchvision's layout: ``class_logits`` [N, K+1] for K foreground
classes with column 0 the background, ``labels`` [N] in 0..K with 0 the background.

- ``ce``: `SoftmaxCrossEntropy`, the default (torchvision's loss); inference softmax.
- ``fed``: `FederatedLoss` (Zhou et al. 2021, arXiv:2103.07461); inference sigmoid.
- ``eqlv2``: `EQLv2Loss` (Tan et al. 2021, arXiv:2012.08548); inference sigmoid (times objectness).
- ``seesaw``: `SeesawLoss` (Wang et al. 2021, arXiv:2008.10032); inference softmax (times objectness).

The names are the keys of the recipes' named mapping ``losses`` (``recipes/losses.py``): a config chooses
one with ``losses.use=fed`` and sweeps them with ``-m losses.use=ce,fed,eqlv2,seesaw``. The normalised
cosine classifier is a predictor, not a loss (`lazytrain.modeling.CosineBoxPredictor`), and combines with
any of them.

Losses with state (EQLv2's accumulated gradients, Seesaw's class counts) keep it in buffers, so checkpoints
carry it and a resumed run continues exactly; with several processes the state is summed over the ranks
every step, so every rank holds the same numbers. The counts the federated loss samples with come from the
data set (`lazytrain.data.class_frequency.get_class_image_counts`); this module never reads data itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from lazytrain.utils import comm

__all__ = [
    "ClassificationLoss",
    "EQLv2Loss",
    "FederatedLoss",
    "SeesawLoss",
    "SoftmaxCrossEntropy",
]

_COUNTS_FIX = (
    "Take them from the train data set: class_image_counts=L(get_class_image_counts)(dataset_names=...) "
    "(lazytrain.data.class_frequency), which reads the catalog's class_image_count or counts the records."
)


def _check_num_classes(owner: str, num_classes: int) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(
            f"{owner}(num_classes=) must be the number of foreground classes (an int >= 1), the box "
            f"predictor's num_classes (num_classes='${{..num_classes}}' in a config); got {num_classes!r}"
        )
    return num_classes


def _check_positive(owner: str, name: str, value: float) -> float:
    if not float(value) > 0:
        raise ValueError(f"{owner}({name}=) must be > 0; got {value!r}")
    return float(value)


def _as_class_counts(owner: str, counts: Sequence[float] | Tensor | None, num_classes: int) -> Tensor:
    """`counts` as a float tensor [num_classes], or a ValueError saying what is wrong and where to get them."""
    if counts is None:
        raise ValueError(
            f"{owner}(class_image_counts=) is required: the number of train images of each of the "
            f"{num_classes} classes; got None. {_COUNTS_FIX}"
        )
    tensor = torch.as_tensor(counts, dtype=torch.float64)
    if tensor.dim() != 1 or len(tensor) != num_classes:
        raise ValueError(
            f"{owner}(class_image_counts=) must have one count per foreground class, {num_classes} "
            f"(num_classes); got shape {tuple(tensor.shape)}. Count the same train data set that sets "
            f"num_classes. {_COUNTS_FIX}"
        )
    if not bool(torch.isfinite(tensor).all()) or bool((tensor < 0).any()):
        raise ValueError(f"{owner}(class_image_counts=) must be finite and >= 0; got {tensor.tolist()}")
    return tensor.float()


def _sum_over_ranks(tensor: Tensor) -> Tensor:
    # Statistics of the whole batch, not of this rank's share: every rank then holds the same state.
    if comm.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor


class ClassificationLoss(nn.Module):
    """What the box branch of `lazytrain.modeling.RoIHeads` asks: the loss, and the scores at inference.

    ``forward(class_logits [N, K+1], labels [N]) -> scalar`` (column 0 and label 0 are the background);
    ``scores(class_logits) -> [N, K+1]`` probabilities in [0, 1], of which inference keeps columns 1..K.
    ``activation`` names the function `scores` applies (``"softmax"`` or ``"sigmoid"``).
    """

    activation = "softmax"
    num_classes: int | None = None

    def scores(self, class_logits: Tensor) -> Tensor:
        """Class probabilities [N, K+1] for postprocessing (column 0, the background, is dropped there)."""
        return F.softmax(class_logits, -1)

    def _check_inputs(self, class_logits: Tensor, labels: Tensor) -> None:
        expected = (self.num_classes or 0) + 1
        if class_logits.dim() != 2 or class_logits.shape[1] != expected:
            raise ValueError(
                f"{type(self).__name__}: class_logits must be [N, num_classes + 1] = [N, {expected}] (column 0 "
                f"the background); got {tuple(class_logits.shape)}. Give the loss the box predictor's "
                "num_classes."
            )
        if labels.shape != class_logits.shape[:1]:
            raise ValueError(
                f"{type(self).__name__}: labels must be [N] = [{len(class_logits)}] (one per class_logits "
                f"row); got {tuple(labels.shape)}"
            )


class SoftmaxCrossEntropy(ClassificationLoss):
    """Softmax cross-entropy over the K+1 classes, averaged over the sampled RoIs: torchvision's and
    detectron2's Fast R-CNN loss, and the default. Inference: softmax. No keys."""

    def forward(self, class_logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(class_logits, labels)


class FederatedLoss(ClassificationLoss):
    """Federated loss (Zhou et al. 2021, "Probabilistic two-stage detection", arXiv:2103.07461).

    Sigmoid binary cross-entropy over the K foreground classes, computed only on a subset of classes drawn
    each iteration: every class among the batch's labels, plus negative classes drawn without replacement
    with probability proportional to ``class_image_counts ** freq_weight_power``, up to
    ``num_sampled_classes`` classes in all. The sum is divided by the number of sampled RoIs. A RoI of the
    background has target 0 for every class; the background logit (column 0) is unused and gets no gradient.
    Inference: the sigmoid of each class logit (as detectron2's ``use_sigmoid_ce``).

    Follows detectron2's ``FastRCNNOutputLayers(use_fed_loss=True)`` (``get_fed_loss_classes`` and
    ``sigmoid_cross_entropy_loss`` in detectron2/modeling/roi_heads/fast_rcnn.py), with two differences:
    detectron2 counts the background among the ``num_sampled_classes`` when a background RoI is in the batch
    (so it keeps 49 foreground classes of 50), here only foreground classes count; and where fewer classes
    with a non-zero count are left than wanted, all of them are taken (detectron2's sampling would fail).

    Args:
        num_classes: foreground classes K (the box predictor's).
        class_image_counts: train images per foreground class [K], from the data set (a class with count 0
            is never drawn as a negative).
        num_sampled_classes: classes in the loss per iteration (detectron2: ``FED_LOSS_NUM_CLASSES`` = 50).
        freq_weight_power: exponent of the counts in the drawing weights (``FED_LOSS_FREQ_WEIGHT_POWER`` =
            0.5).
    """

    activation = "sigmoid"

    def __init__(
        self,
        num_classes: int,
        class_image_counts: Sequence[float] | Tensor | None = None,
        num_sampled_classes: int = 50,
        freq_weight_power: float = 0.5,
    ) -> None:
        super().__init__()
        self.num_classes = _check_num_classes("FederatedLoss", num_classes)
        counts = _as_class_counts("FederatedLoss", class_image_counts, num_classes)
        if isinstance(num_sampled_classes, bool) or not isinstance(num_sampled_classes, int):
            raise ValueError(
                f"FederatedLoss(num_sampled_classes=) must be an int; got {num_sampled_classes!r}"
            )
        self.num_sampled_classes = num_sampled_classes
        self.freq_weight_power = float(freq_weight_power)
        # Not persistent: the weights come from the data set of this run, not from a checkpoint.
        self.register_buffer("sampling_weights", counts**self.freq_weight_power, persistent=False)

    def forward(self, class_logits: Tensor, labels: Tensor) -> Tensor:
        self._check_inputs(class_logits, labels)
        logits = class_logits[:, 1:].float()
        targets = F.one_hot(labels, self.num_classes + 1)[:, 1:].to(logits.dtype)
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        return (losses * self.sample_classes(labels)).sum() / max(len(labels), 1)

    def sample_classes(self, labels: Tensor) -> Tensor:
        """0/1 float mask [K] of the foreground classes in this iteration's loss (draws from torch's RNG)."""
        present = torch.zeros(self.num_classes, dtype=torch.bool, device=labels.device)
        present[labels[labels > 0] - 1] = True
        weights = self.sampling_weights.to(labels.device).masked_fill(present, 0.0)
        wanted = min(self.num_sampled_classes - int(present.sum()), int((weights > 0).sum()))
        selected = present.clone()
        if wanted > 0:
            selected[torch.multinomial(weights, wanted, replacement=False)] = True
        return selected.float()

    def scores(self, class_logits: Tensor) -> Tensor:
        return torch.sigmoid(class_logits)

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, num_sampled_classes={self.num_sampled_classes}, "
            f"freq_weight_power={self.freq_weight_power}"
        )


class EQLv2Loss(ClassificationLoss):
    """Equalization Loss v2 (Tan et al. 2021, "Equalization Loss v2: A New Gradient Balance Approach for
    Long-tailed Object Detection", arXiv:2012.08548).

    Sigmoid binary cross-entropy over all K+1 columns (the background column is trained as an objectness
    score), each term weighted, summed and divided by the number of RoIs. Class j's weights follow the ratio
    g_j = (accumulated positive gradient) / (accumulated negative gradient) of its logit:
    ``neg_w = 1 / (1 + exp(-gamma * (g_j - mu)))``, ``pos_w = 1 + alpha * (1 - neg_w)``; the background has
    weight 1. A rare class (few positives, so a small g_j) gets its negative gradients (from the other
    classes' RoIs) suppressed and its positive ones raised. The gradients accumulated after each step are
    ``|sigmoid(x) - target| * weight`` summed over the RoIs (the magnitude of the weighted loss's gradient
    before normalisation), kept in the buffers ``pos_grad`` and ``neg_grad`` [K]; before any is accumulated
    every weight is 1.
    Inference: ``sigmoid(x_j) * (1 - sigmoid(x_background))`` with `score_with_objectness`, else the sigmoid.

    Follows the official code (tztztztztz/eqlv2, mmdet/models/losses/eqlv2.py: ``forward``, ``get_weight``,
    ``collect_grad``, ``get_activation`` with ``test_with_obj=True``), the background being torchvision's
    column 0 instead of mmdet's last column. The official code starts from a stored ratio of 100 (weights 1);
    here the ratio is derived from the buffers and taken as 100 while a class has no negative gradient yet.

    Args:
        num_classes: foreground classes K (the box predictor's).
        gamma: steepness of the weighting function (paper and code: 12).
        mu: ratio at which the negative weight is 1/2 (0.8).
        alpha: how much the positive weight grows as the negative one falls (4).
        score_with_objectness: multiply the class scores by the background column's "not background"
            probability at inference (the official default, True).
    """

    activation = "sigmoid"

    def __init__(
        self,
        num_classes: int,
        gamma: float = 12.0,
        mu: float = 0.8,
        alpha: float = 4.0,
        score_with_objectness: bool = True,
    ) -> None:
        super().__init__()
        self.num_classes = _check_num_classes("EQLv2Loss", num_classes)
        self.gamma = _check_positive("EQLv2Loss", "gamma", gamma)
        self.mu = float(mu)
        self.alpha = float(alpha)
        self.score_with_objectness = bool(score_with_objectness)
        self.register_buffer("pos_grad", torch.zeros(num_classes))
        self.register_buffer("neg_grad", torch.zeros(num_classes))

    def class_weights(self) -> tuple[Tensor, Tensor]:
        """(positive, negative) weight per column [K+1], column 0 (background) 1."""
        ratio = self.pos_grad / (self.neg_grad + 1e-10)
        ratio = torch.where(self.neg_grad > 0, ratio, torch.full_like(ratio, 100.0))
        negative = torch.cat([ratio.new_ones(1), torch.sigmoid(self.gamma * (ratio - self.mu))])
        return 1 + self.alpha * (1 - negative), negative

    def forward(self, class_logits: Tensor, labels: Tensor) -> Tensor:
        self._check_inputs(class_logits, labels)
        logits = class_logits.float()
        targets = F.one_hot(labels, self.num_classes + 1).to(logits.dtype)
        positive, negative = self.class_weights()
        weights = targets * positive + (1 - targets) * negative
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        if self.training:
            self._accumulate(logits.detach(), targets, weights)
        return (losses * weights).sum() / max(len(labels), 1)

    @torch.no_grad()
    def _accumulate(self, logits: Tensor, targets: Tensor, weights: Tensor) -> None:
        # The derivative of the BCE with respect to the logit is sigmoid(x) - target; its magnitude, weighted,
        # is what EQLv2 balances. The background column [0] is not a class to balance.
        gradients = (torch.sigmoid(logits) - targets).abs() * weights
        positive = (gradients * targets).sum(0)[1:]
        negative = (gradients * (1 - targets)).sum(0)[1:]
        totals = _sum_over_ranks(torch.stack([positive, negative]))
        self.pos_grad += totals[0]
        self.neg_grad += totals[1]

    def scores(self, class_logits: Tensor) -> Tensor:
        probabilities = torch.sigmoid(class_logits)
        if not self.score_with_objectness:
            return probabilities
        background = probabilities[:, :1]
        return torch.cat([background, probabilities[:, 1:] * (1 - background)], dim=1)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, gamma={self.gamma}, mu={self.mu}, alpha={self.alpha}"


class SeesawLoss(ClassificationLoss):
    """Seesaw loss (Wang et al. 2021, "Seesaw Loss for Long-Tailed Instance Segmentation", arXiv:2008.10032).

    For a RoI of class i, the softmax cross-entropy over the K foreground classes with class j's logit
    shifted by ``log(S_ij)``, ``S_ij = M_ij * C_ij`` (j != i):

    - mitigation ``M_ij = (N_j / N_i) ** p`` when class j has fewer accumulated samples N than class i, else
      1: a frequent class's RoIs push a rarer class's logit down less. N counts the foreground RoIs of each
      class seen in training so far, this batch included (buffer ``class_counts`` [K], from 0; each at
      least 1 in the ratio).
    - compensation ``C_ij = (sigma_j / sigma_i) ** q`` when the softmax probability sigma_j of the wrong class
      j exceeds sigma_i (``sigma_i`` at least `eps`), else 1: a misclassification is penalised again.

    The background, as in mmdetection, is not one of the softmax classes: the background logit (column 0) is
    an objectness score trained with sigmoid cross-entropy on every RoI, and only foreground RoIs enter the
    seesaw term. mmdetection (``SeesawLoss``, mmdet/models/losses/seesaw_loss.py) gives the predictor K+2
    outputs, a 2-way softmax for objectness; a 2-way softmax is the sigmoid of the difference of its two
    logits, so the one background logit here is the same model with the predictor's K+1 outputs (torchvision
    checkpoints keep their shapes). Both terms are summed over RoIs and divided by the number of RoIs (mmdet's
    ``avg_factor``); mmdet reports them as two losses, here they are one ``loss_classifier``.
    Inference: ``softmax over classes * (1 - sigmoid(background logit))`` (mmdet's ``get_activation``).
    Deviation: with several processes the counts are summed over the ranks (mmdet counts each rank's own).

    Args:
        num_classes: foreground classes K (the box predictor's).
        p: exponent of the mitigation factor (paper and mmdet: 0.8; 0 turns it off).
        q: exponent of the compensation factor (2.0; 0 turns it off).
        eps: smallest divisor sigma_i in the compensation factor (1e-2).
    """

    def __init__(self, num_classes: int, p: float = 0.8, q: float = 2.0, eps: float = 1e-2) -> None:
        super().__init__()
        self.num_classes = _check_num_classes("SeesawLoss", num_classes)
        self.p, self.q = float(p), float(q)
        self.eps = _check_positive("SeesawLoss", "eps", eps)
        self.register_buffer("class_counts", torch.zeros(num_classes))

    def forward(self, class_logits: Tensor, labels: Tensor) -> Tensor:
        self._check_inputs(class_logits, labels)
        logits = class_logits.float()
        foreground = labels > 0
        if self.training:
            counts = torch.bincount(labels[foreground] - 1, minlength=self.num_classes)
            self.class_counts += _sum_over_ranks(counts.to(self.class_counts.dtype))
        objectness = F.binary_cross_entropy_with_logits(
            logits[:, 0], (~foreground).to(logits.dtype), reduction="sum"
        )
        classes = self.seesaw_cross_entropy(logits[foreground, 1:], labels[foreground] - 1)
        return (objectness + classes) / max(len(labels), 1)

    def seesaw_cross_entropy(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Summed seesaw cross-entropy of foreground RoIs: `logits` [P, K], `labels` [P] in 0..K-1."""
        log_factors = logits.new_zeros(logits.shape)
        if self.p > 0:
            counts = self.class_counts.clamp(min=1)
            log_factors += self.p * torch.log(counts[None, :] / counts[labels][:, None]).clamp(max=0)
        if self.q > 0:
            probabilities = F.softmax(logits.detach(), dim=1)
            own = probabilities.gather(1, labels[:, None]).clamp(min=self.eps)
            log_factors += self.q * torch.log(probabilities / own).clamp(min=0)
        # The true class's own column is 0 in both terms (N_i / N_i = sigma_i / sigma_i = 1): S_ii = 1.
        return F.cross_entropy(logits + log_factors, labels, reduction="sum")

    def scores(self, class_logits: Tensor) -> Tensor:
        background = torch.sigmoid(class_logits[:, :1])
        classes = F.softmax(class_logits[:, 1:], dim=1) * (1 - background)
        return torch.cat([background, classes], dim=1)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, p={self.p}, q={self.q}, eps={self.eps}"
