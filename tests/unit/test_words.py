"""The sentences a person reads on the scheduler side (`oomguard._words`)."""

from __future__ import annotations

import doctest

from oomguard._words import aborts, causes, deaths, summaries


def test_docstring_examples():
    results = [doctest.testmod(module) for module in (aborts, causes, deaths, summaries)]
    assert sum(r.attempted for r in results) > 0
    assert [r.failed for r in results] == [0, 0, 0, 0]
