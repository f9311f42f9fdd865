import pytest

from lazytrain.engine.lr_schedule import WarmupCosineMultiplier, WarmupMultiStepMultiplier


@pytest.mark.parametrize(
    "iteration, expected",
    [
        (0, 0.001),
        (500, 0.001 * 0.5 + 0.5),
        (1000, 1.0),
        (119999, 1.0),
        (120000, 0.1),
        (159999, 0.1),
        (160000, 0.01),
    ],
)
def test_multistep_formula(iteration, expected):
    multiplier = WarmupMultiStepMultiplier([120000, 160000], warmup_iters=1000, warmup_factor=0.001)
    assert multiplier(iteration) == pytest.approx(expected)


def test_cosine_formula():
    multiplier = WarmupCosineMultiplier(max_iter=100, warmup_iters=0)
    assert multiplier(0) == pytest.approx(1.0)
    assert multiplier(50) == pytest.approx(0.5)
    assert multiplier(100) == pytest.approx(0.0)
