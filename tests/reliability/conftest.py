"""The reliability suite (issue 8): chaos, storm, restart, hostile input, Dask parity.

Default variants are CI-sized. The long variants (the issue's full numbers where the CI
size is smaller) run with ``--long`` or ``OOMGUARD_LONG=1``:

    .venv/bin/python -m pytest tests/reliability -q --long

Every test writes the figures it measured to ``artifacts/reliability-<name>.json``, which
docs/reliability.md quotes.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "artifacts"


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the long reliability variants (also: OOMGUARD_LONG=1)",
    )


def is_long(config) -> bool:
    return bool(config.getoption("--long", default=False)) or os.environ.get(
        "OOMGUARD_LONG", ""
    ) not in ("", "0")


@pytest.fixture
def long_run(request) -> bool:
    """True for the long variants (``--long`` or ``OOMGUARD_LONG=1``)."""
    return is_long(request.config)


@pytest.fixture
def record_figures(request):
    """Write a test's measured figures to artifacts/reliability-<name>.json."""

    def record(name: str, **figures):
        ARTIFACTS.mkdir(exist_ok=True)
        figures["variant"] = "long" if is_long(request.config) else "default"
        figures["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
        path = ARTIFACTS / f"reliability-{name}.json"
        path.write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
        print(f"\n[reliability] {name}: {json.dumps(figures, sort_keys=True, default=str)}")

    return record
