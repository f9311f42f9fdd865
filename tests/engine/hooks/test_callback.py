from lazytrain.engine.hooks.callback import CallbackHook
from tests.engine.hooks.fakes import toy_trainer


def test_callback_hook_runs_each_moment():
    calls = []
    moments = ["before_train", "before_step", "after_backward", "after_step", "after_train"]
    hook = CallbackHook(**{m: (lambda trainer, m=m: calls.append((m, trainer.iter))) for m in moments})
    trainer = toy_trainer()
    trainer.register_hooks([hook])
    trainer.train(0, 1)
    assert calls == [(m, 0) for m in moments[:-1]] + [("after_train", 1)]
