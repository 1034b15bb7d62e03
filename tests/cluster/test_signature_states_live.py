"""Signature states on a real cluster (issue 40): a real segfault in a worker (LocalCluster
with nannies) gives a native_crash signature; a person resolves it through the scheduler
(`Failures.resolve`, then `oomguard report --resolve`); the same crash again makes it
regressed, with the time of its first death after the resolve, and
`oomguard_signature_regressions_total` on the scheduler's /metrics goes up by exactly one,
however many deaths the crash took."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from distributed import Client, KilledWorker, LocalCluster

import oomguard
from cluster_helpers import wait_for, wait_installed

FIXTURES = str(pathlib.Path(__file__).resolve().parent.parent / "fixtures")
pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def shardapp(monkeypatch):
    # Importable here (so tasks pickle by reference) and in the spawned worker processes.
    monkeypatch.syspath_prepend(FIXTURES)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [FIXTURES, os.environ.get("PYTHONPATH")]))
    )
    import shardapp.core

    return shardapp


def regressions(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    (value,) = re.findall(r"^oomguard_signature_regressions_total (\S+)$", text, re.M)
    return float(value)


def report(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_resolve_then_the_same_segfault_again_is_one_regression(shardapp, tmp_path):
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "history.sqlite3"))
        wait_installed(client, 2)
        failures = oomguard.Failures(client, timeout=60)
        port = cluster.scheduler.http_server.port
        address = cluster.scheduler_address

        def crash(n: int) -> int:
            """Segfault a worker with shard n until oomguard (or Dask) gives up on it; the
            deaths there are now."""
            future = client.submit(shardapp.core.process_shard, n, key=f"crash-{n}")
            with pytest.raises(KilledWorker):  # oomguard's PipelineAborted is one
                future.result(timeout=240)
            return len(failures.deaths(cause="native_crash"))

        deaths = crash(0)
        assert deaths >= 1
        (sig,) = failures.signatures(cause="native_crash")
        assert sig.title == "SIGSEGV in shardapp.core.parse_record \u2190 process_shard"
        assert (sig.state, sig.count) == ("new", deaths)
        assert regressions(port) == 0

        resolved = failures.resolve(sig.id, note="fixed in shardapp 1.4")
        before = time.time()
        assert resolved.state == "resolved" and resolved.resolve_note == "fixed in shardapp 1.4"
        assert resolved.resolved_by and resolved.resolved_at <= before
        assert failures.resolve(sig.id, note="twice").resolve_note == "fixed in shardapp 1.4"

        total = crash(1)  # the same crash, another shard
        row = wait_for(
            lambda: (r := failures.signature(sig.id)).state == "regressed" and r,
            lambda: f"not regressed: {failures.signature(sig.id)!r}",
            60,
            interval=0.2,
        )
        assert resolved.resolved_at < row.regressed_at < time.time()
        assert (row.regressions, row.count) == (1, total)
        assert total - deaths >= 1  # each death after the resolve came back; one regression
        wait_for(lambda: regressions(port) >= 1, "no regression on /metrics", 30, 0.2)
        assert regressions(port) == 1

        # The report, from the scheduler: the state in the table and in --json.
        done = report("--scheduler", address, "--signatures", "--json")
        assert done.returncode == 0, done.stderr
        (shown,) = [s for s in json.loads(done.stdout)["signatures"] if s["id"] == sig.id]
        assert (shown["state"], shown["regressions"]) == ("regressed", 1)
        done = report("--scheduler", address, "--signatures")
        assert re.search(rf"^{sig.id}\s+regressed\s", done.stdout, re.M), done.stdout
        # Resolved again from the command line; an id the history does not have: exit 3.
        done = report("--scheduler", address, "--resolve", sig.id, "--note", "really fixed")
        assert done.returncode == 0 and f"resolved signature {sig.id}" in done.stdout, done
        assert failures.signature(sig.id).state == "resolved"
        done = report("--scheduler", address, "--resolve", "0123456789abcdef")
        assert done.returncode == 3 and "'0123456789abcdef'" in done.stderr, done
        assert sig.id in done.stderr  # the ids there are
