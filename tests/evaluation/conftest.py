import pytest
import torch


def pytest_collection_modifyitems(items):
    # pycocotools' Cython decode trips numpy 2's __array__(copy=) deprecation; not ours to fix.
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:pycocotools.mask"))


@pytest.fixture(autouse=True)
def _one_thread():
    # See tests/modeling/conftest.py: 2 threads on a busy 2-core machine are far slower than 1.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
