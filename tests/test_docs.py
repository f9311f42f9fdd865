"""The documents stay true: every test that docs/reliability.md cites as proof exists."""

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELIABILITY = os.path.join(REPO, "docs", "reliability.md")


def cited_tests():
    with open(RELIABILITY) as f:
        return sorted(set(re.findall(r"`(tests/[^`]+?\.py(?:::\w+)?)", f.read())))


def test_reliability_cites_tests():
    assert len(cited_tests()) >= 20


@pytest.mark.parametrize("reference", cited_tests())
def test_cited_test_exists(reference):
    path, _, name = reference.partition("::")
    assert os.path.isfile(os.path.join(REPO, path)), f"docs/reliability.md cites {path}, which does not exist"
    if name:
        with open(os.path.join(REPO, path)) as f:
            assert f"def {name}(" in f.read(), f"docs/reliability.md cites {reference}, which does not exist"
