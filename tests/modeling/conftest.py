import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads_and_fixed_seed():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the machine is shared; keep tests fast but polite
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
