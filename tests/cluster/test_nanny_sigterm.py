"""A SIGTERM to the nanny itself (`dask worker` in a container that the kubelet evicts, or
that its runtime stops) is a requested stop for Dask and for blame, and leaves a trace
(issue 26): the scheduler logs it and records one external event per task the worker was
executing, with no death counted. A real `dask worker` process with the nanny preload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for

pytestmark = pytest.mark.timeout(180)


def test_sigterm_to_the_nanny_is_recorded_as_an_external_stop(tmp_path):
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(n_workers=0, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        env = {**os.environ, "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp_path / "crash")}
        dask_cli = os.path.join(os.path.dirname(sys.executable), "dask")
        worker = subprocess.Popen(
            [
                dask_cli,
                "worker",
                cluster.scheduler_address,
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--no-dashboard",
                "--preload-nanny",
                "oomguard.worker_plugin",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client.wait_for_workers(1, timeout=60)
            fut = client.submit(time.sleep, 60, key="sleepy-evicted", pure=False)
            addr = next(iter(client.scheduler_info()["workers"]))
            wait_for(lambda: client.processing().get(addr), "the task did not start", 30)
            time.sleep(1.0)  # executing, in the flight record
            worker.send_signal(signal.SIGTERM)  # to the nanny's process: `dask worker`
            assert worker.wait(60) == 0 or worker.returncode is not None
            failures = oomguard.Failures(client)
            [event] = wait_for(lambda: failures.events(cause="sigterm"), "no event", 30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        assert event.shard == "sleepy-evicted" and event.kind == "infra"
        assert event.evidence["nanny_stopped"] is True and event.evidence["external"] is True
        assert (event.killer, event.killer_how, event.killer_confidence) == (
            "unknown",
            "inferred",
            "likely",
        )
        assert "SIGTERM to the nanny itself" in event.killer_summary
        # A requested stop: the task moved without a count, no worker death decided.
        stats = failures._query("stats")
        assert stats["deaths"] == 0 and stats["displaced"] >= 1, stats
        assert (
            client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.tasks["sleepy-evicted"].suspicious
            )
            == 0
        )
        fut.cancel()
