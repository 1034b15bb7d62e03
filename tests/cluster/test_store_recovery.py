"""A failure store that cannot be opened never stops `dask scheduler --preload
oomguard.scheduler_plugin` (issue 28, item 10): a corrupt store, or one written by a newer
oomguard, is moved aside (kept byte for byte), a fresh store records the cluster's deaths,
one WARNING names both paths, and oomguard_store_errors_total counts it.
`oomguard.scheduler.store-errors: fail` refuses to start, as before.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest
from distributed import Client

import oomguard
from cluster_helpers import wait_for
from oomguard._store import FailureStore

pytestmark = pytest.mark.timeout(240)


def kill_myself(i: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return i


def _old_store(path) -> None:
    """A real oomguard store with one event, as a scheduler left it."""
    from oomguard._models import FailureEvent

    store = FailureStore(str(path))
    store.start()
    store.add(
        FailureEvent(
            time=1.0,
            kind="infra",
            cause="sigkill",
            shard="old-shard",
            pipeline="",
            worker="tcp://10.0.0.1:1",
            host="10.0.0.1",
            signature_id="old",
            signature_title="old",
            evidence={},
            attempt=1,
        )
    )
    assert store.flush()
    store.close()


def corrupt(path) -> None:
    _old_store(path)
    with open(path, "r+b") as f:  # sqlite_master's page, after the 100-byte header
        f.seek(100)
        f.write(b"\xa5" * 3996)


def newer(path) -> None:
    _old_store(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _scheduler(tmp_path, env):
    log = tmp_path / "scheduler.log"
    sched_file = tmp_path / "scheduler.json"
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
        stderr=open(log, "w"),
    )
    return proc, log, sched_file


def _address(sched_file, proc, log):
    def address():
        if sched_file.exists():
            try:
                return json.loads(sched_file.read_text())["address"]
            except (ValueError, KeyError):
                pass
        assert proc.poll() is None, f"the scheduler exited: {log.read_text()[-3000:]}"
        return None

    return wait_for(address, lambda: log.read_text()[-3000:], timeout=90, interval=0.1)


def _store_errors(dask_scheduler, kind):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("oomguard_store_errors_total", {"kind": kind})


@pytest.mark.parametrize(
    "spoil, kind", [(corrupt, "corrupt"), (newer, "newer_schema")], ids=["corrupt", "newer"]
)
def test_the_scheduler_starts_on_a_fresh_store_and_keeps_the_old_one_aside(tmp_path, spoil, kind):
    store = tmp_path / "f.sqlite3"
    spoil(store)
    before = _digest(store)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),  # this module's tasks
        "DASK_OOMGUARD__SCHEDULER__STORE": str(store),
        "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp_path / "crash"),
    }
    proc, log, sched_file = _scheduler(tmp_path, env)
    procs = [proc]
    try:
        address = _address(sched_file, proc, log)
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                address,
                "--nthreads",
                "1",
                "--no-dashboard",
                "--preload-nanny",
                "oomguard.worker_plugin",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "worker.log", "w"),
        )
        procs.append(worker)
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=90)
            fut = client.submit(kill_myself, 1, pure=False)
            failures = oomguard.Failures(client)
            events = wait_for(
                lambda: [e for e in failures.events() if e.shard == fut.key],
                lambda: log.read_text()[-3000:],
                timeout=120,
                interval=0.5,
            )
            counted = client.run_on_scheduler(_store_errors, kind=kind)
            fut.cancel()
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert events[0].cause == "sigkill"
    assert counted == 1.0
    (aside,) = [p for p in glob.glob(f"{store}.unreadable-*") if p[-4:] not in ("-wal", "-shm")]
    assert _digest(aside) == before  # kept byte for byte
    text = log.read_text()
    warnings = [line for line in text.splitlines() if "WARNING" in line and aside in line]
    assert len(warnings) == 1 and str(store) in warnings[0] and kind in warnings[0], text
    # The fresh store at the configured path holds the new death, not the old history.
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    shards = {row[0] for row in conn.execute("SELECT shard FROM events")}
    conn.close()
    assert fut.key in shards and "old-shard" not in shards


def test_store_errors_fail_refuses_to_start_and_leaves_the_file(tmp_path):
    store = tmp_path / "f.sqlite3"
    corrupt(store)
    before = _digest(store)
    env = {
        **os.environ,
        "DASK_OOMGUARD__SCHEDULER__STORE": str(store),
        "DASK_OOMGUARD__SCHEDULER__STORE_ERRORS": "fail",
    }
    proc, log, _ = _scheduler(tmp_path, env)
    try:
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code != 0, text
    assert "failed to start" in text.lower() and str(store) in text, text
    assert glob.glob(f"{store}.unreadable-*") == []
    assert _digest(store) == before
