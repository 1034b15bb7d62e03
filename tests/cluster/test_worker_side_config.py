"""The worker plugin the scheduler sends is built from the worker's own config.

On a real cluster the scheduler and the workers are configured apart: a worker host may set
its own `oomguard.worker.crash-dir`. Dask gives every worker the plugin the scheduler
registered, replacing the one its nanny gave it; built on the scheduler, it carried the
scheduler's crash dir, the worker wrote its crash file and flight record where its nanny
never looked, and every death was reported with no stack and no executing task (found by
the multi-host lab, tests/hosts).
"""

from __future__ import annotations

import ctypes
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard

pytestmark = pytest.mark.timeout(180)


def segfault_task(x):
    time.sleep(0.5)
    ctypes.string_at(0)


def test_workers_keep_their_nannys_crash_dir(tmp_path):
    nanny_dir = tmp_path / "nanny-crash"
    with (
        dask.config.set(
            {
                "distributed.nanny.preload": ["oomguard.worker_plugin"],
                "oomguard.worker.crash-dir": str(nanny_dir),
                "oomguard.worker.sample-interval": "100ms",
            }
        ),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        # The scheduler's own config names another crash dir. (In-process nannies share
        # the nested dicts of this process's config, so this is set only for the install.)
        with dask.config.set({"oomguard.worker.crash-dir": str(tmp_path / "scheduler-crash")}):
            oomguard.install(client)

        def plugin_dir(dask_worker):
            plugin = dask_worker.plugins.get("oomguard-worker")
            return (type(plugin).__name__, plugin.crash_dir) if plugin else None

        (seen,) = client.run(plugin_dir).values()
        assert seen == ("OomguardWorkerPlugin", str(nanny_dir))

        fut = client.submit(segfault_task, 1, pure=False)
        failures = oomguard.Failures(client)
        deadline = time.monotonic() + 60
        while not (events := failures.events(cause="native_crash")):
            assert time.monotonic() < deadline, "no native_crash event"
            time.sleep(0.2)
        fut.cancel()
        # The nanny found the faulthandler dump and the flight record: the shard is named
        # and blamed, the signature is the crash's own.
        assert events[0].shard == str(fut.key)
        assert events[0].signature_title.startswith("SIGSEGV in "), events[0].signature_title
        assert "segfault_task" in events[0].signature_title
        # The restarted worker (registered after the install) has its nanny's dir too.
        client.wait_for_workers(1, timeout=60)
        (seen,) = client.run(plugin_dir).values()
        assert seen == ("OomguardWorkerPlugin", str(nanny_dir))
