"""One failure history for many clusters, in a real PostgreSQL (tests/pg_lab.py), written by
real `dask scheduler --preload oomguard.scheduler_plugin` processes with real nannies
(issue 29): two clusters' same crash is one signature; the database away while a cluster
runs, and the scheduler killed -9 during the outage, lose and duplicate nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from distributed import Client

import oomguard
from cluster_helpers import DaskScheduler, dask_worker, wait_for
from oomguard._store import FailureStore
from oomguard._store.pg import pg_connect

pytestmark = pytest.mark.timeout(300)


def kill_myself(i: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return i


def healthy(x: int) -> int:
    time.sleep(0.5)
    return x + 1


def _env(tmp_path, url: str, name: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),  # this module's tasks
        "DASK_OOMGUARD__SCHEDULER__STORE": url,
        "DASK_OOMGUARD__SCHEDULER__SPOOL": str(tmp_path / f"{name}.sqlite3"),
        "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME": name,
        "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp_path / f"crash-{name}"),
    }


class Cluster:
    """A scheduler with the history and one `dask worker` (nanny preloaded)."""

    def __init__(self, tmp_path, url: str, name: str, workers: int = 1) -> None:
        self.env = _env(tmp_path, url, name)
        self.scheduler = DaskScheduler(tmp_path, self.env, name)
        self.address = self.scheduler.address()
        self.workers = [
            dask_worker(self.address, env=self.env, own_session=True) for _ in range(workers)
        ]
        self.client = Client(self.address, timeout=60)
        self.client.wait_for_workers(workers, timeout=90)

    def death(self, i: int) -> oomguard.FailureEvent:
        """One worker killed by its task; its event, once the scheduler stored it."""
        fut = self.client.submit(kill_myself, i, pure=False)
        failures = oomguard.Failures(self.client)
        events = wait_for(
            lambda: [e for e in failures.events() if e.shard == fut.key],
            lambda: self.scheduler.text()[-3000:],
            timeout=120,
            interval=0.3,
        )
        fut.cancel()  # it may have died again meanwhile: the spool says how often
        return events[-1]

    def close(self, kill: bool = False) -> None:
        self.client.close()
        if kill:
            self.scheduler.kill()
        for w in self.workers:
            try:
                os.killpg(w.pid, signal.SIGKILL if kill else signal.SIGINT)
            except ProcessLookupError:
                pass
        for w in self.workers:
            w.wait(30)
        self.scheduler.stop()


def history_events(url: str, shard: str) -> list[tuple]:
    with pg_connect(url) as conn:
        return conn.execute(
            "SELECT cluster, cause, signature_id FROM events WHERE shard = %s ORDER BY local_id",
            (shard,),
        ).fetchall()


def spool_events(path, shard: str | None = None, signature: str | None = None) -> list[tuple]:
    """What a scheduler recorded in its spool (it is closed or dead)."""
    store = FailureStore(str(path))
    store.start()
    try:
        return [
            (e.cluster, e.cause, e.signature_id)
            for e in reversed(store.events(shard=shard, signature=signature, limit=None))
        ]
    finally:
        store.close()


def report(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_two_clusters_one_crash_one_signature(pg_url, tmp_path):
    seen = {}
    for name in ("etl-a", "etl-b"):
        cluster = Cluster(tmp_path, pg_url, name)
        try:
            seen[name] = [cluster.death(i) for i in range(2 if name == "etl-a" else 1)]
        finally:
            cluster.close()  # its last batch goes to the history on the way out
    (signature,) = {e.signature_id for events in seen.values() for e in events}
    proc = report("--store", pg_url, "--signatures", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [s for s in json.loads(proc.stdout)["signatures"] if s["id"] == signature]
    assert len(rows) == 1, rows
    recorded = [spool_events(tmp_path / f"{n}.sqlite3", signature=signature) for n in seen]
    assert rows[0]["count"] == sum(map(len, recorded)) >= 3  # both clusters' deaths
    assert rows[0]["clusters"] == ["etl-a", "etl-b"]
    assert "lab-secret" not in proc.stdout + proc.stderr
    narrowed = report("--store", pg_url, "--events", "--json", "--cluster", "etl-b")
    assert narrowed.returncode == 0, narrowed.stderr
    events = json.loads(narrowed.stdout)["events"]
    assert {(e["shard"], e["cluster"]) for e in events} == {(seen["etl-b"][0].shard, "etl-b")}


def test_the_database_away_and_the_scheduler_killed_lose_nothing(postgres, pg_url, tmp_path):
    cluster = Cluster(tmp_path, pg_url, "etl")
    try:
        first = cluster.death(1)
        wait_for(lambda: history_events(pg_url, first.shard), "the first death never arrived")

        postgres.stop()  # the database goes away while the cluster runs
        start = time.monotonic()
        assert cluster.client.submit(healthy, 1, pure=False).result(timeout=60) == 2
        healthy_s = time.monotonic() - start
        during = cluster.death(2)  # decided and stored locally, the database away
        up = cluster.client.run_on_scheduler(_history_state)
        assert up["up"] is False and up["backlog"] >= 1, up

        postgres.start()
        got = wait_for(lambda: history_events(pg_url, during.shard), "never sent", timeout=90)
        assert ("etl", during.cause, during.signature_id) in got

        postgres.stop()  # and again: this time the scheduler is killed during the outage
        lost = cluster.death(3)
    finally:
        cluster.close(kill=True)
    postgres.start()
    assert history_events(pg_url, lost.shard) == []  # acknowledged in the spool only
    # A new scheduler on the same spool (no workers needed) sends it, once.
    restarted = DaskScheduler(tmp_path, _env(tmp_path, pg_url, "etl"), "etl-again")
    try:
        restarted.address()
        wait_for(lambda: history_events(pg_url, lost.shard), "the spool was not sent", 90)
    finally:
        restarted.stop()
    spool = tmp_path / "etl.sqlite3"
    for event in (first, during, lost):
        recorded = spool_events(spool, shard=event.shard)
        assert history_events(pg_url, event.shard) == recorded  # each once, none lost
        assert ("etl", event.cause, event.signature_id) in recorded
    with pg_connect(pg_url) as conn:
        (n,) = conn.execute("SELECT count FROM signatures WHERE id = %s", (lost.signature_id,))
    assert n[0] == len(spool_events(spool, signature=lost.signature_id)) >= 3
    assert healthy_s < 30  # the task never waited for the database
    text = cluster.scheduler.text()
    assert text.count("is away") >= 1 and "lab-secret" not in text


def _history_state(dask_scheduler) -> dict:
    shipper = dask_scheduler.plugins["oomguard"].store.history.shipper
    return {"up": shipper.up, "backlog": shipper.backlog}
