"""Issue 28, items 5 and 6: the signature gauges are counted in SQL (no row objects), and an
`oomguard_query` reply is capped in rows and bytes whatever the client asks, while
`oomguard.Failures` reads a long list page by page and still gets all of it."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from distributed import Client, LocalCluster

import oomguard
from _cli_run import report
from oomguard import FailureEvent
from oomguard._store import FailureStore
from oomguard.scheduler_plugin._query_bounds import QUERY_MAX_BYTES, QUERY_MAX_ROWS, bounded

T0 = 1_790_000_000.0
BIG = 200 * 1024  # characters of evidence of each big event
N_BIG, N_SMALL, N_SHARD, N_SIGS = 30, 1200, 1100, 150


def _event(
    i: int, *, shard: str = "", sig: str = "", host: str = "h", evidence=None, t=None, cluster=""
):
    return FailureEvent(
        "infra",
        "oom_kill",
        shard or f"('load', {i})",
        "etl",
        f"tcp://{host}:4000",
        host,
        sig or f"sig-{i % N_SIGS}",
        f"title {i % N_SIGS}",
        evidence or {"n": i},
        time=T0 + i // 3 if t is None else t,  # three events share each time: ties
        cluster=cluster,
    )


def _old_totals(store: FailureStore) -> tuple[int, int]:
    """FailureStore.totals as main computed it: every signature read as a row."""
    rows = store.signatures(limit=None)
    hosts = [
        store.distinct_counts(r.id)["hosts"] if len(r.hosts) >= store.member_cap else len(r.hosts)
        for r in rows
    ]
    return len(rows), max(hosts, default=0)


def test_gauge_totals_equal_the_per_row_count_and_read_no_rows(tmp_path):
    store = FailureStore(str(tmp_path / "s.sqlite3"), member_rows=5)
    store.member_cap = 5  # a signature past the cap takes its count from signature_distinct
    store.start()
    try:
        assert store.totals() == (0, 0)
        example = "Traceback line\n" * 4096  # 60 KiB, as a real example may be
        for i in range(400):
            hosts = 9 if i % 200 == 7 else 1 + i % 3  # signature 7 is seen on 9 hosts
            store.add(_event(i, sig=f"sig-{i % 200}", host=f"h{i % hosts}"), example=example)
        for h in range(9):
            store.add(_event(1000 + h, sig="sig-7", host=f"h{h}"))
        assert store.flush(), store.last_error
        expected = _old_totals(store)
        assert expected == (200, 9)
        assert store.totals() == expected
        tracemalloc.start()
        try:
            store.totals()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # main read 200 examples of 60 KiB each (12 MiB); counting needs next to nothing.
        assert peak < 256 * 1024, f"totals() allocated {peak} bytes"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"limit": -1}, "limit"),
        ({"limit": "all"}, "limit"),
        ({"before": [1.0]}, "before"),
        ({"before": ["x", 1]}, "before"),
        ({"before": [float("nan"), 1]}, "before"),
        ({"max_bytes": -5}, "max_bytes"),
    ],
)
def test_a_bad_limit_or_cursor_is_refused_naming_it(filters, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        bounded("events", filters)


@pytest.mark.parametrize(
    "before", [[1.0, 7], [1.0, "x" * 257], [True, "d1"], [float("inf"), "d1"], "d1"]
)
def test_a_deaths_page_is_bounded_and_its_cursor_names_a_death(before):
    assert bounded("deaths", {"limit": None}) == {
        "limit": QUERY_MAX_ROWS,
        "max_bytes": QUERY_MAX_BYTES,
    }
    assert bounded("deaths", {"before": [5, "a1b2"]})["before"] == (5.0, "a1b2")
    with pytest.raises(ValueError, match=r"^before=.*: expected \[time, id\] of a death"):
        bounded("deaths", {"before": before})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    store = tmp_path_factory.mktemp("bounds") / "failures.sqlite3"
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(store))
        plugin = cluster.scheduler.plugins["oomguard"]
        own = plugin.cluster  # stamped, as the plugin does on what it stores
        for i in range(N_SMALL):
            assert plugin.store.add(_event(i, cluster=own))
        for i in range(N_BIG):
            assert plugin.store.add(_event(N_SMALL + i, evidence={"blob": "x" * BIG}, cluster=own))
        for i in range(N_SHARD):
            assert plugin.store.add(
                _event(i, shard="('hot', 1)", t=T0 - 10_000 + i // 2, cluster=own)
            )
        assert plugin.store.flush(), plugin.store.last_error
        yield client, plugin.store


def _rpc(client: Client, **filters):
    return client.sync(client.scheduler.oomguard_query, **filters)


def test_a_query_for_everything_gets_one_capped_reply(cluster):
    client, _ = cluster
    rows = _rpc(client, what="events", limit=None)
    assert 0 < len(rows) <= QUERY_MAX_ROWS
    text = sum(len(str(r["evidence"])) for r in rows)
    assert text <= QUERY_MAX_BYTES + BIG + 1024, text  # the budget, and at most one row past it
    # The newest events are the big ones: the bytes, not the rows, ended this page.
    assert len(rows) < N_BIG
    assert len(_rpc(client, what="shard", key="('hot', 1)")) == QUERY_MAX_ROWS
    assert len(_rpc(client, what="signatures", limit=None)) <= QUERY_MAX_ROWS


def test_failures_reads_page_by_page_and_gets_every_event_once_in_order(cluster):
    client, store = cluster
    failures = oomguard.Failures(client)
    expected = [(e.time, e.id) for e in store.events(limit=None)]
    got = failures.events(limit=None)
    assert [(e.time, e.id) for e in got] == expected
    assert len(expected) == N_SMALL + N_BIG + N_SHARD
    assert len(failures.events(limit=1500)) == 1500
    assert [(e.time, e.id) for e in failures.events(limit=1500)] == expected[:1500]
    hot = failures.shard(("hot", 1))
    assert [(e.time, e.id) for e in hot] == [(e.time, e.id) for e in store.shard("('hot', 1)")]
    assert len(hot) == N_SHARD
    sigs = failures.signatures(limit=None)
    assert sorted(s.id for s in sigs) == sorted(s.id for s in store.signatures(limit=None))


def test_a_page_is_bounded_in_memory_on_the_scheduler(cluster):
    _, store = cluster
    tracemalloc.start()
    try:
        rows = store.events(**bounded("events", {"limit": None}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows and peak < 8 * QUERY_MAX_BYTES, peak


def test_the_report_reads_page_by_page_too(capsys, cluster):
    client, store = cluster
    rc, out, err = report(
        capsys, "--scheduler", client.scheduler.address, "--events", "--json", "--limit", 1500
    )
    assert rc == 0, err
    got = [(e["time"], e["id"]) for e in json.loads(out)["events"]]
    assert got == [(e.time, e.id) for e in store.events(limit=1500)]


def test_the_pipelines_query_is_capped_and_writes_nothing(cluster):
    """Issue 39: `pipelines` took any limit with no byte cap, and re-persisted (and with a
    PostgreSQL history re-shipped) every run in memory at each call."""
    client, store = cluster
    own = _rpc(client, what="cluster")
    for i in range(1500):
        store.upsert_pipeline(
            oomguard.PipelineStatus(
                f"run-{i}", "failed", 1, 1, 0, 0, 1, "s" * 16_000, started=T0 + i, cluster=own
            )
        )
    assert store.flush()
    queued = store.writer._enqueued
    rows = _rpc(client, what="pipelines", limit=None)
    assert 0 < len(rows) <= QUERY_MAX_ROWS
    assert sum(len(r["summary"]) for r in rows) <= QUERY_MAX_BYTES + 16_100
    assert len(rows) < 1000  # the bytes ended this reply, not the rows
    assert len(_rpc(client, what="pipelines", limit=5)) == 5
    assert store.writer._enqueued == queued  # nothing written by the queries
    with pytest.raises(Exception, match="limit"):
        _rpc(client, what="pipelines", limit="all")
