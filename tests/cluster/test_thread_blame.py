"""A native crash is charged to the thread that crashed (issue 27).

Real workers with 2 threads each, behind real nannies: a task under span "crash" segfaults
(ctypes) while a task under span "calm" sleeps on the other thread of its worker. The
faulthandler dump names the crashing thread and the flight record which task ran on it:
only the crasher is blamed; "calm" is displaced each time, never counted, and finishes.
With two workers both tasks run on the first (a resource the second does not offer).
"""

from __future__ import annotations

import ctypes
import os
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for, wait_installed

pytestmark = pytest.mark.timeout(300)


def calm(started: str, seconds: float) -> str:
    with open(started, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return "calm done"


def crash(started: str, attempts: str) -> None:
    # Crash while "calm" runs beside it in this very process (both executing); a while
    # after the first attempt, crash anyway.
    with open(attempts, "a") as f:
        f.write(f"{os.getpid()}\n")
    first = len(open(attempts).read().split()) == 1
    deadline = time.monotonic() + (30 if first else 3)
    while time.monotonic() < deadline:
        if os.path.exists(started) and str(os.getpid()) in open(started).read().split():
            break
        time.sleep(0.05)
    time.sleep(0.2)
    ctypes.string_at(0)


async def no_pair_here(dask_worker) -> None:
    await dask_worker.set_resources(pair=0)


@pytest.fixture(params=[1, 2], ids=["1-worker", "2-workers"])
def client(request, tmp_path):
    with (
        dask.config.set(
            {
                "oomguard.worker.sample-interval": "100ms",
                "oomguard.scheduler.report-grace-timeout": "20s",
                "distributed.deploy.lost-worker-timeout": "300s",
            }
        ),
        LocalCluster(
            n_workers=request.param,
            threads_per_worker=2,
            processes=True,
            resources={"pair": 2},
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "f.sqlite3"))
        wait_installed(client, request.param)
        yield client


def test_a_segfault_is_charged_to_its_thread_not_to_the_task_beside_it(client, tmp_path):
    started, attempts = str(tmp_path / "calm-started"), str(tmp_path / "crash-attempts")
    # Both on one worker: a second one takes neither (its own process keeps no "pair").
    others = sorted(client.scheduler_info()["workers"])[1:]
    if others:
        client.run(no_pair_here, workers=others)
    where = {"pure": False, "resources": {"pair": 1}}
    with distributed.span("calm"):
        quiet = client.submit(calm, started, 4.0, key="calm-task", **where)
    wait_for(lambda: os.path.exists(started), "the calm task never started", timeout=60)
    with distributed.span("crash"):
        crasher = client.submit(crash, started, attempts, key="crash-task", **where)

    with pytest.raises(oomguard.PipelineAborted) as e:
        crasher.result(timeout=240)
    assert "crash-task" in str(e.value) and "calm" not in str(e.value)
    # The healthy task is not aborted: it was displaced each time, and finishes.
    assert quiet.result(timeout=120) == "calm done"
    deaths = len(open(attempts).read().split())  # each attempt crashed its worker
    assert deaths >= 2

    failures = oomguard.Failures(client)
    events = failures.events(cause="native_crash")
    assert len(events) == deaths, [(ev.shard, ev.evidence.get("blame")) for ev in events]
    assert {ev.shard for ev in events} == {"crash-task"}
    for ev in events:
        assert ev.evidence["crash_task"] == "crash-task", ev.evidence
        assert ev.evidence["crash_thread"].startswith("0x"), ev.evidence
        assert "crashing thread" in ev.evidence["blame"], ev.evidence
    assert not failures.events(shard="calm-task")

    [sig] = failures.signatures(cause="native_crash")
    assert "SIGSEGV" in sig.title and list(sig.pipelines) == ["crash"], sig

    calm_status = failures.pipeline("calm")
    assert calm_status.status == "succeeded", calm_status.summary
    assert "displaced by a neighbour's crash" in calm_status.summary, calm_status.summary
    assert failures.pipeline("crash").status == "aborted"


def current_task() -> str:
    return str(distributed.get_worker().get_current_task())


def threads_kind(dask_worker) -> tuple[str, int]:
    return type(dask_worker.active_threads).__name__, len(dask_worker.active_threads)


def test_installed_while_a_task_runs_the_thread_watch_waits_until_none_runs(tmp_path):
    # A task dispatched before the install deletes its entry from the dict Dask gave it:
    # wrapping that dict while it runs would leave its entry behind for ever.
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
    ):
        busy = client.submit(calm, str(tmp_path / "started"), 4.0, pure=False)
        wait_for(lambda: (tmp_path / "started").exists(), "the task never started")
        oomguard.install(client, store=str(tmp_path / "f.sqlite3"))
        wait_installed(client, 1)
        [(kind, n)] = client.run(threads_kind).values()
        assert (kind, n) == ("dict", 1)  # Dask's own, while the task runs
        assert busy.result(timeout=60) == "calm done"
        wait_for(
            lambda: list(client.run(threads_kind).values()) == [("_ThreadsSeen", 0)],
            lambda: f"not wrapped once idle: {client.run(threads_kind)}",
            timeout=30,
        )
        fut = client.submit(current_task, key="who-am-i", pure=False)
        assert fut.result(timeout=60) == "who-am-i"
