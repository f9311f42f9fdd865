"""``train.cudnn_benchmark`` and ``train.float32_matmul_precision`` reach torch in every rank's setup; the
recipe's defaults are torch's own; ``train.compile`` reaches the model, or names what the model lacks."""

import os

import pytest
import torch
from omegaconf import OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.program.default import compile_backbone, default_setup

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def restore_backends():
    benchmark, precision = torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()
    yield
    torch.backends.cudnn.benchmark = benchmark
    torch.set_float32_matmul_precision(precision)


def test_each_rank_takes_the_settings_and_a_config_without_them_gets_torchs_defaults(
    tmp_path, restore_backends
):
    train = {"output_dir": str(tmp_path / "a"), "seed": 0}
    default_setup(
        OmegaConf.create({"train": {**train, "cudnn_benchmark": True, "float32_matmul_precision": "high"}})
    )
    assert torch.backends.cudnn.benchmark is True and torch.get_float32_matmul_precision() == "high"
    default_setup(OmegaConf.create({"train": {**train, "output_dir": str(tmp_path / "b")}}))
    assert torch.backends.cudnn.benchmark is False and torch.get_float32_matmul_precision() == "highest"


def test_the_recipes_defaults_are_torchs():
    train = LazyConfig.load(os.path.join(REPO, "recipes", "train.py")).train
    assert (train.cudnn_benchmark, train.float32_matmul_precision) == (False, "highest")


def test_the_recipe_compiles_nothing_unless_asked():
    train = LazyConfig.load(os.path.join(REPO, "recipes", "train.py")).train
    assert dict(train.compile) == {"enabled": False, "mode": None, "backend": "inductor"}


def test_train_compile_reaches_the_model_or_names_what_the_model_lacks():
    class Model(torch.nn.Module):
        def compile_backbone(self, *, mode, backend):
            self.options = (mode, backend)

    cfg = OmegaConf.create(
        {"train": {"compile": {"enabled": True, "mode": "max-autotune", "backend": "inductor"}}}
    )
    model = Model()
    compile_backbone(cfg, model)
    assert model.options == ("max-autotune", "inductor")
    compile_backbone(OmegaConf.create({"train": {}}), torch.nn.Linear(2, 2))  # not enabled: nothing to do
    with pytest.raises(
        TypeError, match=r"the model \(Linear\) has no compile_backbone\(mode=, backend=\) method"
    ):
        compile_backbone(cfg, torch.nn.Linear(2, 2))
