import logging

import pytest
import torch

from lazytrain.config import LazyConfig
from tests.engine import toy

TOY_CONFIG = __file__.replace("conftest.py", "toy_config.py")


@pytest.fixture(autouse=True)
def _reset_counts_and_logging():
    """Fresh construction counts; one thread; undo what `default_setup` does to the library logger."""
    toy.CONSTRUCTIONS.clear()
    torch.set_num_threads(1)
    library_logger = logging.getLogger("lazytrain")
    handlers, propagate, level = list(library_logger.handlers), library_logger.propagate, library_logger.level
    yield
    for handler in library_logger.handlers:
        if handler not in handlers:
            library_logger.removeHandler(handler)
            handler.close()
    library_logger.propagate, library_logger.level = propagate, level


@pytest.fixture
def toy_cfg(tmp_path):
    cfg = LazyConfig.load(TOY_CONFIG)
    cfg.train.output_dir = str(tmp_path / "run")
    return cfg
