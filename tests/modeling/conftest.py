import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_and_fixed_seed():
    # One thread: on this shared 2-core machine, 2 OpenMP threads competing with other jobs made a
    # ResNet-18 forward 30x slower (0.7 s instead of 0.02 s) through busy-waiting.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
