"""Deaths without a report, MemoryError, and closes that are not failures (issue 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for

pytestmark = pytest.mark.timeout(180)


def nap(seconds):
    time.sleep(seconds)
    return seconds


def short_of_memory(marker_dir):
    # Raises MemoryError on its first attempt only.
    marker = os.path.join(marker_dir, "raised")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise MemoryError("could not allocate 8 GiB")
    return "ok"


@pytest.fixture
def cluster(tmp_path):
    with dask.config.set({"oomguard.scheduler.report-grace-timeout": "2s"}):
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
            yield cl, client


def test_memory_error_is_infra_and_does_not_use_retries(cluster, tmp_path):
    cl, client = cluster
    with distributed.span("tight"):
        # retries=0: Dask alone would fail it; oomguard retries a MemoryError as infra.
        fut = client.submit(short_of_memory, str(tmp_path), key="tight-0", pure=False)
        assert fut.result(timeout=60) == "ok"
    [event] = oomguard.Failures(client).shard("tight-0")
    assert (event.kind, event.cause) == ("infra", "memory_error")
    assert event.signature_title.startswith("MemoryError in")


def test_lost_with_its_nanny_is_worker_lost(tmp_path):
    """A worker whose nanny dies with it (a host or pod gone) sends no report."""
    with dask.config.set({"oomguard.scheduler.report-grace-timeout": "2s"}):
        with (
            LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    cl.scheduler_address,
                    "--nworkers",
                    "1",
                    "--nthreads",
                    "1",
                    "--preload-nanny",
                    "oomguard.worker_plugin",
                    "--no-dashboard",
                ],
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                client.wait_for_workers(1, timeout=60)
                with distributed.span("lost"):
                    # time.sleep, not a test function: the worker process started here
                    # cannot import this test module.
                    fut = client.submit(time.sleep, 60, key="lost-0", pure=False)
                    wait_for(
                        lambda: any(client.processing().values()),
                        "lost-0 never reached a worker",
                        timeout=20.0,
                        interval=0.1,
                    )
                    time.sleep(1.0)
                    os.killpg(proc.pid, signal.SIGKILL)  # nanny and worker together
                failures = oomguard.Failures(client)
                [event] = wait_for(
                    lambda: failures.events(cause="worker_lost"),
                    "no worker_lost death",
                    timeout=30,
                    interval=0.1,
                )
                assert event.shard == "lost-0"  # one task, one thread: it was executing
                assert event.kind == "infra"
                assert "no death report" in event.evidence["source"]
                fut.cancel()
            finally:
                os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
                proc.wait(10)


def test_graceful_closes_are_not_failures(cluster):
    cl, client = cluster
    client.submit(nap, 0.01).result()
    client.restart()  # every worker killed by its nanny on request
    client.wait_for_workers(2, timeout=60)
    cl.scale(1)  # scale-down, as adaptive does
    wait_for(
        lambda: len(client.scheduler_info()["workers"]) == 1,
        "not scaled down to 1",
        timeout=20.0,
        interval=0.1,
    )
    client.retire_workers(list(client.scheduler_info()["workers"]))
    wait_for(
        lambda: len(client.scheduler_info()["workers"]) == 0,
        "workers not retired",
        timeout=20.0,
        interval=0.1,
    )
    time.sleep(3)  # past the grace timeout
    assert oomguard.Failures(client).events() == []
    stats = client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
    )
    assert stats["deaths"] == 0
    assert stats["internal_errors"] == 0
