"""Hosts lost with their nannies, and a host stopped in order, in the multi-host lab.

A lost host (tests/hosts/lab.py `kill_host`: every process on it stopped, then SIGKILLed,
as at a power cut) sends no death report: its workers' deaths are decided `worker_lost`
once the grace timeout has passed, blamed on what their last heartbeat said was executing.
"""

from __future__ import annotations

import signal
import time

import distributed
import lab_tasks
import pytest
from lab import wait_for
from lab_fixtures import lab_fixture  # noqa: F401  (the `lab` fixture)

import oomguard

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GRACE = 5.0  # oomguard.scheduler.report-grace-timeout


def _by_pipeline(failures, name):
    runs = [p for p in failures.pipelines() if p.name == name]
    assert len(runs) == 1, runs
    return runs[0]


def test_a_host_lost_with_its_nanny(lab):
    scheduler_config = {"oomguard.scheduler.report-grace-timeout": f"{GRACE}s"}
    with lab.cluster(
        "s", ["h1", "h2", "h3"], nworkers={"h3": 2}, scheduler_config=scheduler_config
    ) as cluster:
        client = cluster.client
        lost = cluster.on("h3")
        assert len(lost) == 2
        # Two tasks on each worker of h3: one executing, one queued behind it (one thread).
        # They may run on h3 only: a lost host's tasks wait for it to come back.
        done = str(lab.root / "done")  # the tasks below run until this file exists
        with distributed.span("victim"):
            victims = [
                client.submit(
                    lab_tasks.hold_until, f"v{i}", done, workers=[cluster.ip("h3")], pure=False
                )
                for i in range(4)
            ]
        executing = cluster.executing_on(lost)
        processing = client.processing(workers=lost)
        assert all(len(processing[a]) == 2 for a in lost), processing
        queued = {str(k) for a in lost for k in processing[a]} - {
            k for keys in executing.values() for k in keys
        }
        assert len(queued) == 2
        # A healthy pipeline on the other hosts, running while h3 goes.
        with distributed.span("healthy"):
            healthy = client.map(
                lab_tasks.sleepy,
                [f"ok{i}" for i in range(12)],
                [1.0] * 12,
                workers=[cluster.ip("h1"), cluster.ip("h2")],
            )
        time.sleep(1.0)

        killed_at = time.time()
        pids = lab.kill_host("h3")
        failures = oomguard.Failures(client)
        events = wait_for(
            lambda: len(got := failures.events()) >= 2 and got, 120, "two worker_lost events"
        )
        decided_after = time.time() - killed_at
        assert not cluster.on("h3")
        lab.notes.append(
            f"h3 lost ({len(pids)} processes, 2 workers): removed "
            f"{max(e.time for e in events) - killed_at:.2f} s after the kill, "
            f"worker_lost seen {decided_after:.1f} s after it (grace {GRACE:g} s)"
        )

        # One worker_lost per worker of h3, decided only once the grace timeout was over,
        # each blamed on the one task its last heartbeat said was executing.
        assert decided_after >= GRACE, decided_after
        assert len(events) == 2, events
        assert {e.worker: [e.shard] for e in events} == executing
        for e in events:
            assert (e.cause, e.kind, e.pipeline) == ("worker_lost", "infra", "victim"), e
            # No report: the hostname its worker plugin sent (one name per machine, as in
            # the deaths its nanny reports), the address beside it.
            assert e.host == "h3" and cluster.ip("h3") in e.worker
            assert e.evidence["blame"] == "last heartbeat"
            assert e.evidence["source"] == "no death report within the grace timeout"
            assert e.shard not in queued

        # The healthy pipeline finished untouched. h3 comes back (as a supervisor would
        # restart it) and the victims run again there.
        assert client.gather(healthy) == [f"ok{i}" for i in range(12)]
        open(done, "w").close()
        cluster.start_nanny("h3")
        assert client.gather(victims) == [f"v{i}" for i in range(4)]
        h = _by_pipeline(failures, "healthy")
        assert (h.status, h.infra_failures, h.shards_done) == ("succeeded", 0, 12), h
        v = _by_pipeline(failures, "victim")
        assert (v.status, v.infra_failures) == ("succeeded_after_infra_failures", 2), v
        assert len(failures.events()) == 2  # nothing more came, late or not

        m = cluster.metric
        assert m("oomguard_worker_deaths_total", cause="worker_lost") == 2
        assert m("oomguard_failures_total", kind="infra", cause="worker_lost") == 2
        assert m("oomguard_pipeline_aborts_total") == 0
        stats = cluster.stats()
        assert (stats["deaths"], stats["aborts"], stats["held"], stats["pending_deaths"]) == (
            2,
            0,
            0,
            0,
        ), stats


def test_two_hosts_lost_while_a_crasher_runs_elsewhere(lab):
    with lab.cluster("s", ["h1", "h2", "h3", "h4"]) as cluster:
        client = cluster.client
        with distributed.span("bystanders"):
            bystanders = {
                h: client.submit(
                    lab_tasks.hold_until,
                    f"b-{h}",
                    str(lab.root / "done"),
                    workers=[cluster.ip(h)],
                    pure=False,
                )
                for h in ("h3", "h4")
            }
        cluster.executing_on([cluster.worker("h3"), cluster.worker("h4")])
        # A shard that segfaults every time, wherever it runs; only h1 may run it.
        with distributed.span("crash"):
            crasher = client.submit(
                lab_tasks.crasher,
                "c",
                workers=[cluster.ip("h1")],
                allow_other_workers=False,
                pure=False,
            )
        wait_for(
            lambda: client.processing(workers=[cluster.worker("h1")]).get(cluster.worker("h1")),
            60,
            "the crasher on h1",
        )
        # Both hosts go at once while the crasher starts (it dies half a second in).
        killed_at = time.time()
        pids = lab.kill_host("h3", "h4")
        assert pids

        with pytest.raises(oomguard.PipelineAborted) as aborted:
            crasher.result(timeout=180)
        lab.notes.append(
            f"h3 and h4 lost together; the crasher aborted {time.time() - killed_at:.1f} s later"
        )

        failures = oomguard.Failures(client)
        wait_for(lambda: len(failures.events(cause="worker_lost")) == 2, 60, "the lost hosts")
        time.sleep(GRACE)  # a straggler would be decided by now
        events = failures.events()
        crashes = [e for e in events if e.cause == "native_crash"]
        lost = [e for e in events if e.cause == "worker_lost"]
        assert len(events) == len(crashes) + len(lost), events

        # The crasher was stopped by its own evidence: the same crash twice, on h1's worker
        # and on its restart; the lost hosts are not on its record.
        assert len(crashes) == 2 and {e.shard for e in crashes} == {str(crasher.key)}
        assert {e.host for e in crashes} == {"h1"} and len({e.worker for e in crashes}) == 2
        assert len({e.signature_id for e in crashes}) == 1
        e = aborted.value
        assert (e.pipeline, e.shard, e.cause, e.count) == (
            "crash",
            str(crasher.key),
            "native_crash",
            2,
        ), e.message
        assert e.signature == crashes[0].signature_id
        c = _by_pipeline(failures, "crash")
        assert (c.status, c.infra_failures) == ("aborted", 2), c

        # The lost hosts are blamed on what ran there, and nothing was aborted for them:
        # their pipeline waits for its hosts to come back.
        assert sorted((e.shard, e.host) for e in lost) == sorted(
            (str(f.key), h) for h, f in bystanders.items()
        )
        assert all(cluster.ip(e.host) in e.worker for e in lost)
        assert all(e.pipeline == "bystanders" for e in lost)
        b = _by_pipeline(failures, "bystanders")
        assert (b.status, b.infra_failures, b.shards_aborted) == ("running", 2, 0), b
        assert [f.status for f in bystanders.values()] == ["pending", "pending"]

        m = cluster.metric
        assert m("oomguard_worker_deaths_total", cause="native_crash") == 2
        assert m("oomguard_worker_deaths_total", cause="worker_lost") == 2
        assert m("oomguard_pipeline_aborts_total") == 1


def test_a_host_stopped_in_order_is_not_a_death(lab):
    """`dask worker` stopped with SIGTERM (systemd, a pod deleted, a scale-down) while it
    runs a task: its nanny says the exit was requested, Dask removes the worker. The task
    runs elsewhere and nothing is recorded. (oomguard held such tasks for good, before.)"""
    with lab.cluster("s", ["h1", "h2"]) as cluster:
        client = cluster.client
        done = str(lab.root / "done")
        with distributed.span("etl"):
            fut = client.submit(
                lab_tasks.hold_until,
                "g",
                done,
                workers=[cluster.ip("h2")],
                allow_other_workers=True,
                pure=False,
            )
        cluster.executing_on([cluster.worker("h2")])
        lab.stop_host("h2", signal.SIGTERM)
        wait_for(lambda: not cluster.on("h2"), 60, "h2's worker to leave")
        open(done, "w").close()  # from here on, a run of the task is quick
        assert fut.result(timeout=120) == "g"  # again, on h1
        nanny = lab.hosts["h2"].processes[0]
        assert nanny.wait(timeout=60) == 0  # `dask worker` exits cleanly on SIGTERM

        failures = oomguard.Failures(client)
        time.sleep(GRACE + 1)  # a removal waiting for a report would be decided by now
        assert failures.events() == []
        stats = cluster.stats()
        assert (stats["deaths"], stats["held"], stats["pending_deaths"]) == (0, 0, 0), stats
        p = _by_pipeline(failures, "etl")
        assert (p.status, p.infra_failures, p.shards_done) == ("succeeded", 0, 1), p
        assert cluster.metric("oomguard_displaced_tasks_total") == 1
