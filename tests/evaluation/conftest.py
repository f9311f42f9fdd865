import pytest


def pytest_collection_modifyitems(items):
    # pycocotools' Cython decode trips numpy 2's __array__(copy=) deprecation; not ours to fix.
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:pycocotools.mask"))
