"""The examples in the signature modules' docstrings are true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["", "._paths", "._records", "._rules", "._scrub", "._transport"]


@pytest.mark.parametrize("suffix", MODULES)
def test_docstring_examples(suffix):
    module = importlib.import_module("oomguard._signature" + suffix)
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
