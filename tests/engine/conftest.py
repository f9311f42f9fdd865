import pytest
import torch

from lazytrain.config import LazyConfig
from tests.engine import toy

TOY_CONFIG = __file__.replace("conftest.py", "toy_config.py")


@pytest.fixture(autouse=True)
def _reset_counts():
    toy.CONSTRUCTIONS.clear()
    torch.set_num_threads(1)
    yield


@pytest.fixture
def toy_cfg(tmp_path):
    cfg = LazyConfig.load(TOY_CONFIG)
    cfg.train.output_dir = str(tmp_path / "run")
    return cfg
