import os

from lazytrain.engine.hooks.profiling import TorchProfiler
from tests.engine.hooks.fakes import toy_trainer


def test_profiler_finishes_when_training_ends_inside_its_window(tmp_path):
    trainer = toy_trainer()
    trainer.register_hooks([TorchProfiler(str(tmp_path), start_iter=1, end_iter=100)])
    trainer.train(0, 3)
    assert os.listdir(tmp_path) == ["profiler-trace-rank0-iter3.json"]
