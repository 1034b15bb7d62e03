"""The sentences a person reads on the scheduler side (`oomguard._words`)."""

from __future__ import annotations

import doctest

from oomguard import _words


def test_docstring_examples():
    result = doctest.testmod(_words)
    assert result.attempted > 0 and result.failed == 0
