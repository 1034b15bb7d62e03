"""A native crash is charged to the thread that crashed (issue 27).

One real worker with 2 threads, behind a real nanny: a task under span "crash" segfaults
(ctypes) while a task under span "calm" sleeps on the other thread. The faulthandler dump
names the crashing thread and the flight record which task ran on it: only the crasher is
blamed; "calm" is displaced each time, never counted, and finishes.
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


def crash(started: str) -> None:
    # Crash only while "calm" runs beside it in this very process (both executing).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(started) and str(os.getpid()) in open(started).read().split():
            break
        time.sleep(0.05)
    time.sleep(0.2)
    ctypes.string_at(0)


@pytest.fixture
def client(tmp_path):
    with (
        dask.config.set(
            {
                "oomguard.worker.sample-interval": "100ms",
                "oomguard.scheduler.report-grace-timeout": "20s",
                "distributed.deploy.lost-worker-timeout": "300s",
            }
        ),
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "f.sqlite3"))
        wait_installed(client, 1)
        yield client


def test_a_segfault_is_charged_to_its_thread_not_to_the_task_beside_it(client, tmp_path):
    started = str(tmp_path / "calm-started")
    with distributed.span("calm"):
        quiet = client.submit(calm, started, 4.0, key="calm-task", pure=False)
    wait_for(lambda: os.path.exists(started), "the calm task never started", timeout=60)
    with distributed.span("crash"):
        crasher = client.submit(crash, started, key="crash-task", pure=False)

    with pytest.raises(oomguard.PipelineAborted) as e:
        crasher.result(timeout=240)
    assert "crash-task" in str(e.value) and "calm" not in str(e.value)
    # The healthy task is not aborted: it was displaced each time, and finishes.
    assert quiet.result(timeout=120) == "calm done"
    deaths = len(open(started).read().split()) - 1  # each death restarted "calm" once
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
