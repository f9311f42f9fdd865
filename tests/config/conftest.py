import pytest

from tests.config import helpers


@pytest.fixture(autouse=True)
def _reset_calls():
    helpers.CALLS.clear()
    yield
