"""`ModelEMA` and `EMAHook`: the average, its warm-up, the swap for evaluation, and its place in checkpoints."""

import contextlib
import logging
import math

import pytest
import torch

from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.ema import EMAHook, ModelEMA, find_setting_problems
from lazytrain.engine.hooks import EvalHook
from lazytrain.engine.train_loop import HookBase, SimpleTrainer
from tests.engine import toy


def _state(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _perturb(model, amount=1.0):
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(amount)
            else:
                tensor.add_(3)


def test_decay_warms_up_as_documented():
    model = toy.ToyRegressor()
    ema = ModelEMA(model, decay=0.999, tau=100)
    assert ema.decay_at(100) == pytest.approx(0.999 * (1 - math.exp(-1)))
    assert ema.decay_at(1) < 0.01 and ema.decay_at(2000) == pytest.approx(0.999)
    assert ModelEMA(model, decay=0.9, tau=0).decay_at(1) == 0.9


def test_update_averages_floating_entries_and_copies_integer_buffers():
    model = toy.ToyRegressor()
    before = _state(model)
    ema = ModelEMA(model, decay=0.75, tau=0)
    _perturb(model)
    ema.update(model)
    assert ema.updates == 1
    for name, value in model.state_dict().items():
        if value.is_floating_point():  # weights and the BatchNorm statistics
            assert torch.allclose(ema.averaged_state[name], 0.75 * before[name] + 0.25 * value), name
        else:  # num_batches_tracked
            assert torch.equal(ema.averaged_state[name], value), name


@pytest.mark.parametrize("fail", [False, True], ids=["returns", "raises"])
def test_applied_to_swaps_the_average_in_and_back_exactly(fail):
    model = toy.ToyRegressor()
    ema = ModelEMA(model, decay=0.5, tau=0)
    _perturb(model)
    ema.update(model)
    own, average = _state(model), {name: t.clone() for name, t in ema.averaged_state.items()}
    seen = {}
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext(), ema.applied_to(model):
        seen = _state(model)
        if fail:
            raise RuntimeError("evaluation failed")
    assert all(torch.equal(seen[name], average[name]) for name in average)
    assert all(torch.equal(model.state_dict()[name], own[name]) for name in own)
    assert all(torch.equal(ema.averaged_state[name], average[name]) for name in average)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"decay": 1.0},
            r"ModelEMA\(decay=\) must be in \[0, 1\) .*got 1.0. E.g. 0.9998 .*\(train.ema.decay\)",
        ),
        ({"tau": -1}, r"ModelEMA\(tau=\) must be >= 0 .*got -1 \(train.ema.tau\)"),
    ],
    ids=["decay", "tau"],
)
def test_bad_settings_name_the_key(arguments, message):
    with pytest.raises(ValueError, match=message):
        ModelEMA(toy.ToyRegressor(), **arguments)


def test_checkpoint_model_is_the_average_and_a_full_load_restores_training_weights_and_average(tmp_path):
    model = toy.ToyRegressor()
    ema = ModelEMA(model, decay=0.5, tau=0)
    _perturb(model)
    ema.update(model)
    Checkpointer(model, str(tmp_path), model_ema=ema).save("model_0000001", iteration=1)
    saved = torch.load(tmp_path / "model_0000001.pth", weights_only=True)
    assert saved["ema"] == {"updates": 1, "decay": 0.5, "tau": 0.0}
    assert all(torch.equal(saved["model"][name], ema.averaged_state[name]) for name in ema.averaged_state)
    assert all(torch.equal(saved["training_model"][name], t) for name, t in model.state_dict().items())

    other = toy.ToyRegressor()
    other_ema = ModelEMA(other, decay=0.5, tau=0)
    extra = Checkpointer(other, model_ema=other_ema).load(str(tmp_path / "model_0000001.pth"))
    assert extra == {"iteration": 1}  # the model entries are taken out
    assert all(torch.equal(other.state_dict()[name], t) for name, t in model.state_dict().items())
    assert all(
        torch.equal(other_ema.averaged_state[name], ema.averaged_state[name]) for name in ema.averaged_state
    )
    assert other_ema.updates == 1

    # Weights only (predict, export, train.init_checkpoint): the average.
    plain = toy.ToyRegressor()
    Checkpointer(plain).load(str(tmp_path / "model_0000001.pth"), checkpointables=[])
    assert all(torch.equal(plain.state_dict()[name], ema.averaged_state[name]) for name in ema.averaged_state)


def test_resuming_without_ema_continues_from_the_training_weights(tmp_path, caplog):
    model = toy.ToyRegressor()
    ema = ModelEMA(model, decay=0.5, tau=0)
    _perturb(model)
    ema.update(model)
    Checkpointer(model, str(tmp_path), model_ema=ema).save("model_final")
    other = toy.ToyRegressor()
    with caplog.at_level(logging.WARNING, logger="lazytrain.engine.checkpoint"):
        Checkpointer(other).load(str(tmp_path / "model_final.pth"))
    assert all(torch.equal(other.state_dict()[name], t) for name, t in model.state_dict().items())
    assert "EMA weights are not restored (train.ema.enabled is false)" in caplog.text


def test_evaluation_sees_the_average_and_training_its_own_weights(caplog):
    torch.manual_seed(0)
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.05))
    trainer.model_ema = ModelEMA(model, decay=0.9, tau=0)
    evaluated = []

    def evaluate():
        evaluated.append(_state(model))
        return {"toy": {"AP": 1.0}}

    trainer.register_hooks({"ema": EMAHook(), "eval": EvalHook(eval_period=2, eval_function=evaluate)})
    with caplog.at_level(logging.INFO, logger="lazytrain.engine.hooks"):
        trainer.train(0, 3)
    assert len(evaluated) == 2  # after iteration 1 and at the end
    assert all(torch.equal(evaluated[-1][name], t) for name, t in trainer.model_ema.averaged_state.items())
    assert not torch.equal(model.linear.weight, trainer.model_ema.averaged_state["linear.weight"])
    assert "Evaluating with EMA weights (decay 0.9, 3 updates)" in caplog.text


def test_ema_hook_without_an_average_says_what_to_set():
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.05))
    trainer.register_hooks([EMAHook()])
    with pytest.raises(ValueError, match="trainer.model_ema is not set; .*train.ema.enabled=true"):
        trainer.train(0, 1)


def test_setting_problems_name_each_bad_argument():
    assert find_setting_problems({"decay": 0.9998, "tau": 0}) == {}
    assert list(find_setting_problems({"decay": 1.5, "tau": "long"})) == ["decay", "tau"]
    assert list(find_setting_problems({"decay": True})) == ["decay"]  # a bool is no decay


def test_loading_an_average_of_another_model_names_the_tensor_and_changes_nothing():
    ema = ModelEMA(toy.ToyRegressor(dim=4), decay=0.5, tau=0)
    before = {name: t.clone() for name, t in ema.averaged_state.items()}
    other = ModelEMA(toy.ToyRegressor(dim=3), decay=0.5, tau=0)
    other.updates = 7
    with pytest.raises(ValueError) as error:
        ema.load_state_dict(other.state_dict())
    message = str(error.value)
    assert message.startswith(
        "ModelEMA: the saved average is not of this model: linear.weight is (1, 3) in the checkpoint and (1, 4) "
        "in the model; 5 entries of another shape. "
    ), message
    assert "train.resume=false train.init_checkpoint=CHECKPOINT" in message
    assert all(torch.equal(ema.averaged_state[name], t) for name, t in before.items()) and ema.updates == 0

    state = ema.state_dict()
    state["averaged_state"] = {k: v for k, v in state["averaged_state"].items() if k != "norm.bias"}
    state["averaged_state"]["head.weight"] = torch.zeros(1)
    with pytest.raises(
        ValueError, match=r"not of this model: 1 missing \(norm.bias\); 1 not in the model \(head.weight\)"
    ):
        ema.load_state_dict(state)


class _InfGradientAt(HookBase):
    """Makes the gradients inf at the given iterations, as a float16 overflow does."""

    def __init__(self, iterations):
        self.iterations = set(iterations)

    def after_backward(self):
        if self.trainer.iter in self.iterations:
            for param in self.trainer.model.parameters():
                param.grad.fill_(float("inf"))


def test_steps_the_grad_scaler_skipped_do_not_move_the_average_nor_its_warm_up():
    torch.manual_seed(0)
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(
        model,
        toy.ToyLoader(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        amp_enabled=True,
        amp_dtype="float16",
    )
    # A small first scale, so that only the steps made inf below overflow (65536 overflows this toy's float16).
    trainer.grad_scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    trainer.model_ema = ModelEMA(model, decay=0.9, tau=10)
    seen = []

    class Record(HookBase):
        def after_step(self):
            seen.append((self.trainer.model_ema.updates, _state_of(self.trainer.model_ema)))

    trainer.register_hooks([EMAHook(), _InfGradientAt({2, 3}), Record()])
    trainer.train(0, 6)
    assert [updates for updates, _ in seen] == [1, 2, 2, 2, 3, 4]
    for step in (2, 3):  # skipped: the average is what it was
        assert all(torch.equal(seen[step][1][name], seen[1][1][name]) for name in seen[1][1])
    assert trainer.grad_scaler.get_scale() == 0.25


def _state_of(ema):
    return {name: t.clone() for name, t in ema.averaged_state.items()}
