"""BatchNorm running statistics averaged over the ranks in each checkpoint and evaluation, while each rank trains
on with its own, which a resumed run gets back (2 gloo processes)."""

import os
import warnings

import torch

from lazytrain.engine.batch_norm import averaged_batch_norm_statistics, batch_norm_statistics_averaged
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.ema import EMAHook, ModelEMA
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
        self.ema: dict[int, dict] = {}  # the EMA's (updated by the EMA hook, registered before this one)

    def after_step(self) -> None:
        self.before[self.trainer.iter] = _statistics(self.trainer.model)
        ema = self.trainer.model_ema.rank_local_statistics()
        self.ema[self.trainer.iter] = {name.removeprefix("norm."): ema[name].clone() for name in ema}


def _trainer(output_dir: str, hooks: bool) -> tuple[SimpleTrainer, _RecordStatistics, dict]:
    """Per rank: a DDP toy model with BatchNorm, trained on this rank's own data, with an EMA; with `hooks`,
    checkpoints at iterations 2 and 5 (final) and evaluations at iterations 1, 3 and 5."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch >= 2.14 deprecates broadcast_buffers
        model = torch.nn.parallel.DistributedDataParallel(ToyRegressor(dim=4), broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = SimpleTrainer(model, ToyLoader(seed=comm.get_rank()), optimizer)
    trainer.model_ema = ModelEMA(model, decay=0.5, tau=0)
    trainer.checkpointer = Checkpointer(model, output_dir, model_ema=trainer.model_ema, trainer=trainer)
    evaluated = {}

    def evaluate() -> dict:
        evaluated[trainer.iter] = _statistics(model)
        return {}

    record = _RecordStatistics()
    registered = {"ema": EMAHook(), "record": record}
    if hooks:
        registered["checkpointer"] = PeriodicCheckpointer(period=3)
        registered["eval"] = EvalHook(eval_period=2, eval_function=evaluate, eval_after_train=False)
    trainer.register_hooks(registered)
    return trainer, record, evaluated


def _train_with_rank_local_statistics(output_dir: str) -> None:
    """Per rank, three runs of 6 iterations of `_trainer`: with checkpoints and evaluations; without; and
    stopped after iteration 3 with a checkpoint there, resumed from it by a new trainer. Writes what each saw
    to ``rank<R>.pth``."""
    torch.set_num_threads(1)
    trainer, record, evaluated = _trainer(os.path.join(output_dir, "saved"), hooks=True)
    trainer.train(0, 6)
    plain, plain_record, _ = _trainer(os.path.join(output_dir, "plain"), hooks=False)
    plain.train(0, 6)
    stopped, _, _ = _trainer(os.path.join(output_dir, "stopped"), hooks=True)
    stopped.train(0, 4)
    stopped.checkpointer.save("model_stop", iteration=3)
    resumed, resumed_record, _ = _trainer(os.path.join(output_dir, "stopped"), hooks=True)
    assert resumed.checkpointer.load(os.path.join(output_dir, "stopped", "model_stop.pth"))["iteration"] == 3
    resumed.train(4, 6)
    state = {
        "before": record.before,
        "before_ema": record.ema,
        "evaluated": evaluated,
        "plain": plain_record.before,
        "plain_ema": plain_record.ema,
        "resumed": resumed_record.before,
        "ema": trainer.model_ema.rank_local_statistics(),
        "resumed_ema": resumed.model_ema.rank_local_statistics(),
    }
    torch.save(state, os.path.join(output_dir, f"rank{comm.get_rank()}.pth"))


def _mean(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    return (first + second) / 2


def test_ranks_checkpoint_and_evaluate_the_average_and_train_on_with_their_own_statistics(tmp_path):
    launch(_train_with_rank_local_statistics, 2, use_gpu=False, args=(str(tmp_path),))
    ranks = [torch.load(tmp_path / f"rank{rank}.pth", weights_only=True) for rank in (0, 1)]
    before = [rank["before"] for rank in ranks]

    # Evaluated at iterations 1, 3 and 5 with the EMA weights: both ranks with the mean of their EMA's
    # statistics of that step.
    assert sorted(ranks[0]["evaluated"]) == sorted(ranks[1]["evaluated"]) == [1, 3, 5]
    ema = [rank["before_ema"] for rank in ranks]
    for iteration in (1, 3, 5):
        for name in ("running_mean", "running_var"):
            assert not torch.allclose(ema[0][iteration][name], ema[1][iteration][name])
            expected = _mean(ema[0][iteration][name], ema[1][iteration][name])
            for rank in ranks:
                torch.testing.assert_close(rank["evaluated"][iteration][name], expected)

    # Checkpointed at iteration 2 and at the end: the mean; num_batches_tracked as each rank counted it.
    for file_name, iteration in (("model_0000002.pth", 2), ("model_final.pth", 5)):
        saved = torch.load(tmp_path / "saved" / file_name, weights_only=True)
        for name in ("running_mean", "running_var"):
            assert not torch.allclose(before[0][iteration][name], before[1][iteration][name])
            expected = _mean(before[0][iteration][name], before[1][iteration][name])
            torch.testing.assert_close(saved["training_model"][f"norm.{name}"], expected)
        assert int(saved["training_model"]["norm.num_batches_tracked"]) == iteration + 1
        # The EMA's statistics (the file's model) are averaged too, and each rank's own are kept beside.
        own = [saved["trainer"]["per_rank"][rank]["ema_batch_norm"] for rank in (0, 1)]
        for name in ("norm.running_mean", "norm.running_var"):
            assert not torch.allclose(own[0][name], own[1][name])
            torch.testing.assert_close(saved["model"][name], _mean(own[0][name], own[1][name]))

    for rank in ranks:
        # Saving and evaluating changed nothing of training: each step's statistics are those of a run
        # without either, bit for bit.
        for iteration in range(6):
            for name in STATISTICS:
                assert torch.equal(rank["before"][iteration][name], rank["plain"][iteration][name])
            for name in ("running_mean", "running_var"):
                assert torch.equal(rank["before_ema"][iteration][name], rank["plain_ema"][iteration][name])
        # A run stopped with a checkpoint after iteration 3 (between periodic ones) and resumed trains on
        # with each rank's own statistics: bit for bit those of the run that was not stopped.
        assert sorted(rank["resumed"]) == [4, 5]
        for iteration in (4, 5):
            for name in STATISTICS:
                assert torch.equal(rank["resumed"][iteration][name], rank["before"][iteration][name])
        for name, tensor in rank["ema"].items():
            assert torch.equal(rank["resumed_ema"][name], tensor)
    for name in ("model", "training_model"):
        resumed = torch.load(tmp_path / "stopped" / "model_final.pth", weights_only=True)[name]
        uninterrupted = torch.load(tmp_path / "saved" / "model_final.pth", weights_only=True)[name]
        assert all(torch.equal(resumed[key], uninterrupted[key]) for key in uninterrupted)


def test_one_process_keeps_its_statistics():
    model = ToyRegressor(dim=4)
    model.norm.running_mean.fill_(3.0)
    model.norm.running_var.fill_(5.0)
    assert averaged_batch_norm_statistics(model) == {}  # no process group: nothing to average with
    with batch_norm_statistics_averaged(model):
        assert torch.equal(model.norm.running_mean, torch.full((4,), 3.0))
    assert torch.equal(model.norm.running_var, torch.full((4,), 5.0))
