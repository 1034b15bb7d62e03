"""The same crash on workers of three hosts is one signature seen on three hosts.

Three hosts of the lab (tests/hosts/lab.py), each its own IP, hostname and crash dir, each
a `dask worker --preload-nanny oomguard.worker_plugin` talking to the scheduler's host over
TCP. The same task kills a worker on each host in turn: by a real kernel OOM kill in the
worker's own memory cgroup, or by a real segfault. What the failure history and /metrics
must say: one signature, count 3, its hosts the three hostnames, first and last seen at the
first and the last death.
"""

from __future__ import annotations

import distributed
import lab_tasks
import pytest
from lab import wait_for
from lab_fixtures import lab_fixture  # noqa: F401  (the `lab` fixture)

import oomguard
from capabilities import require
from oomguard._host import cgroup as _cgroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HOSTS = ["h1", "h2", "h3"]
LIMIT = 400 * 2**20  # each worker's memory limit, and its cgroup's


def _deaths_on_each_host(cluster, cause, submit):
    """Kill a worker on each of HOSTS in turn with `submit(host)`; each death must be
    recorded before the next starts. Returns {host: (future, its event)}."""
    failures = oomguard.Failures(cluster.client)
    out = {}
    for n, host in enumerate(HOSTS, 1):
        fut = submit(host)
        events = wait_for(
            lambda n=n: len(got := failures.events(cause=cause)) >= n and got,
            180,
            f"death {n} ({cause} on {host}) in the history",
        )
        assert len(events) == n, events
        out[host] = (fut, events[0])  # newest first
    return out


def _assert_one_signature(cluster, cause, deaths):
    failures = oomguard.Failures(cluster.client)
    events = [e for _, e in deaths.values()]
    # Each death names its own host (the nanny's hostname), worker and executing shard...
    for host, (fut, e) in deaths.items():
        assert (e.cause, e.kind, e.host, e.shard) == (cause, "infra", host, str(fut.key)), e
        assert cluster.lab.hosts[host].ip in e.worker
    # ...and all three are one crash.
    assert len({e.signature_id for e in events}) == 1, [e.signature_title for e in events]
    [sig] = failures.signatures(cause=cause)
    assert sig.id == events[0].signature_id
    assert sig.count == 3
    assert sorted(sig.hosts) == HOSTS
    assert sorted(sig.workers) == sorted(e.worker for e in events)
    assert sorted(sig.shards) == sorted(e.shard for e in events)
    assert sig.causes == [cause]
    assert sig.first_seen == pytest.approx(deaths["h1"][1].time, abs=1e-3)
    assert sig.last_seen == pytest.approx(deaths["h3"][1].time, abs=1e-3)
    assert sig.first_seen < sig.last_seen
    return sig


def _assert_metrics(cluster, cause, signatures):
    m = cluster.metric
    assert m("oomguard_failures_total", kind="infra", cause=cause) == 3
    assert m("oomguard_worker_deaths_total", cause=cause) == 3
    # The gauges are recounted every 2 s, after the store's writes.
    wait_for(
        lambda: (m("oomguard_signatures"), m("oomguard_signature_max_hosts")) == (signatures, 3),
        30,
        f"the gauges to read {signatures} signature(s), 3 hosts",
    )
    # Every report came from the nanny's own host: none refused, nothing went wrong.
    metrics = cluster.metrics()
    assert sum(v for (n, _), v in metrics.items() if n == "oomguard_reports_rejected_total") == 0
    assert sum(v for (n, _), v in metrics.items() if n == "oomguard_internal_errors_total") == 0
    assert m("oomguard_report_latency_seconds_count") == 3


def test_the_same_oom_kill_on_three_hosts_is_one_signature(lab):
    ok, why = _cgroup.can_create_child()
    require(ok, f"per-worker memory cgroups cannot be made here: {why}")
    config = {
        "oomguard.worker.cgroup-limit": "true",
        "oomguard.worker.sample-interval": "100ms",
        # The kernel, not the nanny, must stop the task.
        "distributed.worker.memory.terminate": False,
    }
    with lab.cluster("s", HOSTS, worker_config=config, memory_limit=str(LIMIT)) as cluster:
        client = cluster.client

        def submit(host):
            return client.submit(
                lab_tasks.oom_task,
                host,
                LIMIT,
                workers=[cluster.ip(host)],
                allow_other_workers=False,
                pure=False,
            )

        deaths = _deaths_on_each_host(cluster, "oom_kill", submit)
        sig = _assert_one_signature(cluster, "oom_kill", deaths)
        assert sig.title.startswith("oom_kill in "), sig.title
        assert sig.title.endswith("lab_tasks.oom_task"), sig.title
        for fut, e in deaths.values():
            # Counted by the kernel in the worker's own group, not guessed from the -9.
            assert e.evidence["oom_kill_delta"] == 1, e.evidence
            assert e.evidence["summary"].startswith("kernel oom_kill counted"), e.evidence
            # No worker is larger: a shard OOM-killed is not retried on one of the same size.
            with pytest.raises(oomguard.PipelineAborted):
                fut.result(timeout=60)
        _assert_metrics(cluster, "oom_kill", signatures=1)
        assert cluster.metric("oomguard_cgroup_workers") == 3
        assert cluster.metric("oomguard_pipeline_aborts_total") == 3


def test_the_same_segfault_on_three_hosts_is_one_signature(lab):
    with lab.cluster("s", HOSTS) as cluster:
        client = cluster.client

        def submit(host):
            # Crashes once, then its retry succeeds (on the same host's restarted worker).
            marker = str(lab.root / f"crashed-{host}")
            with distributed.span("segv"):
                return client.submit(
                    lab_tasks.segfault_once, host, marker, workers=[cluster.ip(host)], pure=False
                )

        deaths = _deaths_on_each_host(cluster, "native_crash", submit)
        sig = _assert_one_signature(cluster, "native_crash", deaths)
        # From the faulthandler dump each nanny read in its own host's crash dir.
        assert sig.title.startswith("SIGSEGV in "), sig.title
        assert "segfault_once" in sig.title
        assert "Segmentation fault" in sig.example
        for host, (fut, _) in deaths.items():
            assert fut.result(timeout=120) == host
        _assert_metrics(cluster, "native_crash", signatures=1)
        assert cluster.metric("oomguard_pipeline_aborts_total") == 0
        runs = [p for p in oomguard.Failures(client).pipelines() if p.name == "segv"]
        assert {p.status for p in runs} == {"succeeded_after_infra_failures"}, runs
