"""The RoI heads' losses (`lazytrain.modeling.roi_losses`): torchvision's values and gradients, without host
syncs."""

import torch
from torchvision.models.detection.roi_heads import fastrcnn_loss, maskrcnn_loss

from lazytrain.modeling import BoxPredictor, EQLv2Loss, SoftmaxCrossEntropy
from lazytrain.modeling.roi_losses import box_losses, box_regression_loss, get_predictor_loss, mask_loss
from lazytrain.utils.host_syncs import HostSyncCounter


def test_box_regression_loss_equals_torchvisions_without_host_syncs():
    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 3, 1, 0, 2, 2, 0, 1])
    box_regression = torch.randn(8, 4 * 4, generator=generator, requires_grad=True)
    targets = torch.randn(8, 4, generator=generator)
    targets[labels == 0] = float("inf")  # background targets never reach the loss or the gradient
    with HostSyncCounter() as counter:
        loss = box_regression_loss(box_regression, labels, targets)
    assert counter.total == 0
    (grad,) = torch.autograd.grad(loss, box_regression)
    expected = fastrcnn_loss(torch.zeros(8, 4), box_regression, [labels], [targets.nan_to_num(posinf=0)])[1]
    torch.testing.assert_close(loss, expected)
    (expected_grad,) = torch.autograd.grad(expected, box_regression)
    torch.testing.assert_close(grad, expected_grad)


def test_box_losses_with_softmax_ce_equal_torchvisions_fast_rcnn_loss():
    generator = torch.Generator().manual_seed(1)
    labels = [torch.tensor([0, 3, 1]), torch.tensor([2, 0, 0, 1, 3])]
    class_logits = torch.randn(8, 4, generator=generator)
    box_regression = torch.randn(8, 4 * 4, generator=generator)
    targets = [torch.randn(3, 4, generator=generator), torch.randn(5, 4, generator=generator)]
    losses = box_losses(SoftmaxCrossEntropy(), class_logits, box_regression, labels, targets)
    expected = fastrcnn_loss(class_logits, box_regression, labels, targets)
    assert list(losses) == ["loss_classifier", "loss_box_reg"]
    torch.testing.assert_close(losses["loss_classifier"], expected[0])
    torch.testing.assert_close(losses["loss_box_reg"], expected[1])


def test_a_predictor_without_a_loss_trains_with_softmax_ce():
    assert isinstance(get_predictor_loss(torch.nn.Linear(2, 2)), SoftmaxCrossEntropy)
    loss = EQLv2Loss(num_classes=3)
    assert get_predictor_loss(BoxPredictor(8, 3, loss=loss)) is loss


def test_mask_loss_equals_torchvisions_on_the_ground_truth_class_channel():
    generator = torch.Generator().manual_seed(2)
    gt_masks = [(torch.rand(2, 32, 32, generator=generator) > 0.5).float() for _ in range(2)]
    gt_labels = [torch.tensor([1, 3]), torch.tensor([2, 1])]
    boxes = [
        torch.tensor([[2.0, 3.0, 20.0, 25.0], [5.0, 5.0, 30.0, 16.0]]),
        torch.tensor([[0.0, 1.0, 9.0, 31.0]]),
    ]
    matched = [torch.tensor([1, 0]), torch.tensor([0])]
    all_classes = torch.randn(3, 4, 14, 14, generator=generator)
    classes = torch.cat([labels[index] for labels, index in zip(gt_labels, matched)])
    own_class = all_classes[torch.arange(3), classes][:, None]
    expected = maskrcnn_loss(all_classes, boxes, gt_masks, gt_labels, matched)
    torch.testing.assert_close(mask_loss(own_class, boxes, gt_masks, matched), expected)
    # Without foreground RoIs: 0, connected to the graph (torchvision's mean of nothing would be NaN).
    logits = torch.randn(0, 1, 14, 14, requires_grad=True)
    empty = mask_loss(logits, [torch.zeros(0, 4)], [gt_masks[0]], [torch.zeros(0, dtype=torch.int64)])
    assert empty.item() == 0 and empty.requires_grad
