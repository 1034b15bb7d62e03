"""The SLURM lab as a pytest fixture `slurm`, for test modules to import (``from
slurm_fixtures import slurm_fixture``): one lab per test module, started in about a second
and stopped after the module whatever happened; its time goes to the end-of-run summary
(tests/conftest.py's SLURM_TIMINGS).

Not a conftest.py: test modules elsewhere import the root conftest by its bare name
(`from conftest import ...`), which a second conftest.py would shadow.
"""

from __future__ import annotations

import atexit
import pathlib
import time

import pytest
from slurm_lab import SlurmLab, missing

from capabilities import require

ROOT_CONFTEST = pathlib.Path(__file__).resolve().parent.parent / "conftest.py"


@pytest.fixture(name="slurm", scope="module")
def slurm_fixture(request):
    """A started `SlurmLab`; stopped after the module (its logs printed if a test failed)."""
    why = missing()
    require(why is None, why or "")
    t0 = time.monotonic()
    failures_before = request.session.testsfailed
    lab = SlurmLab()
    atexit.register(lab.close)  # a run killed past the finalizer
    try:
        lab.start()
        up = time.monotonic() - t0
        yield lab
    finally:
        if request.session.testsfailed > failures_before:
            print(lab.logs(6000))
        lab.close()
        atexit.unregister(lab.close)
    timings = _timings(request)
    if timings is not None:
        timings.append(
            f"  {request.module.__name__}: {time.monotonic() - t0:.0f} s with the lab "
            f"(up in {up:.1f} s)"
        )


def _timings(request) -> list[str] | None:
    """tests/conftest.py's SLURM_TIMINGS, found by path (never by the bare name)."""
    for plugin in request.config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and pathlib.Path(plugin.__file__) == ROOT_CONFTEST:
            return getattr(plugin, "SLURM_TIMINGS", None)
    return None
