"""A SIGTERM to the nanny itself (`dask worker` stopped in order, or in a container that the
kubelet evicts) is a requested stop for Dask and for blame, and leaves a trace (issue 26):
the nanny tells the scheduler the signal and the tasks its worker was executing, and the
scheduler logs them. Only an eviction (the pod lookup's verdict, tests/unit/test_kubernetes)
becomes a failure event. A real `dask worker` process with the nanny preload."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import dask_worker, wait_for

pytestmark = pytest.mark.timeout(180)


def test_sigterm_to_the_nanny_is_a_logged_stop_with_its_tasks(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="oomguard.scheduler")
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(n_workers=0, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        env = {**os.environ, "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp_path / "crash")}
        worker = dask_worker(cluster.scheduler_address, env=env)
        try:
            client.wait_for_workers(1, timeout=60)
            fut = client.submit(time.sleep, 60, key="sleepy-evicted", pure=False)
            addr = next(iter(client.scheduler_info()["workers"]))
            wait_for(lambda: client.processing().get(addr), "the task did not start", 30)
            time.sleep(1.0)  # executing, in the flight record
            worker.send_signal(signal.SIGTERM)  # to the nanny's process: `dask worker`
            assert worker.wait(60) == 0 or worker.returncode is not None
            failures = oomguard.Failures(client)
            line = wait_for(
                lambda: [
                    r.message for r in caplog.records if "was stopped by SIGTERM" in r.message
                ],
                "no log line of the nanny's stop",
                30,
            )[0]
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        assert "while its worker ran 1 task(s): sleepy-evicted" in line, line
        # A stop in order: no failure event, no death, the task moved without a count.
        assert failures.events() == []
        stats = failures._query("stats")
        assert stats["deaths"] == 0 and stats["displaced"] >= 1, stats
        assert (
            client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.tasks["sleepy-evicted"].suspicious
            )
            == 0
        )
        fut.cancel()


def _dask_worker(address: str, env: dict, nthreads: int) -> subprocess.Popen:
    return dask_worker(address, nthreads=nthreads, env=env)


def test_shards_moved_off_a_stopped_worker_are_said_as_they_were(tmp_path, caplog):
    """Issue 27: SIGTERM to a `dask worker --nthreads 2` while it executed 2 tasks and had
    more queued. The run's summary said "3 queued shards were moved
    off dead workers"; 2 of them were executing, and the worker was stopped, not dead."""
    caplog.set_level(logging.INFO, logger="oomguard.scheduler")
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(n_workers=0, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        env = {**os.environ, "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp_path / "crash")}
        first = _dask_worker(cluster.scheduler_address, env, nthreads=2)
        second = None
        try:
            client.wait_for_workers(1, timeout=60)
            addr = next(iter(client.scheduler_info()["workers"]))
            with distributed.span("moved"):
                keys = [f"moved-{i}" for i in range(6)]
                futs = client.map(time.sleep, [3.0] * 6, key=keys, pure=False)
            wait_for(
                lambda: len(client.processing()[addr]) >= 3,
                "more tasks than threads never reached the worker",
                30,
            )
            time.sleep(1.0)  # two executing, in the flight record; the others queued
            on_first = client.processing()[addr]
            first.send_signal(signal.SIGTERM)  # to the nanny's process: `dask worker`
            first.wait(60)
            second = _dask_worker(cluster.scheduler_address, env, nthreads=2)
            client.gather(futs)  # the rest ran on the second worker
            line = next(r.message for r in caplog.records if "stopped by SIGTERM" in r.message)
            status = oomguard.Failures(client).pipeline("moved")
        finally:
            for p in (first, second):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(10)
    assert "while its worker ran 2 task(s)" in line, line
    assert status.status == "succeeded", status
    moved = len(on_first)
    assert status.summary.endswith(
        f"; {moved} shards were moved off workers that died or stopped, without counting "
        f"against them (2 executing, {moved - 2} queued)."
    ), status.summary
