"""A real worker's annotated task while another process holds the ledger's lock (issue 28):
a stopped process holding it (here SIGSTOPped right after taking it) must not freeze the
worker's event loop; the task waits, counted, and runs once the lock is free."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_installed

pytestmark = pytest.mark.timeout(180)

# Takes the ledger's lock, says so, and stops itself (a worker SIGSTOPped mid-update).
STOPPED_HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def annotated(x):
    return x + 1


def _round_trip(client, address) -> float:
    began = time.monotonic()
    client.run(lambda: 1, workers=[address])
    return time.monotonic() - began


def test_a_stopped_lock_holder_does_not_freeze_the_workers_loop(tmp_path):
    ledger = str(tmp_path / "ledger.json")
    with dask.config.set(
        {
            "distributed.nanny.preload": ["oomguard.worker_plugin"],
            "oomguard.worker.cgroup-limit": "false",
            "oomguard.worker.admission.ledger": ledger,
            "oomguard.worker.admission.max-wait": "60s",
            "oomguard.worker.admission.floor": "0",
        }
    ):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            wait_installed(client, 1, timeout=30)
            (address,) = client.scheduler_info()["workers"]
            holder = subprocess.Popen(
                [sys.executable, "-c", STOPPED_HOLDER, ledger], stdout=subprocess.PIPE
            )
            # A frozen loop would never answer: the holder is killed after 10 s regardless.
            watchdog = threading.Timer(10.0, holder.kill)
            watchdog.start()
            try:
                assert holder.stdout.readline() == b"locked\n"
                with oomguard.memory(64 * 2**20):
                    fut = client.submit(annotated, 1, key="annotated-1")
                time.sleep(0.5)  # the task asks, and keeps asking, while the lock is held
                lags = [_round_trip(client, address) for _ in range(10)]
                assert max(lags) < 1.0, f"worker loop frozen: round trips {lags}"
                assert fut.status == "pending"  # not decided: waiting, not run unadmitted
                busy = client.run(
                    lambda dask_worker: (
                        dask_worker.plugins["oomguard-worker"]._admission.ledger.busy
                    )
                )
                assert busy[address] >= 1
            finally:
                watchdog.cancel()
                holder.kill()  # SIGKILL ends a stopped process; its lock goes with it
                holder.wait()
            assert fut.result(timeout=30) == 2
            metrics = client.run(lambda: __import__("prometheus_client").generate_latest())
            assert b"oomguard_admission_ledger_busy_total" in metrics[address]
    # Nothing is left behind: the task's lease was released.
    fd = os.open(ledger, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert b'"leases":[]' in os.pread(fd, 1 << 16, 0)
    finally:
        os.close(fd)
