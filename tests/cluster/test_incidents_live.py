"""Incidents and related signatures on real clusters with nannies (issue 40).

- Three worker processes of one host SIGKILLed within a moment are ONE incident of three
  deaths: in `Failures.incidents()`, in each death's `incident`, in `oomguard report` from
  the scheduler and, after the scheduler is gone, from its store file; Dask's own count of
  removals is the incident's.
- Two Python functions of shardapp (`process_shard` -> `parse_record`, `process_header` ->
  `parse_header`) both crash in `ctypes.string_at(0)`: two signatures (their stacks differ),
  linked both ways as related by their one native crash site, in the API, the report and
  the dashboard's signature detail.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for, wait_installed

pytestmark = pytest.mark.timeout(400)
FIXTURES = str(pathlib.Path(__file__).resolve().parent.parent / "fixtures")


def oomguard_report(*argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def settled(failures: oomguard.Failures, deaths: int) -> bool:
    """Every removal decided, and `deaths` deaths stored."""
    return failures._query("stats").get("pending_deaths") == 0 and len(failures.deaths()) >= (
        deaths
    )


def unexpected_removals(client: Client) -> int:
    return sum(
        1
        for _, msg in client.get_events("all")
        if isinstance(msg, dict)
        and msg.get("action") == "remove-worker"
        and not msg.get("expected")
    )


def dashboard_incidents(dask_scheduler) -> list[tuple[int, str]]:
    import time

    from oomguard.scheduler_plugin._dashboard_data import incident_columns, read_store

    plugin = dask_scheduler.plugins["oomguard"]
    plugin.store.flush()
    cols = incident_columns(read_store(plugin.store, time.time(), plugin.cluster).incidents)
    return list(zip(cols["deaths"], cols["id"], strict=True))


def test_three_workers_of_one_host_killed_at_once_are_one_incident(tmp_path):
    store = str(tmp_path / "history.sqlite3")
    with (
        dask.config.set({"oomguard.scheduler.cluster-name": "incident-lab"}),
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=store)
        wait_installed(client, 3)
        pids = client.run(os.getpid)
        assert len(pids) == 3
        for pid in pids.values():  # one moment: a container kill, a node's OOM sweep
            os.kill(pid, signal.SIGKILL)
        failures = oomguard.Failures(client)
        wait_for(
            lambda: settled(failures, 3),
            lambda: f"deaths not all decided: {failures._query('stats')}, {failures.deaths()}",
            timeout=180,
            interval=0.2,
        )
        deaths = failures.deaths()
        assert len(deaths) == unexpected_removals(client) == 3, deaths
        (incident,) = failures.incidents()
        assert incident.deaths == 3 and {d.incident for d in deaths} == {incident.id}
        assert incident.id in {d.id for d in deaths}  # named by its first death
        assert incident.hosts == [socket.gethostname()]
        assert (incident.cause, incident.killer) == (deaths[0].cause, deaths[0].killer.name)
        assert incident.cause == "sigkill" and incident.end - incident.start < 5.0
        assert incident.summary.startswith(f"host {socket.gethostname()}: 3 workers within ")
        # Each death still counts once: in its signature, and in Dask's own count.
        signatures = {s.id: s.count for s in failures.signatures()}
        assert sum(signatures[i] for i in {d.signature_id for d in deaths}) == 3
        # The report, from the scheduler; the dashboard's incident table.
        doc = oomguard_report("--scheduler", cluster.scheduler_address, "--incidents")
        assert doc["incidents"] == [incident.to_dict()]
        assert client.run_on_scheduler(dashboard_incidents) == [(3, incident.id)]
    # The scheduler is gone: its store file gives the same incident.
    assert oomguard_report("--store", store, "--incidents")["incidents"] == [incident.to_dict()]


@pytest.fixture
def shardapp(monkeypatch):
    # Importable here (so tasks pickle by reference) and in the spawned worker processes.
    monkeypatch.syspath_prepend(FIXTURES)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [FIXTURES, os.environ.get("PYTHONPATH")]))
    )
    import shardapp.core

    return shardapp


def detail(dask_scheduler, signature_id: str) -> str:
    from oomguard.scheduler_plugin._dashboard_data import read_detail

    plugin = dask_scheduler.plugins["oomguard"]
    plugin.store.flush()
    return read_detail(plugin.store, signature_id)


def test_two_callers_of_one_native_crash_site_are_two_related_signatures(shardapp, tmp_path):
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "history.sqlite3"))
        wait_installed(client, 2)
        futures = []
        for name, fn in (("records", shardapp.core.process_shard), ("headers", shardapp.core.process_header)):  # fmt: skip
            with distributed.span(name):
                futures.append(client.submit(fn, 1, key=f"{name}-1"))
        for future in futures:  # each crashed its worker until oomguard aborted it
            with pytest.raises(Exception, match="oomguard aborted|KilledWorker"):
                future.result(timeout=240)
        failures = oomguard.Failures(client)
        wait_for(lambda: settled(failures, 2), "the crashes were not all decided", timeout=120)
        titles = {
            "SIGSEGV in shardapp.core.parse_record \u2190 process_shard",
            "SIGSEGV in shardapp.core.parse_header \u2190 process_header",
        }
        rows = {s.title: s for s in failures.signatures(cause="native_crash")}
        assert set(rows) == titles, rows
        one, other = (rows[t] for t in sorted(titles))
        assert one.id != other.id
        assert [(r["id"], r["why"]) for r in one.related] == [(other.id, "same crash site")]
        assert [(r["id"], r["why"]) for r in other.related] == [(one.id, "same crash site")]
        assert one.related[0]["title"] == other.title
        # The report, with --signature ID; and the dashboard's detail of the signature.
        doc = oomguard_report(
            "--scheduler", cluster.scheduler_address, "--signatures", "--signature", one.id
        )
        assert doc["signatures"][0]["related"] == one.related
        text = client.run_on_scheduler(detail, signature_id=one.id)
        assert f"related    {other.id} (same crash site): {other.title}" in text
