"""Issue 28, items 4 and 7: forged reports flood the scheduler beside one real SIGKILL
death. The real death is still recorded from its nanny's report, with its evidence; each
forged report costs at most one event of bounded size (before the bound: 64 events, each
with the whole evidence, for every report).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from distributed import Client, LocalCluster

import oomguard
from _forged_reports import flood_in_thread
from cluster_helpers import wait_for, wait_installed

pytestmark = pytest.mark.timeout(240)

FORGED = 120
#: What one forged death may leave in the store: its event, the evidence capped at 16 KiB,
#: the row's other fields and SQLite's own overhead.
PER_FORGED_DEATH = 32 * 1024


def nap(seconds):
    time.sleep(seconds)
    return seconds


def _store_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


def test_a_real_death_is_recorded_beside_a_flood_of_forged_reports(tmp_path):
    store = str(tmp_path / "flood.sqlite3")
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=store)
        wait_installed(client, 1)
        worker = next(iter(client.scheduler_info()["workers"]))
        pid = client.run(os.getpid, workers=[worker])[worker]
        running = client.submit(nap, 120, key="nap-real", workers=[worker], pure=False)
        wait_for(lambda: client.processing(workers=[worker])[worker], "nap never started")
        time.sleep(1.0)  # the flight record has sampled it
        empty = _store_bytes(store)

        thread, sent = flood_in_thread(cl.scheduler_address, FORGED, rate=60.0)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)  # mid-flood
        thread.join(60)
        assert sent["sent"] == FORGED

        failures = oomguard.Failures(client)

        def genuine():
            return [e for e in failures.events(cause="sigkill") if e.worker == worker]

        [event] = wait_for(genuine, "the real SIGKILL death was not recorded", timeout=90)
        running.cancel()
        # Its own nanny's report: the task it ran, blamed from the flight record.
        assert event.shard == "nap-real"
        assert event.evidence["blame"] == "flight record"
        assert "late_report" not in event.evidence
        assert event.signature_id

        # Every forged report is decided (after the grace) or refused: none left waiting.
        plugin = "oomguard"

        def settled(dask_scheduler):
            p = dask_scheduler.plugins[plugin]
            return not len(p.core.pairing) and not p.desk.intake.pending()

        wait_for(lambda: client.run_on_scheduler(settled), "forged reports still wait", 60)
        stats = client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins[plugin].metrics_snapshot()
        )
        events = failures.events(limit=10 * FORGED)
        forged = [e for e in events if e.worker != worker]
        grown = _store_bytes(store) - empty
    # At most one event per forged death (the made-up keys blame nobody real) ...
    assert len(forged) <= FORGED, (len(forged), stats)
    # ... and bounded bytes for each.
    assert grown <= FORGED * PER_FORGED_DEATH, (grown, len(forged))
