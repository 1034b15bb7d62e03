"""The set-up line's note on a Dask release outside the tested range (`_compat`)."""

from __future__ import annotations

import logging

import pytest

from oomguard import _compat


@pytest.mark.parametrize(
    "version, note",
    [
        ("2024.12.0", False),
        ("2025.5.1", False),
        ("2026.8.0", False),
        ("2024.11.2", True),
        ("2026.8.1", True),
        ("2027.1.0rc1", True),
        ("2026.9.0.dev3+g1a2b", True),
        ("not-a-version", True),
    ],
)
def test_a_release_outside_the_tested_range_is_named(version, note):
    assert bool(_compat._untested(version)) is note
    if note:
        assert _compat._untested(version) == " (tested from 2024.12.0 to 2026.8.0)"


def test_a_check_that_raises_counts_as_missing(caplog):
    def broken(obj):
        raise RuntimeError("a release that moved the class")

    internals = (
        _compat.Internal("A.present", lambda obj: True, "-"),
        _compat.Internal("B.moved", broken, "B's part is left out"),
        _compat.Internal("C.gone", lambda obj: False, "C's part is left out", True),
    )
    with caplog.at_level(logging.INFO, logger="oomguard.test"):
        gone = _compat.check("scheduler", internals, object(), logging.getLogger("oomguard.test"))
    assert [i.name for i in gone] == ["B.moved", "C.gone"]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith(
        "no B.moved, so B's part is left out; no C.gone, so C's part is left out"
    )


def test_every_listed_internal_is_present_in_the_installed_dask():
    import distributed

    nanny_like = type(
        "N", (), {a: None for a in ("instantiate", "log_event", "worker_kwargs", "process")}
    )()
    assert _compat.missing(_compat.NANNY, nanny_like) == []
    scheduler_like = type(
        "S",
        (),
        {
            "allowed_failures": 3,
            "workers": {},
            "tasks": {},
            "stream_handlers": {"task-erred": print, "log-event": print},
        },
    )()
    assert _compat.missing(_compat.SCHEDULER, scheduler_like) == [], distributed.__version__
