"""BatchNorm running statistics averaged over ranks before each checkpoint and evaluation (2 gloo processes)."""

import os
import warnings

import torch

from lazytrain.engine.batch_norm import average_batch_norm_statistics
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.hooks import EvalHook, PeriodicCheckpointer
from lazytrain.engine.train_loop import HookBase, SimpleTrainer
from lazytrain.launch.launch import launch
from lazytrain.utils import comm
from tests.engine.toy import ToyLoader, ToyRegressor

STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def _statistics(model: torch.nn.Module) -> dict:
    norm = getattr(model, "module", model).norm
    return {name: getattr(norm, name).clone() for name in STATISTICS}


class _RecordStatistics(HookBase):
    """Each step's rank-local statistics, before the checkpoint and eval hooks (registered after it) run."""

    def __init__(self) -> None:
        self.before: dict[int, dict] = {}

    def after_step(self) -> None:
        self.before[self.trainer.iter] = _statistics(self.trainer.model)


def _train_with_rank_local_statistics(output_dir: str) -> None:
    """Per rank: a DDP toy model with BatchNorm trained on this rank's own data, checkpoints at iterations 2 and
    5 (final), evaluations at iterations 1, 3 and 5; writes what it saw to ``rank<R>.pth``."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch >= 2.14 deprecates broadcast_buffers
        model = torch.nn.parallel.DistributedDataParallel(ToyRegressor(dim=4), broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = SimpleTrainer(model, ToyLoader(seed=comm.get_rank()), optimizer)
    trainer.checkpointer = Checkpointer(model, output_dir, trainer=trainer)
    evaluated = {}

    def evaluate() -> dict:
        evaluated[trainer.iter] = _statistics(model)
        return {}

    record = _RecordStatistics()
    trainer.register_hooks(
        {
            "record": record,
            "checkpointer": PeriodicCheckpointer(period=3),
            "eval": EvalHook(eval_period=2, eval_function=evaluate, eval_after_train=False),
        }
    )
    trainer.train(0, 6)
    state = {"before": record.before, "evaluated": evaluated}
    torch.save(state, os.path.join(output_dir, f"rank{comm.get_rank()}.pth"))


def _mean(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    return (first + second) / 2


def test_ranks_checkpoint_and_evaluate_the_average_of_their_statistics(tmp_path):
    launch(_train_with_rank_local_statistics, 2, use_gpu=False, args=(str(tmp_path),))
    ranks = [torch.load(tmp_path / f"rank{rank}.pth", weights_only=True) for rank in (0, 1)]
    before = [rank["before"] for rank in ranks]

    # Evaluated at iterations 1, 3 and 5: both ranks with the mean of their statistics of that step.
    assert sorted(ranks[0]["evaluated"]) == sorted(ranks[1]["evaluated"]) == [1, 3, 5]
    for iteration in (1, 3, 5):
        for name in ("running_mean", "running_var"):
            assert not torch.allclose(before[0][iteration][name], before[1][iteration][name])
            expected = _mean(before[0][iteration][name], before[1][iteration][name])
            for rank in ranks:
                torch.testing.assert_close(rank["evaluated"][iteration][name], expected)

    # Checkpointed at iteration 2 and at the end: the mean; num_batches_tracked as each rank counted it.
    for file_name, iteration in (("model_0000002.pth", 2), ("model_final.pth", 5)):
        saved = torch.load(tmp_path / file_name, weights_only=True)["model"]
        for name in ("running_mean", "running_var"):
            assert not torch.allclose(before[0][iteration][name], before[1][iteration][name])
            expected = _mean(before[0][iteration][name], before[1][iteration][name])
            torch.testing.assert_close(saved[f"norm.{name}"], expected)
        assert int(saved["norm.num_batches_tracked"]) == iteration + 1


def test_one_process_keeps_its_statistics():
    model = ToyRegressor(dim=4)
    model.norm.running_mean.fill_(3.0)
    model.norm.running_var.fill_(5.0)
    average_batch_norm_statistics(model)  # no process group: nothing to average with
    assert torch.equal(model.norm.running_mean, torch.full((4,), 3.0))
    assert torch.equal(model.norm.running_var, torch.full((4,), 5.0))
