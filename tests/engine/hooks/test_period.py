from types import SimpleNamespace

from lazytrain.engine.hooks.period import is_period_end


def test_a_period_ends_after_every_period_th_step_and_never_when_switched_off():
    ends = [i for i in range(10) if is_period_end(SimpleNamespace(iter=i), 4)]
    assert ends == [3, 7]
    assert not any(is_period_end(SimpleNamespace(iter=i), 0) for i in range(10))
