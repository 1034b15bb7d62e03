"""The lab as a pytest fixture `lab`, for test modules to import (``from lab_fixtures import
lab_fixture``): one lab of five hosts per test ("s" for the scheduler, "h1".."h4" for nannies),
built in half a second and torn down after the test whatever happened, and the lab's
timings for the terminal summary (tests/conftest.py's HOSTS_TIMINGS).

Not a conftest.py: test modules elsewhere import the root conftest by its bare name
(`from conftest import ...`), which a second conftest.py would shadow.
"""

from __future__ import annotations

import atexit
import contextlib
import pathlib
import time

import pytest
from lab import Lab

from capabilities import require

HOSTS = ["s", "h1", "h2", "h3", "h4"]
ROOT_CONFTEST = pathlib.Path(__file__).resolve().parent.parent / "conftest.py"
_TOTAL = {"seconds": 0.0, "tests": 0, "listed": False}


@pytest.fixture(name="lab")
def lab_fixture(request, tmp_path):
    """A started `Lab` of HOSTS; closed (and checked closed) after the test."""
    ok, why = Lab.check()
    require(ok, why)
    t0 = time.monotonic()
    failures_before = request.session.testsfailed
    the_lab = Lab(HOSTS, tmp_path / "hosts")
    atexit.register(_close_quietly, the_lab)  # a run killed past the finalizer
    try:
        the_lab.start()
        yield the_lab
    finally:
        # The test's own report is counted before its fixtures are torn down.
        failed = request.session.testsfailed > failures_before
        if failed:
            print(the_lab.logs(80))
        try:
            the_lab.close()
        finally:
            atexit.unregister(_close_quietly)
            _timing(request, the_lab, time.monotonic() - t0, failed)


def _timing(request, lab: Lab, seconds: float, failed: bool) -> None:
    timings = _timings(request)
    if timings is None:
        return
    _TOTAL["seconds"] += seconds
    _TOTAL["tests"] += 1
    up = "".join(f", cluster up in {s:.0f} s" for s in lab.clusters_up)
    timings.append(
        f"  {request.node.name}: {seconds:.0f} s (network up in "
        f"{lab.timings.get('network up', 0):.1f} s{up}, torn down in "
        f"{lab.timings.get('teardown', 0):.1f} s){' FAILED' if failed else ''}"
    )
    timings.extend(f"    {note}" for note in lab.notes)
    total = (
        f"{_TOTAL['tests']} lab test(s), {len(HOSTS)} hosts each: {_TOTAL['seconds']:.0f} s in all"
    )
    if _TOTAL["listed"]:
        timings[0] = total
    else:
        timings.insert(0, total)
        _TOTAL["listed"] = True


def _timings(request) -> list[str] | None:
    """tests/conftest.py's HOSTS_TIMINGS, found by path (never by the bare name)."""
    for plugin in request.config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and pathlib.Path(plugin.__file__) == ROOT_CONFTEST:
            return getattr(plugin, "HOSTS_TIMINGS", None)
    return None


def _close_quietly(lab: Lab) -> None:
    with contextlib.suppress(Exception):  # at exit: the run has failed already
        lab.close()
