"""Restart (issue 8, part 3): kill -9 the scheduler mid-stream; nothing acknowledged is lost.

A real `dask scheduler --preload oomguard.scheduler_plugin` process with a persistent store.
The test streams failing tasks at it through a real worker (each exception an event; death
reports are taken only from a registered worker's nanny, issue 28) and keeps asking it for
its events (`oomguard_query`, which commits before it answers):
an event the scheduler has shown is an acknowledged event. Mid-stream, SIGKILL. Then the
store passes SQLite's integrity check, and a restarted scheduler on the same store still
has every acknowledged event, field for field.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from distributed import Client, rpc

pytestmark = pytest.mark.timeout(300)


def _start_scheduler(tmp_path, store, tag):
    sched_file = tmp_path / f"scheduler-{tag}.json"
    env = {
        **os.environ,
        "DASK_OOMGUARD__SCHEDULER__STORE": str(store),
        # One cluster across the restart: its own history (issue 29), whatever the port.
        "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME": "restart-test",
        "DASK_OOMGUARD__SCHEDULER__REPORT_GRACE_TIMEOUT": "200ms",
        "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            ":0",
            "--scheduler-file",
            str(sched_file),
            "--preload",
            "oomguard.scheduler_plugin",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / f"scheduler-{tag}.log", "w"),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sched_file.exists():
            try:
                return proc, json.loads(sched_file.read_text())["address"]
            except (ValueError, KeyError):
                pass
        assert proc.poll() is None, (tmp_path / f"scheduler-{tag}.log").read_text()[-3000:]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the scheduler did not start")


async def _all_events(s) -> list[dict]:
    """Every stored event, page by page (one reply is capped in rows and bytes)."""
    rows: list[dict] = []
    cursor: dict = {}
    while page := await s.oomguard_query(what="events", limit=1_000_000, **cursor):
        rows += page
        cursor = {"before": [page[-1]["time"], page[-1]["id"]]}
    return rows


async def _events(address):
    async with rpc(address) as s:
        for _ in range(100):
            try:
                return await _all_events(s)
            except Exception:  # the plugin may still be starting (preload)
                await asyncio.sleep(0.2)
    raise AssertionError("no oomguard_query answer")


async def _stream_and_kill(address, proc, min_acked, max_seconds):
    acked: dict[int, dict] = {}
    sent = 0
    killed_at_send = None
    start = time.monotonic()
    await _events(address)  # the plugin is up
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--no-nanny",
            "--nthreads",
            "2",
            "--no-dashboard",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = await Client(address, asynchronous=True, timeout=60)
    try:
        await client.wait_for_workers(1, timeout=60)
        async with rpc(address) as s:
            while True:
                futures = [
                    client.submit(operator.truediv, sent + i, 0, pure=False) for i in range(20)
                ]
                try:
                    await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
                    rows = await _all_events(s)
                except Exception:
                    return acked, sent, killed_at_send
                sent += len(futures)
                for row in rows:
                    acked[row["id"]] = row
                if killed_at_send is not None:
                    return acked, sent, killed_at_send
                if len(acked) >= min_acked or time.monotonic() - start > max_seconds:
                    # Mid-stream: tasks erring, the writer busy.
                    os.kill(proc.pid, signal.SIGKILL)
                    killed_at_send = sent
    finally:
        worker.kill()
        worker.wait(timeout=30)
        try:
            await asyncio.wait_for(client.close(), 5)
        except Exception:
            pass


def test_kill_9_keeps_acknowledged_events(tmp_path, long_run, record_figures):
    store = tmp_path / "failures.sqlite3"
    proc, address = _start_scheduler(tmp_path, store, "first")
    try:
        acked, sent, killed_at = asyncio.run(
            _stream_and_kill(address, proc, 2000 if long_run else 300, 60 if long_run else 15)
        )
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed_at is not None and len(acked) > 0

    # SQLite's own verdict on the file the killed scheduler left (WAL and all).
    conn = sqlite3.connect(store)
    integrity = conn.execute("PRAGMA integrity_check").fetchall()
    on_disk = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.close()
    assert integrity == [("ok",)]

    proc2, address2 = _start_scheduler(tmp_path, store, "second")
    try:
        after = {row["id"]: row for row in asyncio.run(_events(address2))}
    finally:
        proc2.send_signal(signal.SIGTERM)
        try:
            proc2.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc2.kill()
    missing = [i for i in acked if i not in after]
    changed = [i for i in acked if i in after and after[i] != acked[i]]
    record_figures(
        "restart",
        tasks_failed=sent,
        events_acknowledged=len(acked),
        events_recovered=len(acked) - len(missing) - len(changed),
        events_on_disk_after_kill=on_disk,
        events_after_restart=len(after),
        integrity_check=integrity[0][0],
    )
    assert not missing and not changed, (len(missing), len(changed))
    assert len(after) >= len(acked)
