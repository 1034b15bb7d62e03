"""A network partition between one host and the rest, in the multi-host lab.

The lab unplugs a host's cable at the bridge (`Lab.link_down`): every packet to or from it
is dropped, with no reset and no ICMP, as in a real partition. Dask's timeouts are
shortened so that a run takes a minute, each by one setting:

- `distributed.comm.timeouts.tcp` (30 s by default; here 12 s, the least Dask accepts):
  Dask arms TCP keep-alive and TCP_USER_TIMEOUT with it on every connection, so the kernel
  breaks the worker's connections on both sides after that long without an answer;
- `distributed.scheduler.worker-ttl` (5 minutes by default; here 10 s, with tcp at 60 s so
  the TTL comes first): the scheduler asks the worker's nanny to restart it, cannot reach
  it (`distributed.comm.timeouts.connect`, here 5 s) and removes the worker.

What Dask (2026.8) does, either way: it removes the partitioned worker, and it never comes
back: the worker closes itself (its scheduler connection broke, or, when the link returns,
the scheduler answers its heartbeat with "missing"), asks its nanny to close, and `dask
worker` exits with status 0. Only a supervisor (systemd, Kubernetes) starts it again.
What oomguard must record: one `worker_lost` per partitioned worker, blamed on the task its
last heartbeat said was executing, nothing more when the link returns (the nanny's late
clean-exit notice is not a second death), no abort; a partition shorter than the timeouts:
nothing at all.
"""

from __future__ import annotations

import time

import distributed
import lab_tasks
import pytest
from lab import wait_for
from lab_fixtures import lab_fixture  # noqa: F401  (the `lab` fixture)

import oomguard

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GRACE = 5.0  # oomguard.scheduler.report-grace-timeout
DETECTORS = {
    "tcp-timeout": {"distributed.comm.timeouts.tcp": "12s"},
    "worker-ttl": {
        "distributed.scheduler.worker-ttl": "10s",
        "distributed.comm.timeouts.tcp": "60s",
        "distributed.comm.timeouts.connect": "5s",
    },
}


def _start(lab, cluster):
    """A task executing on h2 (allowed elsewhere once h2 is gone) and a stream of tasks on
    h1, both in the pipeline "etl"; returns (the h2 task, the h1 tasks, the flag file that
    ends the h2 task)."""
    client = cluster.client
    done = str(lab.root / "done")
    with distributed.span("etl"):
        held = client.submit(
            lab_tasks.hold_until,
            "on-h2",
            done,
            workers=[cluster.ip("h2")],
            allow_other_workers=True,
            pure=False,
        )
        stream = client.map(
            lab_tasks.sleepy, [f"s{i}" for i in range(20)], [1.0] * 20, workers=[cluster.ip("h1")]
        )
    cluster.executing_on([cluster.worker("h2")])
    return held, stream, done


@pytest.mark.parametrize("detector", sorted(DETECTORS))
def test_a_partition_longer_than_the_timeouts(lab, detector):
    config = DETECTORS[detector]
    scheduler_config = {"oomguard.scheduler.report-grace-timeout": f"{GRACE}s"}
    with lab.cluster(
        "s", ["h1", "h2"], config=config, scheduler_config=scheduler_config
    ) as cluster:
        client = cluster.client
        failures = oomguard.Failures(client)
        w2 = cluster.worker("h2")
        held, stream, done = _start(lab, cluster)

        down = time.time()  # wall clock: the scheduler stamps the removal with its own
        lab.link_down("h2")
        [lost] = wait_for(
            lambda: failures.events(),
            120,
            "Dask to remove h2's worker, and oomguard to decide its death",
        )
        decided = time.time() - down
        removed = lost.time - down  # when the scheduler removed the worker
        assert w2 not in cluster.workers()
        lab.link_up("h2")
        up = time.time()

        # Dask never takes the worker back: it closes itself, and its `dask worker` ends.
        nanny = lab.hosts["h2"].processes[0]
        assert nanny.wait(timeout=120) == 0
        gone = time.time() - down
        time.sleep(2 * GRACE)  # a late notice or report would have been taken by now
        assert not cluster.on("h2")
        lab.notes.append(
            f"{detector}: h2's worker removed {removed:.1f} s into the "
            f"partition, worker_lost decided at {decided:.1f} s, link up at "
            f"{up - down:.1f} s, `dask worker` on h2 exited at {gone:.1f} s"
        )

        # One worker_lost, blamed on the task h2 was executing; no duplicate, no amendment.
        events = failures.events()
        assert events == [lost]
        assert (lost.cause, lost.worker, lost.host, lost.shard, lost.pipeline) == (
            "worker_lost",
            w2,
            "h2",  # the hostname its worker sent (issue 27: one name per machine)
            str(held.key),
            "etl",
        ), lost
        assert lost.evidence["blame"] == "last heartbeat"
        assert "late_report" not in lost.evidence
        assert decided - removed >= GRACE  # it waited for a report that never came

        # The pipeline finishes (the task ran again on h1) and nothing was aborted.
        open(done, "w").close()
        assert held.result(timeout=120) == "on-h2"
        assert client.gather(stream) == [f"s{i}" for i in range(20)]
        p = failures.pipeline("etl")
        assert (p.status, p.infra_failures, p.shards_aborted) == (
            "succeeded_after_infra_failures",
            1,
            0,
        ), p
        m = cluster.metric
        assert m("oomguard_worker_deaths_total", cause="worker_lost") == 1
        assert m("oomguard_pipeline_aborts_total") == 0
        metrics = cluster.metrics()
        assert (
            sum(v for (n, _), v in metrics.items() if n == "oomguard_reports_rejected_total") == 0
        )
        stats = cluster.stats()
        assert (stats["deaths"], stats["held"], stats["pending_deaths"]) == (1, 0, 0), stats


def test_a_partition_shorter_than_the_timeouts_records_nothing(lab):
    with lab.cluster("s", ["h1", "h2"], config=DETECTORS["tcp-timeout"]) as cluster:
        client = cluster.client
        before = cluster.workers()
        held, stream, done = _start(lab, cluster)

        lab.link_down("h2")
        time.sleep(3.0)  # a quarter of the TCP timeout
        lab.link_up("h2")

        open(done, "w").close()
        assert held.result(timeout=120) == "on-h2"
        assert client.gather(stream) == [f"s{i}" for i in range(20)]
        time.sleep(GRACE + 1)
        # The same workers throughout: nothing removed, nothing re-registered.
        assert cluster.workers() == before
        failures = oomguard.Failures(client)
        assert failures.events() == []
        p = failures.pipeline("etl")
        assert (p.status, p.infra_failures, p.shards_done) == ("succeeded", 0, 21), p
        assert cluster.metric("oomguard_worker_deaths_total", cause="worker_lost") == 0
        stats = cluster.stats()
        assert (stats["deaths"], stats["pending_deaths"]) == (0, 0), stats
