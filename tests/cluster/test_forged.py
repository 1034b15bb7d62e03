"""Only Dask and the worker's registered nanny decide a death (issue 28, items 2 and 3).

A real LocalCluster with nannies: a second client publishes `remove-worker` events to
"all", a plain connection sends death reports for a worker that never registered and for a
real worker under another nanny's name. None of them may touch another client's pipeline;
a real SIGKILL of a worker under its nanny is still decided with its nanny's report.
"""

from __future__ import annotations

import os
import signal
import time

import dask
import distributed
import msgpack
import pytest
from distributed import Client, LocalCluster, rpc

import oomguard
from cluster_helpers import wait_for, wait_installed
from oomguard._death.build import example_report
from oomguard.worker_plugin import REPORT_HANDLER

pytestmark = pytest.mark.timeout(240)

GRACE = 1.0  # report-grace-timeout, seconds


def wait_file(path: str) -> str:
    deadline = time.monotonic() + 120  # never outlive the test
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "done"


def snapshot(client) -> dict:
    return client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
    )


def judged(client) -> bool:
    stats = snapshot(client)
    return bool(stats["rejected"] or stats["reports"])


def processing_on(client, key: str) -> str | None:
    def where(dask_scheduler, key=key):
        ts = dask_scheduler.tasks.get(key)
        return ts.processing_on.address if ts is not None and ts.processing_on else None

    return client.run_on_scheduler(where)


@pytest.fixture
def cluster(tmp_path):
    with (
        dask.config.set(
            {
                "oomguard.scheduler.report-grace-timeout": f"{GRACE}s",
                "distributed.deploy.lost-worker-timeout": "300s",
            }
        ),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "forged.sqlite3"))
        wait_installed(client, 2)
        yield cl, client


def victim(client, tmp_path, worker: str):
    """A shard of the pipeline "victim" running on `worker` until `go` exists."""
    go = tmp_path / "go"
    with distributed.span("victim"):
        fut = client.submit(wait_file, str(go), key="victim-0", workers=[worker], pure=False)
    wait_for(lambda: processing_on(client, "victim-0") == worker, "the victim never ran")
    return fut, go


def report_for(worker: str, nanny: str, key: str) -> bytes:
    report = example_report(
        **{
            "worker": worker,
            "nanny": nanny,
            "host": "localhost",
            "exitcode": -11,
            "crash_text": "Fatal Python error: Segmentation fault\n",
            "time": time.time(),
            "executing": [
                {
                    "key": key,
                    "prefix": "wait_file",
                    "start": time.time() - 1,
                    "thread": 1,
                    "stack": None,
                    "stack_time": None,
                }
            ],
        }
    )
    return msgpack.packb(report)


async def _send(address: str, payload: bytes) -> dict:
    async with rpc(address) as s:
        return await getattr(s, REPORT_HANDLER)(report=payload)


def test_a_clients_remove_worker_event_is_not_a_death(cluster, tmp_path):
    cl, client = cluster
    worker = sorted(client.scheduler_info()["workers"])[0]
    fut, go = victim(client, tmp_path, worker)
    with Client(cl.scheduler_address) as other:
        for i in range(4):  # past max-shard-infra-failures (3)
            other.log_event(
                "all",
                {
                    "action": "remove-worker",
                    "worker": worker,
                    "processing-tasks": ["victim-0"],
                    "expected": False,
                    "stimulus_id": f"forged-{i}",
                },
            )
            time.sleep(GRACE + 0.5)  # each "death" runs out its grace without a report
    time.sleep(GRACE)
    go.touch()
    assert fut.result(timeout=60) == "done"  # main: PipelineAborted
    stats = snapshot(client)
    assert stats["removals_refused"] == 4
    assert stats["deaths"] == 0
    assert worker in client.scheduler_info()["workers"]


def test_a_report_for_a_worker_that_never_registered_is_refused(cluster, tmp_path):
    cl, client = cluster
    worker = sorted(client.scheduler_info()["workers"])[0]
    fut, go = victim(client, tmp_path, worker)
    # Any connection, for made-up workers on its own IP, naming the victim's key.
    for port in range(9, 13):  # past max-shard-infra-failures (3)
        payload = report_for(f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:8", "victim-0")
        assert client.sync(_send, cl.scheduler_address, payload) == {"status": "queued"}
    wait_for(lambda: judged(client), "the reports were never judged", 20)
    time.sleep(GRACE * 2)  # main: aborted
    go.touch()
    assert fut.result(timeout=60) == "done"
    stats = snapshot(client)
    assert stats["rejected"] == {"unregistered": 4}
    assert stats["reports"] == 0 and stats["deaths"] == 0


def test_a_report_naming_another_nanny_is_refused(cluster, tmp_path):
    cl, client = cluster
    worker = sorted(client.scheduler_info()["workers"])[0]
    nanny = client.scheduler_info()["workers"][worker]["nanny"]
    fut, go = victim(client, tmp_path, worker)
    # The real worker, from its nanny's host, but under another nanny's name.
    payload = report_for(worker, "tcp://127.0.0.1:8", "victim-0")
    assert nanny != "tcp://127.0.0.1:8"
    assert client.sync(_send, cl.scheduler_address, payload) == {"status": "queued"}
    wait_for(lambda: judged(client), "the report was never judged", 20)
    stats = snapshot(client)
    assert stats["rejected"] == {"wrong_nanny": 1}  # main: {} and 1 report taken
    assert stats["reports"] == 0
    go.touch()
    assert fut.result(timeout=60) == "done"


def test_a_genuine_death_is_still_decided_with_its_report(cluster, tmp_path):
    """SIGKILL of a worker under its nanny: the report arrives around Dask's removal (either
    side of it) and is taken from the registered nanny, kept past the removal."""
    cl, client = cluster
    worker = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[worker])[worker]
    fut, go = victim(client, tmp_path, worker)
    os.kill(pid, signal.SIGKILL)
    failures = oomguard.Failures(client)
    events = wait_for(
        lambda: [e for e in failures.events() if e.worker == worker],
        "the death was never recorded",
        30,
        interval=0.2,
    )
    assert [e.cause for e in events] == ["sigkill"], events  # not worker_lost: the report
    assert events[0].evidence, events[0]
    stats = snapshot(client)
    assert stats["reports"] == 1 and stats["rejected"] == {}
    assert stats.get("removals_refused", 0) == 0
    go.touch()
    fut.cancel()  # bound to the dead worker's address
