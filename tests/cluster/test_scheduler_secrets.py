"""A real `dask scheduler --preload oomguard.scheduler_plugin` whose PostgreSQL history URL
holds the password in a form libpq cannot read (issue 39): before, its "history is away"
warning printed libpq's `invalid percent-encoded token: "S3cr%zz..."`. Now the warning, the
rest of its log, /metrics, the `stats` query and a fleet query's error show "***" and never
the password; the scheduler runs and keeps its events in the spool. tests/unit/
test_history_secrets.py has the CLI and the shipper's other paths."""

from __future__ import annotations

import json
import os
import sys
import urllib.request

import pytest
from distributed import Client

import oomguard
from cluster_helpers import DaskScheduler, wait_for

pytestmark = pytest.mark.timeout(300)

FORMS = {
    "query": "postgresql://oomguard@127.0.0.1:{port}/{db}?password=S3cr%zzTOKEN",
    "user": "postgresql://oomguard:S3cr%zzTOKEN@127.0.0.1:{port}/{db}",
}


def clean(text: str) -> bool:
    return "TOKEN" not in text and "S3cr" not in text


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_scheduler_never_shows_the_password(postgres, pg_url, tmp_path, form):
    url = FORMS[form].format(port=postgres.port, db=pg_url.rsplit("/", 1)[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "DASK_OOMGUARD__SCHEDULER__STORE": url,
        "DASK_OOMGUARD__SCHEDULER__SPOOL": str(tmp_path / "spool.sqlite3"),
        "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME": "etl",
    }
    scheduler = DaskScheduler(tmp_path, env)
    try:
        address = scheduler.address()
        away = wait_for(
            lambda: [line for line in scheduler.text().splitlines() if "is away" in line],
            lambda: scheduler.text()[-3000:],
            timeout=60,
        )
        assert "invalid percent-encoded token" in away[0] and "***" in away[0], away
        port = json.loads(scheduler.file.read_text())["services"]["dashboard"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert "oomguard_history_up 0.0" in metrics and clean(metrics)
        with Client(address, timeout=60) as client:
            stats = client.sync(client.scheduler.oomguard_query, what="stats")
            assert clean(repr(stats))
            with pytest.raises(Exception) as fleet:
                oomguard.Failures(client, fleet=True).events()
            assert clean(str(fleet.value)) and "***" in str(fleet.value), fleet.value
            assert oomguard.Failures(client).events() == []  # its own view still answers
    finally:
        scheduler.stop()
    assert clean(scheduler.text()), scheduler.text()[-3000:]
