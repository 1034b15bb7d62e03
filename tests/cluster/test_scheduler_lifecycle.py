"""Deaths without a report, MemoryError, and closes that are not failures (issue 4)."""

from __future__ import annotations

import os
import signal
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import dask_worker, wait_for

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
            proc = dask_worker(cl.scheduler_address, own_session=True)
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


def _kill_at_a_blind_moment(pgid: int):
    """Runs on the scheduler's event loop (nothing moves between the look and the kill):
    when its only worker has two tasks (one running, one queued behind it by Dask's
    saturation) and its last heartbeat, a moment ago, saw neither executing, SIGKILL the
    `dask worker` process group (nanny and worker: no report). The keys, or None."""

    def probe(dask_scheduler):
        [ws] = dask_scheduler.workers.values()
        processing = {ts.key for ts in ws.processing}
        seen = {ts.key for ts in ws.executing} & processing
        # The running task started after that heartbeat, so it cannot end before the kill
        # (it has >= 0.15 s to go) and the next heartbeat is >= 0.35 s away.
        if len(processing) == 2 and not seen and time.time() - ws.last_seen < 0.15:
            os.killpg(pgid, signal.SIGKILL)
            return sorted(processing)
        return None

    return probe


def test_a_host_lost_while_a_task_waited_behind_the_running_one_is_one_death(tmp_path):
    """Issue 27: a `dask worker --nthreads 1` lost with its nanny during a pipeline of
    0.3 s tasks. Dask keeps a second task queued behind the running one; with no report and
    no heartbeat to say which ran, both are suspects. It was two worker_lost events (one per
    task, each "blame: every task on the worker") and an infra failure of the queued shard's
    own. It is one event naming both; neither shard's own history moves; both still count
    against Dask's bound."""
    with dask.config.set({"oomguard.scheduler.report-grace-timeout": "2s"}):
        with (
            LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
            proc = dask_worker(cl.scheduler_address, own_session=True)
            try:
                client.wait_for_workers(1, timeout=60)
                with distributed.span("naps"):
                    keys = [f"nap-{i}" for i in range(300)]
                    futs = client.map(time.sleep, [0.3] * len(keys), key=keys, pure=False)
                probe = _kill_at_a_blind_moment(proc.pid)
                suspects = wait_for(
                    lambda: client.run_on_scheduler(probe),
                    "no moment with a running and a queued task unseen by a heartbeat",
                    timeout=60,
                    interval=0.01,
                )
                proc.wait(10)
                failures = oomguard.Failures(client)
                wait_for(
                    lambda: failures.events(cause="worker_lost"), "no worker_lost", timeout=30
                )
                time.sleep(3)  # past the grace timeout: a second event would be here
                events = failures.events()
                status = failures.pipeline("naps")
                budget = client.run_on_scheduler(
                    lambda dask_scheduler: {
                        k: dask_scheduler.plugins["oomguard"].core.budget.deaths(k)
                        for k in suspects
                    }
                )
                stats = failures._query("stats")
                own = {s: failures.shard(s) for s in suspects}
                found = {s: [e.id for e in failures.events(shard=s)] for s in suspects}
                members = [r.shards for r in failures.signatures()]
            finally:
                os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
                proc.wait(10)
            client.cancel(futs)
    assert len(events) == 1, events  # one death, one event
    [event] = events
    assert (event.cause, event.kind, event.pipeline, event.shard) == (
        "worker_lost",
        "infra",
        "naps",
        "",
    ), event
    assert list(event.evidence["suspects"]) == suspects, (event.evidence, suspects)
    summary = event.evidence["summary"]
    assert f"one of {suspects[0]!r}, {suspects[1]!r} was running; 1 thread" in summary, summary
    # Neither suspect carries an infra failure of its own; a filter on either finds the death.
    assert own == {s: [] for s in suspects}, own
    assert found == {s: [event.id] for s in suspects}, found
    assert members == [[]], members
    assert status.infra_failures == 1 and "after 1 worker death (1 worker_lost)" in status.summary
    assert stats["deaths"] == 1, stats
    assert budget == {s: 1 for s in suspects}  # both still count against Dask's bound
