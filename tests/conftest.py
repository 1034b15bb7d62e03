"""Shared test set-up.

`capabilities.require` skips a test whose machine capability is missing, and fails it
instead when OOMGUARD_STRICT=1 (CI sets it), so a green CI run means it really ran.
"""

from __future__ import annotations

import os
import pathlib

import pytest

#: `./dev test-matrix` gives each Dask release its own (artifacts/matrix/distributed-<version>).
ARTIFACTS = pathlib.Path(
    os.environ.get("OOMGUARD_ARTIFACTS")
    or pathlib.Path(__file__).resolve().parent.parent / "artifacts"
)


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory):
    """The default failure histories (`$XDG_STATE_HOME/oomguard`) of every cluster the
    session starts go to a directory of its own, never to the user's home."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory, monkeypatch) -> pathlib.Path:
    """This test's own `$XDG_STATE_HOME`: a cluster it starts with no `store` setting
    keeps its history in `<it>/oomguard/<cluster name>.sqlite3`, apart from other tests'."""
    path = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(path))
    return path


@pytest.fixture
def artifacts_dir() -> pathlib.Path:
    """Where tests leave files worth looking at (screenshots, reports); CI keeps them."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def pytest_report_header(config):
    import dask
    import distributed

    strict = os.environ.get("OOMGUARD_STRICT", "") not in ("", "0")
    return [
        f"oomguard strict mode: {'on (missing capabilities fail)' if strict else 'off'}",
        f"dask {dask.__version__}, distributed {distributed.__version__}",
    ]


#: Lines tests add to the end-of-run summary, printed pass or fail (CI keeps the log).
KERNEL_TIMINGS: list[str] = []  # tests/kernel: the VM's boot and scenario times
HOSTS_TIMINGS: list[str] = []  # tests/hosts: the multi-host lab's times
SLURM_TIMINGS: list[str] = []  # tests/slurm: the SLURM lab's time per test module
ADMISSION_FIGURES: list[str] = []  # memory admission: leases, waits, kernel OOM kills
FOLDER_SECONDS: dict[str, float] = {}  # set-up, call and teardown, per folder of tests/


@pytest.fixture
def admission_figures() -> list[str]:
    """Append a line to the end-of-run summary's memory admission section."""
    return ADMISSION_FIGURES


def pytest_runtest_logreport(report):
    parts = report.nodeid.split("::")[0].split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]
    FOLDER_SECONDS[folder] = FOLDER_SECONDS.get(folder, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    by_folder = [f"  {name}: {secs:.0f} s" for name, secs in sorted(FOLDER_SECONDS.items())]
    for heading, lines in (
        ("time per folder (tests/...)", by_folder),
        ("cgroup v2 VM (tests/kernel)", KERNEL_TIMINGS),
        ("multi-host lab (tests/hosts)", HOSTS_TIMINGS),
        ("SLURM lab (tests/slurm)", SLURM_TIMINGS),
        ("memory admission (tests/cluster)", ADMISSION_FIGURES),
    ):
        if lines:
            terminalreporter.write_sep("-", heading)
            for line in lines:
                terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the session (tests/pg_lab.py); skipped, or failed in
    strict mode, where Debian's postgresql or psycopg is missing."""
    from capabilities import require
    from oomguard._urls import driver_missing
    from pg_lab import PostgresLab, bindir

    require(bindir(), "no PostgreSQL server (Debian's postgresql package; ./dev test installs it)")
    missing = driver_missing()
    require(missing is None, missing or "")
    with PostgresLab() as lab:
        yield lab


@pytest.fixture
def pg_url(postgres) -> str:
    """The URL of a new, empty database on the session's server."""
    return postgres.create_database()
