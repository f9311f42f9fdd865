"""`BalancedMaskSampler`: torchvision's counts of positives and negatives, drawn only from eligible examples,
each with a chance, repeatable under a seed, without host syncs."""

import pytest
import torch
from pytest import param
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler

from lazytrain.modeling import BalancedMaskSampler
from lazytrain.utils.host_syncs import HostSyncCounter


def _labels(positives: int, negatives: int, ignored: int, *, seed: int = 0) -> torch.Tensor:
    """One image's labels (1 positive, 0 negative, -1 ignored) in a random order."""
    labels = torch.tensor([1.0] * positives + [0.0] * negatives + [-1.0] * ignored)
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


CASES = [
    param((300, 5000, 800), id="many of both"),
    param((20, 5000, 800), id="few positives"),
    param((0, 5000, 800), id="no positives (an image without boxes)"),
    param((300, 40, 800), id="few negatives"),
    param((300, 0, 0), id="no negatives"),
    param((0, 0, 800), id="everything ignored"),
    param((3, 7, 2), id="fewer anchors than the batch"),
]


@pytest.mark.parametrize("counts", CASES)
def test_draws_torchvisions_counts_from_the_eligible_examples_only(counts):
    labels = torch.stack([_labels(*counts, seed=0), _labels(*counts, seed=1)])
    positive, negative = BalancedMaskSampler(256, 0.5)(labels)
    expected_positive, expected_negative = BalancedPositiveNegativeSampler(256, 0.5)(list(labels))
    assert positive.dtype == negative.dtype == torch.bool and positive.shape == labels.shape
    assert positive.sum(1).tolist() == [int(mask.sum()) for mask in expected_positive]
    assert negative.sum(1).tolist() == [int(mask.sum()) for mask in expected_negative]
    assert bool((labels[positive] == 1).all()) and bool((labels[negative] == 0).all())


def test_counts_follow_the_positive_fraction():
    labels = _labels(300, 5000, 0)
    for fraction, expected in [(0.25, 64), (0.5, 128), (1.0, 256), (0.0, 0), (0.3, 76)]:
        positive, negative = BalancedMaskSampler(256, fraction)(labels)
        assert int(positive.sum()) == expected == int(256 * fraction)
        assert int(negative.sum()) == 256 - expected


def test_every_eligible_example_has_a_chance_and_about_the_same():
    labels = torch.tensor([1.0] * 6 + [0.0] * 10 + [-1.0] * 4)
    sampler = BalancedMaskSampler(8, 0.5)  # 4 of 6 positives, 4 of 10 negatives
    draws = 3000
    positive_counts, negative_counts = torch.zeros(20), torch.zeros(20)
    for _ in range(draws):
        positive, negative = sampler(labels)
        positive_counts += positive
        negative_counts += negative
    # Each positive is drawn with probability 4/6, each negative 4/10 (standard deviations ~0.009).
    torch.testing.assert_close(positive_counts[:6] / draws, torch.full((6,), 4 / 6), atol=0.04, rtol=0)
    torch.testing.assert_close(negative_counts[6:16] / draws, torch.full((10,), 0.4), atol=0.04, rtol=0)
    assert (
        positive_counts[6:].sum() == 0 and negative_counts[:6].sum() == 0 and negative_counts[16:].sum() == 0
    )


def test_repeatable_under_a_seed_and_different_for_another():
    labels = torch.stack([_labels(50, 2000, 100), _labels(0, 2050, 100)])
    sampler = BalancedMaskSampler(64, 0.25)
    torch.manual_seed(3)
    first = sampler(labels)
    torch.manual_seed(3)
    again = sampler(labels)
    torch.manual_seed(4)
    other = sampler(labels)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_images_draw_independently_and_any_leading_shape_works():
    labels = torch.stack([_labels(10, 100, 0), _labels(10, 100, 0)])
    positive, negative = BalancedMaskSampler(16, 0.5)(labels)
    assert not torch.equal(negative[0], negative[1])  # the same labels, different draws
    single_positive, single_negative = BalancedMaskSampler(16, 0.5)(labels[0])
    assert (
        single_positive.shape == (110,)
        and int(single_positive.sum()) == 8
        and int(single_negative.sum()) == 8
    )
    grid = BalancedMaskSampler(16, 0.5)(labels.reshape(2, 1, 110))[0]
    assert grid.shape == (2, 1, 110) and grid.sum(-1).flatten().tolist() == [8, 8]


def test_draws_without_host_syncs():
    labels = torch.stack([_labels(50, 2000, 100), _labels(3, 2047, 100)])
    with HostSyncCounter() as counter:
        BalancedMaskSampler(256, 0.5)(labels)
    assert counter.total == 0, counter.format_counts()


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        param((0, 0.5), ValueError, r"batch_size_per_image=\) must be at least 1; got 0", id="empty batch"),
        param((2.5, 0.5), TypeError, r"batch_size_per_image=\) must be an int; got 2.5", id="float batch"),
        param((8, 1.5), ValueError, r"positive_fraction=\) must be in \[0, 1\]; got 1.5", id="fraction"),
    ],
)
def test_rejects_bad_arguments(arguments, error, message):
    with pytest.raises(error, match=message):
        BalancedMaskSampler(*arguments)
