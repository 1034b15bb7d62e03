"""Shard-failure accounting on a real cluster (issue 4).

LocalCluster with nannies; oomguard loaded the way a user would at runtime
(`oomguard.install(client)`); real kernel OOM kills in per-worker cgroups, real SIGKILLs.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import require_worker_groups, wait_for, wait_installed

pytestmark = pytest.mark.timeout(300)

LIMIT = 400 * 2**20


def explode(i, limit):
    time.sleep(0.5)  # let the sampler record this frame
    chunks = [bytearray(limit // 2) for _ in range(4)]
    return len(chunks)


def work(i, seconds=0.05):
    time.sleep(seconds)
    return i


@pytest.fixture
def cluster(tmp_path):
    require_worker_groups()
    with dask.config.set(
        {
            "oomguard.worker.cgroup-limit": "true",
            "oomguard.worker.sample-interval": "100ms",
            "oomguard.scheduler.report-grace-timeout": "3s",
            # Same-size workers: show the repeat-signature path (two deaths on two
            # workers); the larger-worker retry has its own tests (test_resize_live.py).
            "oomguard.scheduler.memory-retry-larger-only": False,
            "distributed.worker.memory.terminate": False,
            # LocalCluster closes a nanny whose worker is missing when a timer set at an
            # earlier death fires during a restart; under many kills that shrinks the
            # cluster (Dask's deploy layer, not oomguard).
            "distributed.deploy.lost-worker-timeout": "1h",
        }
    ):
        with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                memory_limit=LIMIT,
                dashboard_address=":0",
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "failures.sqlite3"))
            wait_installed(client)
            yield cl, client, tmp_path / "failures.sqlite3"


def _worker_pids(client):
    return client.run(os.getpid)


def test_oom_crasher_aborts_its_pipeline_only(cluster):
    cl, client, _ = cluster
    with distributed.span("doomed"):
        bad = client.submit(explode, 7, LIMIT, key=("explode", 7), pure=False)
        fine_a = client.map(work, range(20), key=[("doomed-ok", i) for i in range(20)])
    with distributed.span("healthy"):
        healthy = client.map(work, range(40), key=[("healthy", i) for i in range(40)])

    with pytest.raises(oomguard.PipelineAborted) as info:
        bad.result(timeout=120)
    exc = info.value
    assert exc.pipeline == "doomed"
    assert exc.shard == str(("explode", 7))
    assert exc.cause == "oom_kill"
    assert exc.count == 2
    msg = str(exc)
    for part in ("doomed", "('explode', 7)", "OOM-killed", "oom_kill counted", "limit"):
        assert part in msg, (part, msg)
    # Two deaths on two different workers, with the same signature, were enough.
    events = oomguard.Failures(client).shard(("explode", 7))
    assert [e.cause for e in events] == ["oom_kill", "oom_kill"]
    assert len({e.worker for e in events}) == 2
    assert len({e.signature_id for e in events}) == 1
    assert "explode" in events[0].signature_title
    # The other pipeline completes untouched.
    assert client.gather(healthy) == list(range(40))
    status = oomguard.Failures(client).pipeline("doomed")
    assert status.status == "aborted"
    assert "OOM" in status.summary
    healthy_status = oomguard.Failures(client).pipeline("healthy")
    assert healthy_status.status in ("succeeded", "succeeded_after_infra_failures")
    del fine_a


def test_only_the_executing_task_is_blamed(cluster):
    cl, client, _ = cluster
    addr = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[addr])[addr]
    with distributed.span("blame"):
        # Loose restrictions: both start on `addr`, and may run elsewhere once it died.
        kw = dict(workers=[addr], allow_other_workers=True, pure=False)
        running = client.submit(work, 1, 30, key="running-0", **kw)
        queued = client.submit(work, 2, 0, key="queued-0", **kw)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # Wait until the first one executes and its stack has been sampled.
        if client.run(lambda dask_worker: len(dask_worker.state.executing), workers=[addr])[addr]:
            break
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    assert queued.result(timeout=60) == 2
    failures = oomguard.Failures(client)
    wait_for(
        lambda: failures.shard("running-0"), "no failure of running-0", timeout=20.0, interval=0.1
    )
    assert [e.cause for e in failures.shard("running-0")] == ["sigkill"]
    assert failures.shard("queued-0") == []
    running.cancel()


def flaky(i, marker_dir):
    # Raises on its first two completed attempts, then succeeds: a user error that
    # retries=2 fixes. An attempt killed during the sleep leaves no marker.
    time.sleep(1.0)
    raised = len(os.listdir(marker_dir))
    if raised < 2:
        open(os.path.join(marker_dir, f"raised-{raised}"), "w").close()
        raise ValueError(f"flaky attempt {raised}")
    return i


def _executing_on(client, key):
    try:
        running = client.run(
            lambda dask_worker: [str(ts.key) for ts in dask_worker.state.executing],
            on_error="ignore",
        )
    except Exception:  # a worker died under the broadcast
        return []
    return [addr for addr, keys in running.items() if isinstance(keys, list) and key in keys]


def test_infra_kills_do_not_consume_retries(cluster, tmp_path):
    cl, client, _ = cluster
    marker = tmp_path / "markers"
    marker.mkdir()
    killed = []

    failures = oomguard.Failures(client)

    def raised():
        return sum(e.cause == "exception" for e in failures.shard("flaky-1"))

    def killer():
        # Once the scheduler has seen each of the two raises, SIGKILL the worker running
        # the next attempt.
        for k in range(2):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                where = _executing_on(client, "flaky-1") if raised() == k + 1 else []
                if where:
                    try:
                        pid = client.run(os.getpid, workers=where)[where[0]]
                    except Exception:
                        continue
                    os.kill(pid, signal.SIGKILL)
                    killed.append(where[0])
                    break
                time.sleep(0.05)

    with distributed.span("retrying"):
        fut = client.submit(flaky, 1, str(marker), key="flaky-1", retries=2, pure=False)
        t = threading.Thread(target=killer)
        t.start()
        assert fut.result(timeout=120) == 1
        t.join()
    assert len(killed) == 2

    def so_far() -> str:
        events = failures.events()
        stats = client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins["oomguard"].stats
        )
        return f"fewer than 4 failures of flaky-1; {(events, stats)}"

    wait_for(lambda: len(failures.shard("flaky-1")) >= 4, so_far, timeout=20.0, interval=0.1)
    causes = [e.cause for e in failures.shard("flaky-1")]
    # raise, kill, raise, kill, success: both retries went to the user errors.
    assert causes == ["exception", "sigkill", "exception", "sigkill"]
    assert failures.pipeline("retrying").status == "succeeded_after_infra_failures"


def test_random_sigkills_without_a_crasher_complete(cluster):
    cl, client, _ = cluster
    rng = random.Random(1)
    n_kills = 20
    kills = []

    errors = []

    def killer():
        try:
            kill_loop()
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    def kill_loop():
        deadline = time.monotonic() + 200
        while len(kills) < n_kills and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 0.8))
            pids = _worker_pids(client)
            if len(pids) < 2:
                continue
            victim = rng.choice(sorted(pids))
            if not client.processing().get(victim):
                continue
            os.kill(pids[victim], signal.SIGKILL)
            kills.append(victim)
            # Preemption: wait for the replacement worker before the next kill.
            wait_for(
                lambda: (
                    victim not in client.scheduler_info()["workers"]  # noqa: B023 (this round)
                    and len(client.scheduler_info()["workers"]) == 2
                ),
                f"no replacement for {victim}",
                timeout=60,
                interval=0.1,
            )

    with distributed.span("survivor"):
        # A pipeline that keeps feeding shards until the killer is done, and writes each
        # shard's output away (collect and release), so a death loses only what was
        # executing.
        n = 0

        def more(count):
            nonlocal n
            futs = client.map(
                work,
                range(n, n + count),
                [0.3] * count,
                key=[("s", i) for i in range(n, n + count)],
            )
            n += count
            return futs

        pending = distributed.as_completed(more(100))
        t = threading.Thread(target=killer)
        t.start()
        results = []
        for fut in pending:
            results.append(fut.result())
            fut.release()
            if t.is_alive() and pending.count() < 20:
                pending.update(more(50))
        t.join()
    assert errors == []
    assert len(kills) == n_kills
    assert sorted(results) == list(range(n))
    failures = oomguard.Failures(client)
    wait_for(
        lambda: len(failures.events(cause="sigkill")) >= n_kills,
        f"fewer than {n_kills} sigkill deaths",
        timeout=30,
        interval=0.1,
    )
    time.sleep(3.5)  # past the grace timeout: nothing more may arrive
    deaths = failures.events(cause="sigkill")
    # Exactly one event per kill (one thread per worker: one executing task at most).
    assert len(deaths) == n_kills
    assert {e.worker for e in deaths} == set(kills)
    assert failures.events(cause="worker_lost") == []
    status = failures.pipeline("survivor")
    assert status.status == "succeeded_after_infra_failures", status
    assert f"{n} shards finished" in status.summary


def test_restarted_scheduler_keeps_history(cluster, tmp_path):
    cl, client, store_path = cluster
    addr = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[addr])[addr]
    fut = client.submit(work, 1, 30, key="history-0", workers=[addr], pure=False)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    failures = oomguard.Failures(client)
    wait_for(
        lambda: failures.shard("history-0"), "no failure of history-0", timeout=20.0, interval=0.1
    )
    fut.cancel()
    before = [e.to_dict() for e in failures.events()]
    assert before
    # A new scheduler on the same store path, as the same cluster: its name (here the first
    # scheduler's host:port, which a new port would not repeat) says so (issue 29).
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cl2,
        Client(cl2) as client2,
    ):
        oomguard.install(client2, store=str(store_path), cluster_name=failures.cluster)
        after = [e.to_dict() for e in oomguard.Failures(client2).events()]
    assert after == before
