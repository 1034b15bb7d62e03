"""An abort stops the rest of its run, on a real LocalCluster with nannies: a task of the
aborted run that is running on a healthy worker is released there, its result is dropped
when its thread returns, and its dependents never run.
"""

from __future__ import annotations

import os
import signal
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for, wait_installed

pytestmark = pytest.mark.timeout(300)


def mark(path: str) -> None:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def kill_myself(log: str) -> None:
    mark(log)
    os.kill(os.getpid(), signal.SIGKILL)


def long_sibling(started: str, go: str, done: str) -> str:
    """Runs until the test creates `go`: its thread outlives the abort, as real work does."""
    mark(started)
    deadline = time.monotonic() + 240  # never outlive the test if `go` is never created
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    mark(done)
    return "the sibling's result"


def dependent(x: str, ran: str) -> str:
    mark(ran)
    return x


def downstream(x: str, ran: str) -> str:
    """A dependent in another pipeline (its own task group, so Dask keeps it off the span)."""
    mark(ran)
    return x


def inc(x: int) -> int:
    return x + 1


def lines(path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def state_on_worker(key, dask_worker):
    ts = dask_worker.state.tasks.get(key)
    return None if ts is None else ts.state


def states_on_scheduler(keys, dask_scheduler):
    return {k: getattr(dask_scheduler.tasks.get(k), "state", "forgotten") for k in keys}


async def never_crash_here(dask_worker) -> None:
    await dask_worker.set_resources(crash=0)


def removals(client) -> int:
    return sum(
        1
        for _, m in client.get_events("all")
        if isinstance(m, dict) and m.get("action") == "remove-worker"
    )


@pytest.fixture
def client():
    # Every worker, restarted ones included, offers the resource "crash" except the one
    # the test takes from it: the crasher can never queue behind the sibling's thread.
    with (
        dask.config.set(
            {
                "oomguard.scheduler.report-grace-timeout": "2s",
                "distributed.deploy.lost-worker-timeout": "300s",
            }
        ),
        LocalCluster(
            n_workers=3,
            threads_per_worker=1,
            processes=True,
            resources={"crash": 1},
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        yield client


def test_an_abort_releases_its_running_siblings_and_drops_their_results(client, tmp_path):
    allowed = dask.config.get("distributed.scheduler.allowed-failures")
    oomguard.install(client, store=str(tmp_path / "f.sqlite3"))
    wait_installed(client, 3)
    healthy = min(client.scheduler_info()["workers"])
    client.run(never_crash_here, workers=[healthy])
    log, go = tmp_path / "deaths", tmp_path / "go"
    started, done = tmp_path / "sibling-started", tmp_path / "sibling-done"
    dep_ran, outside_ran = tmp_path / "dependent-ran", tmp_path / "outside-dependent-ran"

    with distributed.span("etl"):
        sibling = client.submit(
            long_sibling, str(started), str(go), str(done), workers=[healthy], pure=False
        )
        dep = client.submit(dependent, sibling, str(dep_ran), pure=False)
        wait_for(started.exists, "the sibling never started")
        crasher = client.submit(kill_myself, str(log), resources={"crash": 1}, pure=False)
    outside = client.submit(downstream, sibling, str(outside_ran), pure=False)

    with pytest.raises(oomguard.PipelineAborted) as e:
        crasher.result(timeout=180)
    aborted_at, n, removed = time.time(), lines(log), removals(client)
    assert 1 <= n <= allowed + 1, (n, allowed)
    assert "'etl'" in str(e.value)

    # The sibling errs with the abort now, not when its thread returns...
    wait_for(
        lambda: sibling.status != "pending",
        "the running sibling was not stopped by the abort: it still waits for its thread",
    )
    with pytest.raises(oomguard.PipelineAborted):
        sibling.result(timeout=10)
    # ... because it was released on its worker ("cancelled": Dask's state for a task freed
    # while its thread runs), where its thread still runs.
    wait_for(
        lambda: (
            client.run(state_on_worker, sibling.key, workers=[healthy])[healthy] != "executing"
        ),
        "the sibling was never released on its worker",
    )
    assert client.run(state_on_worker, sibling.key, workers=[healthy])[healthy] == "cancelled"
    assert (lines(started), lines(done)) == (1, 0)

    # Its thread returns a result; the worker drops it, and nothing that needs it runs.
    go.touch()
    wait_for(done.exists, "the sibling's thread never returned")
    wait_for(
        lambda: client.run(state_on_worker, sibling.key, workers=[healthy])[healthy] is None,
        "the worker kept the sibling after its thread returned",
    )
    # Anything the healthy worker said about the sibling reached the scheduler before this.
    assert client.submit(inc, 1, workers=[healthy], pure=False).result(timeout=60) == 2
    assert client.submit(inc, 2, pure=False).result(timeout=60) == 3
    keys = [sibling.key, dep.key, outside.key]
    assert client.run_on_scheduler(states_on_scheduler, keys) == dict.fromkeys(keys, "erred")
    for fut in (dep, outside):
        with pytest.raises(oomguard.PipelineAborted):
            fut.result(timeout=10)
    assert (lines(started), lines(done), lines(dep_ran), lines(outside_ran)) == (1, 1, 0, 0)

    # No worker died after the abort reached the client; the sibling's worker never did.
    assert (lines(log), removals(client)) == (n, removed)
    assert removed == n
    assert healthy in client.scheduler_info()["workers"]
    events = [
        (ev.cause, ev.shard, ev.time - aborted_at) for ev in oomguard.Failures(client).events()
    ]
    assert events and all(shard == crasher.key and after <= 0 for _, shard, after in events), (
        f"expected only the crasher's deaths, all before the abort: {events}"
    )
    assert oomguard.Failures(client).pipeline("etl").status == "aborted"
