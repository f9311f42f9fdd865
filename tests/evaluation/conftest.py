import pytest


def pytest_collection_modifyitems(items):
    # pycocotools' Cython decode trips numpy 2's __array__(copy=) deprecation; not ours to fix.
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:pycocotools.mask"))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every evaluation test on one thread (tests/conftest.py `one_thread`)."""
