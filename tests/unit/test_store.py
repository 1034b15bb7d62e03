"""The failure store against real SQLite files in tmp_path: round trips, deduplication,
persistence, retention, back-pressure, schema migrations, refusal of files it must not
touch, and a real SIGKILL in the middle of a write stream."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from oomguard import Cause, FailureEvent, PipelineStatus
from oomguard._exceptions import StoreError
from oomguard._store import APPLICATION_ID, MEMBER_FIELDS, MIGRATIONS, FailureStore
from pg_lab import BACKENDS, store_on

T0 = 1_790_000_000.0


def ev(n: int = 0, **kw) -> FailureEvent:
    fields = dict(
        kind="infra",
        cause="oom_kill",
        shard=f"('load', {n})",
        pipeline="nightly",
        worker=f"tcp://10.0.0.{n % 250}:4000",
        host=f"10.0.0.{n % 250}",
        signature_id="sig-a",
        signature_title="MemoryError in parse_block",
        evidence={"oom_kill_delta": 1, "n": n},
        attempt=1,
        time=T0 + n,
    )
    fields.update(kw)
    return FailureEvent(**fields)


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    """The store's API on both backends: the SQLite file, and PostgreSQL (written through a
    spool and its shipper, read from the history: tests/pg_lab.py)."""
    s = store_on(request, tmp_path)
    s.start()
    yield s
    s.close()


def rows(store: FailureStore, sql: str, args: tuple = ()) -> list[tuple]:
    """`sql` on the store's file (the spool's, for PostgreSQL), on a connection of the
    test's own."""
    conn = sqlite3.connect(store.file)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def fill(store: FailureStore, events, **kw) -> None:
    for e in events:
        assert store.add(e, **kw), store.last_error
    assert store.flush(), store.last_error


# -- round trip and filters -----------------------------------------------------------------


def test_round_trip_assigns_ids_and_returns_newest_first(store):
    events = [ev(n) for n in range(5)]
    fill(store, events)
    got = store.events()
    assert [e.id for e in got] == [5, 4, 3, 2, 1]
    assert [dataclasses.replace(e, id=None) for e in got] == events[::-1]
    assert store.written == 5 and store.write_errors == 0 and store.overflow == 0


def test_event_order_is_by_event_time_not_arrival(store):
    fill(store, [ev(1, time=T0 + 10), ev(2, time=T0 + 5), ev(3, time=T0 + 20)])
    assert [e.time for e in store.events()] == [T0 + 20, T0 + 10, T0 + 5]


@pytest.mark.parametrize(
    "query, expected",
    [
        (dict(kind="user"), [3]),
        (dict(cause="native_crash"), [2]),
        (dict(pipeline="backfill"), [4]),
        (dict(shard="('load', 1)"), [1]),
        (dict(signature="sig-b"), [4, 2]),
        (dict(since=T0 + 3), [5, 4, 3]),
        (dict(limit=2), [5, 4]),
        (dict(limit=None), [5, 4, 3, 2, 1, 0]),
        (dict(signature="sig-b", since=T0 + 3), [4]),
        (dict(shard="nope"), []),
    ],
)
def test_event_filters(store, query, expected):
    fill(
        store,
        [
            ev(0),
            ev(1),
            ev(2, cause="native_crash", signature_id="sig-b"),
            ev(3, kind="user", cause="exception"),
            ev(4, pipeline="backfill", signature_id="sig-b"),
            ev(5),
        ],
    )
    assert [e.evidence["n"] for e in store.events(**query)] == expected


def test_a_death_of_several_suspects_is_found_by_each_and_is_no_shards_own(store):
    """Issue 27: a death without a report that named no shard is stored once, under shard
    '' (pipeline '' when its suspects ran in several); a filter on a suspect or on one of
    their pipelines finds it, a shard's own history does not list it."""
    lost = dict(kind="infra", cause="worker_lost", shard="")
    fill(
        store,
        [
            ev(0, **lost, evidence={"n": 0, "suspects": ["nap-1", "nap-2"]}),
            ev(
                1,
                **lost,
                pipeline="",
                evidence={
                    "n": 1,
                    "suspects": ["nap-3", "load-1"],
                    "suspect_pipelines": ["naps", "etl"],
                },
            ),
            ev(2, shard="nap-2", pipeline="naps"),
            ev(3, shard="", evidence={"n": 3, "suspects": ["nap-9"]}, pipeline="naps"),
        ],
    )
    n = lambda **q: [e.evidence["n"] for e in store.events(**q)]  # noqa: E731
    assert n(shard="nap-2") == [2, 0] and n(shard="load-1") == [1] and n(shard="x") == []
    assert n(pipeline="etl") == [1] and n(pipeline="naps") == [3, 2, 1]
    assert n(shard="nap-1", pipeline="nightly") == [0]
    assert store.shard("nap-1") == [] and [e.evidence["n"] for e in store.shard("nap-2")] == [2]
    plan = " ".join(
        str(r)
        for r in rows(
            store,
            "EXPLAIN QUERY PLAN SELECT id FROM events WHERE (shard = 'a' OR (shard = '' AND "
            "EXISTS (SELECT 1 FROM json_each(evidence, '$.suspects') WHERE value = 'a')))",
        )
    )
    assert "events_shard" in plan and "SCAN events" not in plan.replace("SCAN events_", ""), plan


def test_shard_history_is_oldest_first(store):
    fill(store, [ev(1, attempt=a, time=T0 + 10 * a, shard="s") for a in (3, 1, 2)] + [ev(9)])
    assert [e.attempt for e in store.shard("s")] == [1, 2, 3]
    assert store.shard("missing") == []


def test_enum_values_and_int_times_are_stored_as_plain_values(store):
    fill(store, [ev(1, cause=Cause.NATIVE_CRASH, time=int(T0))])
    (got,) = store.events()
    assert type(got.cause) is str and got.cause == "native_crash"
    assert got.time == T0 and isinstance(got.time, float)


def test_evidence_is_a_snapshot_taken_by_add(store):
    evidence = {"rss": 1}
    assert store.add(ev(1, evidence=evidence))
    evidence["rss"] = 2  # the caller keeps using its dict
    assert store.flush()
    assert store.events()[0].evidence == {"rss": 1}


# -- deduplication --------------------------------------------------------------------------


def test_same_signature_from_three_hosts_is_one_row(store):
    events = [ev(0, host=h, worker=f"tcp://{h}:1", time=T0 + i) for i, h in enumerate("abc")]
    fill(store, events[:1], example="trace one")
    fill(store, events[1:], example="trace two")
    (row,) = store.signatures()
    assert (row.id, row.count, row.hosts) == ("sig-a", 3, ["a", "b", "c"])
    assert row.workers == ["tcp://a:1", "tcp://b:1", "tcp://c:1"]
    assert (row.first_seen, row.last_seen) == (T0, T0 + 2)
    assert row.example == "trace one"  # the first non-empty example is kept
    assert row.shards == ["('load', 0)"] and row.pipelines == ["nightly"]
    assert row.causes == ["oom_kill"] and row.grouping_version == 1
    assert store.signature("sig-a") == row
    assert store.signature("missing") is None


def test_member_lists_are_capped_but_the_true_distinct_count_is_kept(store):
    store.member_cap = 3
    fill(store, [ev(n, host="h") for n in range(10)])
    row = store.signature("sig-a")
    assert row.shards == ["('load', 0)", "('load', 1)", "('load', 2)"]
    assert row.hosts == ["h"]
    counts = store.distinct_counts("sig-a")
    assert counts == {
        "hosts": 1,
        "workers": 10,
        "shards": 10,
        "pipelines": 1,
        "causes": 1,
        "clusters": 0,
    }
    # Seen again: still 10 distinct, not 20.
    fill(store, [ev(n, host="h") for n in range(10)])
    assert store.distinct_counts("sig-a")["shards"] == 10
    assert store.signature("sig-a").count == 20


def member_rows(store: FailureStore, signature_id: str) -> dict[str, int]:
    sql = "SELECT field, count(*) FROM signature_members WHERE signature_id = ? GROUP BY field"
    return {MEMBER_FIELDS[f]: n for f, n in rows(store, sql, (signature_id,))}


def test_member_rows_are_bounded_and_one_batch_is_counted_exactly(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), member_rows=100)
    events = [ev(n, shard=f"shard-{n:04d}") for n in range(3000)]
    for e in events:  # queued before start(): one batch, one commit
        assert s.add(e)
    s.start()
    try:
        assert s.flush(), s.last_error
        assert member_rows(s, "sig-a") == {
            "hosts": 100,
            "workers": 100,
            "shards": 100,
            "pipelines": 1,
            "causes": 1,
        }
        row = s.signature("sig-a")
        assert row.count == 3000
        assert row.shards == [f"shard-{n:04d}" for n in range(100)]  # the batch's smallest
        assert len(row.hosts) == 100 and row.pipelines == ["nightly"]
        assert [r.id for r in s.signatures(pipeline="nightly", cause="oom_kill")] == ["sig-a"]
        counts = s.distinct_counts("sig-a")
        assert counts == {
            "hosts": 250,
            "workers": 250,
            "shards": 3000,
            "pipelines": 1,
            "causes": 1,
            "clusters": 0,
        }
    finally:
        s.close()


def test_past_member_rows_the_distinct_count_is_a_lower_bound(tmp_path):
    # A long interval: the writer wakes at flush(), so each fill() is one batch.
    s = FailureStore(str(tmp_path / "s.sqlite3"), member_rows=100, batch_interval=5.0)
    s.start()
    try:
        for start in range(0, 3000, 100):  # 30 batches of 100 new shards each
            fill(s, [ev(n, host="h") for n in range(start, start + 100)])
        assert member_rows(s, "sig-a")["shards"] == 100
        assert s.signature("sig-a").shards == sorted(f"('load', {n})" for n in range(100))
        # The 100 stored plus one batch's 100 unstored: no more is known for certain.
        assert s.distinct_counts("sig-a")["shards"] == 200
        # All 3000 again in one batch: 2900 are certainly distinct from the 100 stored.
        # Seen before, yet never counted twice: the count stays at most the true one.
        for _ in range(2):
            for n in range(3000):
                assert s.add(ev(n, host="h"))
            assert s.flush()
            assert s.distinct_counts("sig-a")["shards"] == 3000
        assert member_rows(s, "sig-a") == {
            "hosts": 1,
            "workers": 100,
            "shards": 100,
            "pipelines": 1,
            "causes": 1,
        }
        assert s.signature("sig-a").count == 9000
    finally:
        s.close()


def test_empty_member_values_are_not_recorded(store):
    fill(store, [ev(1, pipeline="")])
    assert store.signature("sig-a").pipelines == []


def test_signatures_order_and_filters(store):
    fill(
        store,
        [ev(n, signature_id="many", time=T0 + n) for n in range(3)]
        + [ev(10, signature_id="late", cause="native_crash", time=T0 + 100)]
        + [ev(11, signature_id="early", pipeline="backfill", time=T0 - 100)],
    )
    assert [s.id for s in store.signatures()] == ["many", "late", "early"]  # count, last_seen
    assert [s.id for s in store.signatures(cause="native_crash")] == ["late"]
    assert [s.id for s in store.signatures(pipeline="backfill")] == ["early"]
    assert [s.id for s in store.signatures(since=T0 + 50)] == ["late"]
    assert [s.id for s in store.signatures(limit=1)] == ["many"]


# -- pipelines --------------------------------------------------------------------------------


def test_pipelines_upsert_and_most_recent_first(store):
    store.upsert_pipeline(PipelineStatus("a", "running", 1, 0, 0, 0, 0, "one shard done"))
    store.upsert_pipeline(PipelineStatus("b", "running", 0, 0, 0, 0, 0, ""))
    store.upsert_pipeline(PipelineStatus("a", "aborted", 5, 1, 4, 3, 0, "oom", "shard 7"))
    assert store.flush()
    assert store.pipeline("a") == PipelineStatus("a", "aborted", 5, 1, 4, 3, 0, "oom", "shard 7")
    assert [p.name for p in store.pipelines()] == ["a", "b"]
    assert [p.name for p in store.pipelines(limit=1)] == ["a"]
    assert store.pipeline("missing") is None


def run(name: str, started: float, status: str = "running", done: int = 0) -> PipelineStatus:
    return PipelineStatus(name, status, done, 0, 0, 0, 0, f"{done} done", started=started)


def test_each_run_of_a_pipeline_keeps_its_own_status(store):
    store.upsert_pipeline(run("etl", T0 + 100, "running", 1))
    store.upsert_pipeline(run("etl", T0, "running", 1))  # the earlier run, reported late
    store.upsert_pipeline(run("etl", T0, "aborted", 5))  # replaces its own run only
    store.upsert_pipeline(run("other", T0 + 50))
    assert store.flush()
    assert store.pipeline("etl") == run("etl", T0 + 100, "running", 1)  # greatest `started`
    assert store.pipeline_runs("etl") == [
        run("etl", T0 + 100, "running", 1),
        run("etl", T0, "aborted", 5),
    ]
    assert store.pipeline_runs("etl", limit=1) == [store.pipeline("etl")]
    assert store.pipeline_runs("missing") == []
    assert [(p.name, p.started) for p in store.pipelines()] == [
        ("other", T0 + 50),
        ("etl", T0),
        ("etl", T0 + 100),
    ]  # most recently updated first
    store.upsert_pipeline(run("etl", T0 + 100, "succeeded", 9))
    assert store.flush()
    assert store.pipeline("etl").status == "succeeded" and len(store.pipeline_runs("etl")) == 2


@pytest.mark.parametrize("started", ["yesterday", float("nan"), None, True])
def test_a_bad_started_is_refused_and_names_the_field(store, started):
    store.upsert_pipeline(run("etl", T0))
    assert store.flush()
    store.upsert_pipeline(dataclasses.replace(run("etl", T0 + 1), started=started))
    assert store.write_errors == 1 and "started" in store.last_error
    assert store.flush() and store.pipeline_runs("etl") == [run("etl", T0)]


def test_pipeline_retention_deletes_the_oldest_finished_runs_never_a_running_one(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), max_pipelines=3, batch_interval=0.01)
    s.start()
    try:
        s.upsert_pipeline(run("a", T0))  # the oldest, and still running
        assert s.flush()
        s.upsert_pipeline(run("b", T0, "failed"))
        s.upsert_pipeline(run("c", T0, "succeeded"))
        assert s.flush()
        s.upsert_pipeline(run("d", T0, "aborted"))
        assert s.flush()  # one run over: the oldest finished one, "b", goes in this commit
        assert [p.name for p in s.pipelines(limit=None)] == ["d", "c", "a"]
        for name in "efg":  # running runs are kept even past the limit
            s.upsert_pipeline(run(name, T0))
        assert s.flush()
        assert [p.name for p in s.pipelines(limit=None)] == ["g", "f", "e", "a"]
        assert s.write_errors == 0
    finally:
        s.close()


# -- bad data, back-pressure, lifecycle -------------------------------------------------------


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(evidence={"x": {1, 2}}), "evidence"),
        (dict(evidence=["not", "a", "dict"]), "evidence"),
        (dict(time="yesterday"), "time"),
        (dict(time=float("nan")), "time"),
        (dict(shard=("load", 1)), "shard"),
        (dict(attempt="2"), "attempt"),
    ],
)
def test_bad_data_is_counted_never_raised(store, bad, field):
    assert store.add(ev(1, **bad)) is False
    assert store.write_errors == 1 and field in store.last_error
    fill(store, [ev(2)])  # the store goes on working
    assert [e.evidence["n"] for e in store.events()] == [2]


def test_add_refuses_what_is_not_an_event(store):
    assert store.add({"shard": "x"}) is False  # type: ignore[arg-type]
    assert store.add(ev(1), grouping_version="1") is False  # type: ignore[arg-type]
    store.upsert_pipeline(PipelineStatus("p", "running", "1", 0, 0, 0, 0, ""))  # type: ignore
    assert store.write_errors == 3 and "shards_done" in store.last_error
    assert store.flush() and store.events() == [] and store.pipelines() == []


def test_full_queue_is_counted_in_overflow(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), queue_size=3)  # not started: nothing drains
    try:
        assert [s.add(ev(n)) for n in range(5)] == [True, True, True, False, False]
        assert s.overflow == 2 and s.pending == 3
        assert s.flush(timeout=0.1) is False  # no writer yet
        s.start()
        assert s.flush()
        assert [e.evidence["n"] for e in s.events()] == [2, 1, 0]
        assert s.add(ev(9))  # room again
    finally:
        s.close()


def test_a_flood_is_committed_less_often_and_one_event_at_once_after(tmp_path):
    """A flood (a queue of FLOOD_ITEMS or more at a commit) spaces commits FLOOD_INTERVAL
    apart, fewer and larger; the first smaller commit brings batch_interval back."""
    from oomguard._store.writer import FLOOD_INTERVAL, FLOOD_ITEMS

    s = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    for n in range(FLOOD_ITEMS):  # queued before the writer starts: one flood, however slow
        s.add(ev(n))
    s.start()
    try:
        assert s.flush() and s.writer.interval == FLOOD_INTERVAL
        s.add(ev(FLOOD_ITEMS))
        assert s.flush() and s.writer.interval == 0.01
        assert len(s.events(limit=None)) == FLOOD_ITEMS + 1
    finally:
        s.close()


def test_a_failed_transaction_is_counted_and_flush_says_so(store):
    other = sqlite3.connect(store.file, isolation_level=None)
    try:
        other.execute(
            "CREATE TRIGGER fail BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
        )
        assert store.add(ev(1))  # queued fine; the commit fails later
        assert store.flush() is False
        assert store.write_errors == 1 and "disk on fire" in store.last_error
        other.execute("DROP TRIGGER fail")
    finally:
        other.close()
    fill(store, [ev(2)])  # the writer lives on; the next flush is acknowledged
    assert [e.evidence["n"] for e in store.events()] == [2]
    assert store.signature("sig-a").count == 1  # the failed batch left nothing behind


def test_close_is_idempotent_and_safe_without_start(tmp_path):
    never = FailureStore(str(tmp_path / "never.sqlite3"))
    never.close()
    never.close()
    assert not (tmp_path / "never.sqlite3").exists()
    s = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=5.0)
    s.start()
    assert s.add(ev(1))
    s.close()  # flushes what is queued, even with a long batch interval
    s.close()
    assert s.add(ev(2)) is False
    with pytest.raises(RuntimeError, match="closed"):
        s.events()
    reopened = FailureStore(str(tmp_path / "s.sqlite3"))
    reopened.start()
    try:
        assert [e.evidence["n"] for e in reopened.events()] == [1]
    finally:
        reopened.close()


def test_memory_path_is_a_private_temporary_file():
    s = FailureStore(":memory:")
    s.start()
    file = s.file
    fill(s, [ev(1)])
    assert len(s.events()) == 1 and os.path.exists(file)
    s.close()
    assert not os.path.exists(file)


def test_reads_from_other_threads_and_during_a_held_write_lock(store):
    fill(store, [ev(n) for n in range(3)])
    other = sqlite3.connect(store.file, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")  # in WAL mode, readers still read
        other.execute("DELETE FROM events")
        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: len(store.events()), range(4)))
        assert results == [3, 3, 3, 3]
        assert time.monotonic() - t < 2.0  # did not wait out busy_timeout
    finally:
        other.execute("ROLLBACK")
        other.close()


# -- persistence and retention ----------------------------------------------------------------


def test_history_survives_reopening(tmp_path):
    path = str(tmp_path / "s.sqlite3")
    first = FailureStore(path)
    first.start()
    fill(first, [ev(n, host=f"h{n}") for n in range(3)], example="trace")
    first.upsert_pipeline(PipelineStatus("nightly", "failed", 1, 1, 0, 1, 0, "oom"))
    assert first.flush()
    first.close()

    second = FailureStore(path)
    second.start()
    try:
        assert [e.id for e in second.events()] == [3, 2, 1]
        row = second.signature("sig-a")
        assert (row.count, row.hosts, row.example) == (3, ["h0", "h1", "h2"], "trace")
        assert second.pipeline("nightly").status == "failed"
        fill(second, [ev(3, host="h3")])
        assert second.events(limit=1)[0].id == 4  # ids continue
        assert second.signature("sig-a").count == 4
    finally:
        second.close()


def test_retention_drops_oldest_events_and_keeps_signature_counts(tmp_path):
    path = str(tmp_path / "s.sqlite3")
    s = FailureStore(path, max_events=10)
    s.start()
    try:
        for start in range(0, 25, 5):  # several batches
            fill(s, [ev(n) for n in range(start, start + 5)])
        assert [e.evidence["n"] for e in s.events(limit=None)] == list(range(24, 14, -1))
        row = s.signature("sig-a")
        assert row.count == 25 and row.first_seen == T0
        assert s.distinct_counts("sig-a")["shards"] == 25
    finally:
        s.close()
    smaller = FailureStore(path, max_events=4)  # a lower limit applies at the next write
    smaller.start()
    try:
        fill(smaller, [ev(25)])
        assert [e.evidence["n"] for e in smaller.events(limit=None)] == [25, 24, 23, 22]
        assert smaller.signature("sig-a").count == 26
    finally:
        smaller.close()


# -- schema versions and files that must not be touched --------------------------------------


#: The schema version this oomguard writes.
N = len(MIGRATIONS)


class StoreNext(FailureStore):
    migrations = MIGRATIONS + (("ALTER TABLE events ADD COLUMN note TEXT NOT NULL DEFAULT ''",),)


def user_version(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


def test_a_new_file_gets_every_migration(tmp_path):
    s = StoreNext(str(tmp_path / "new.sqlite3"))
    s.start()
    s.close()
    assert user_version(tmp_path / "new.sqlite3") == N + 1


def test_migration_keeps_data_and_older_code_refuses_the_newer_file(tmp_path):
    path = tmp_path / "s.sqlite3"
    now = FailureStore(str(path))
    now.start()
    fill(now, [ev(1)])
    now.close()
    assert user_version(path) == N

    nxt = StoreNext(str(path))
    nxt.start()
    try:
        assert [e.evidence["n"] for e in nxt.events()] == [1]
        fill(nxt, [ev(2)])
        cols = [r[1] for r in rows(nxt, "PRAGMA table_info(events)")]
        assert "note" in cols
    finally:
        nxt.close()
    assert user_version(path) == N + 1

    before = path.read_bytes()
    old = FailureStore(str(path))
    with pytest.raises(StoreError) as err:
        old.start()
    assert str(path) in str(err.value)
    assert f"version {N + 1}" in str(err.value) and f"up to {N}" in str(err.value)
    assert path.read_bytes() == before
    old.close()


def test_a_store_of_schema_1_migrates_and_keeps_everything(tmp_path):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:  # the released schema 1, as oomguard 0.1 wrote it
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO pipelines VALUES ('etl', 'aborted', 5, 1, 4, 3, 0, 'oom', 'shard 7', ?)",
        (T0,),
    )
    conn.execute("INSERT INTO signatures VALUES ('sig-a', 'title', 1, 2, ?, ?, '')", (T0, T0))
    conn.executemany("INSERT INTO signature_members VALUES ('sig-a', 0, ?)", [("h0",), ("h1",)])
    conn.close()

    s = FailureStore(str(path), member_rows=1, batch_interval=0.01)
    s.start()
    try:
        assert user_version(path) == N
        old = PipelineStatus("etl", "aborted", 5, 1, 4, 3, 0, "oom", "shard 7", started=0.0)
        assert s.pipeline("etl") == old and s.pipelines() == [old]
        s.upsert_pipeline(run("etl", T0 + 10))  # a new run leaves the old one alone
        assert s.flush()
        assert s.pipeline_runs("etl") == [run("etl", T0 + 10), old]
        # Rows past member_rows from before the bound are kept; the count goes on exactly.
        assert s.distinct_counts("sig-a")["hosts"] == 2
        fill(s, [ev(0, host="h0"), ev(2, host="h2")])
        assert s.signature("sig-a").hosts == ["h0", "h1"]
        assert s.distinct_counts("sig-a")["hosts"] == 3
        indexes = {
            r[0]
            for r in rows(
                s, "SELECT name FROM sqlite_master WHERE tbl_name = 'pipelines' AND type = 'index'"
            )
        }
        assert "pipelines_updated" in indexes
    finally:
        s.close()


def test_a_failed_migration_is_rolled_back(tmp_path):
    path = tmp_path / "s.sqlite3"
    now = FailureStore(str(path))
    now.start()
    fill(now, [ev(1)])
    now.close()

    class Broken(FailureStore):
        migrations = MIGRATIONS + (("CREATE TABLE extra (x)", "THIS IS NOT SQL"),)

    with pytest.raises(StoreError, match=f"from schema version {N} to {N + 1}"):
        Broken(str(path)).start()
    assert user_version(path) == N
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name='extra'"
        ).fetchone() == (0,)
    finally:
        conn.close()


def test_a_file_from_a_newer_oomguard_is_refused_and_untouched(tmp_path):
    path = tmp_path / "future.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("CREATE TABLE events (everything_changed)")
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.commit()
    conn.close()
    before, listing = path.read_bytes(), sorted(os.listdir(tmp_path))
    with pytest.raises(StoreError) as err:
        FailureStore(str(path)).start()
    message = str(err.value)
    newer = f"version {len(MIGRATIONS) + 1}"
    assert str(path) in message and newer in message and f"up to {N}" in message
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == listing


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a database, it is a note somebody left here\n" * 100,
        b"SQLite format 3\x00" + b"\xff" * 4080,  # the magic, then garbage
        b"x",
    ],
    ids=["text", "corrupt-header", "one-byte"],
)
def test_a_corrupt_file_is_refused_and_untouched(tmp_path, content):
    path = tmp_path / "store.sqlite3"
    path.write_bytes(content)
    with pytest.raises(StoreError) as err:
        FailureStore(str(path)).start()
    assert str(path) in str(err.value)
    assert path.read_bytes() == content
    assert os.listdir(tmp_path) == ["store.sqlite3"]


def test_another_applications_database_is_refused_and_untouched(tmp_path):
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="another application"):
        FailureStore(str(path)).start()
    assert path.read_bytes() == before


# -- a real SIGKILL ---------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from oomguard._models import FailureEvent
    from oomguard._store import FailureStore

    store = FailureStore(sys.argv[1], batch_interval=0.005)
    store.start()
    n = 0
    while True:
        for _ in range(100):
            store.add(FailureEvent("infra", "oom_kill", f"s{n}", "p", f"w{n % 7}", f"h{n % 5}",
                                   "sig", "title", {"n": n}, 1, float(n)))
            n += 1
        if store.flush(30):
            print(f"acked {n}", flush=True)
    """
)


def test_sigkill_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "killed.sqlite3")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if len(lines) >= 30:  # well into the stream: the writer is mid-batch right now
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    acked = max(int(line.split()[1]) for line in lines + rest.splitlines())
    assert acked >= 3000

    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    s = FailureStore(path)
    s.start()
    try:
        stored = {e.shard for e in s.events(limit=None)}
        missing = [n for n in range(acked) if f"s{n}" not in stored]
        assert missing == []
        row = s.signature("sig")
        assert row.count >= acked and row.count == len(stored)
        assert s.distinct_counts("sig")["hosts"] == 5
    finally:
        s.close()


def test_close_waits_for_reads_running_on_other_threads(tmp_path):
    # The scheduler's gauge loop reads in a worker thread; a close() under a running query
    # closed its connection and crashed the process (segfault, seen under load).
    import threading

    for i in range(20):
        s = FailureStore(str(tmp_path / f"s{i}.sqlite3"), batch_interval=0.01)
        s.start()
        for n in range(50):
            s.add(ev(n))
        s.flush()
        outcome = []

        def read(store=s, outcome=outcome):
            try:
                while True:
                    store.signatures(limit=1000)
                    store.events(limit=1000)
            except RuntimeError as e:
                outcome.append(str(e))

        t = threading.Thread(target=read)
        t.start()
        time.sleep(0.01)
        s.close()
        t.join(10)
        assert outcome and "closed" in outcome[0], outcome
        assert s.reader.reads == 0


def test_a_store_of_schema_2_gets_killers_unknown_for_deaths_and_empty_for_exceptions(tmp_path):
    """Issue 26's migration: deaths stored before say 'unknown' (inferred), a task's
    exception has no killer; new events keep theirs, and the killer filters."""
    path = tmp_path / "v2.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:2]:
        for statement in migration:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    insert = "INSERT INTO events (time, kind, cause, shard, pipeline, worker, host, "
    insert += "signature_id, signature_title, evidence, attempt, grouping_version) "
    insert += "VALUES (?, ?, ?, 's', 'p', 'w', 'h', 'sig', 't', '{}', 1, 1)"
    conn.execute(insert, (T0, "infra", "sigterm"))
    conn.execute(insert, (T0 + 1, "user", "exception"))
    conn.close()

    s = FailureStore(str(path), batch_interval=0.01)
    s.start()
    try:
        assert user_version(path) == N
        old_death, old_exception = sorted(s.events(), key=lambda e: e.time)
        assert (old_death.killer, old_death.killer_how, old_death.killer_confidence) == (
            "unknown",
            "inferred",
            "likely",
        )
        assert (old_exception.killer, old_exception.killer_summary) == ("", "")
        new = ev(
            3,
            cause="sigterm",
            killer="earlyoom",
            killer_how="signal sender",
            killer_confidence="confirmed",
            killer_summary="SIGTERM from earlyoom (pid 812, uid 0) at MemAvailable 4.1 %",
        )
        fill(s, [new])
        assert [e.killer_summary for e in s.events(killer="earlyoom")] == [new.killer_summary]
        assert [e.time for e in s.events(killer="unknown")] == [T0]
    finally:
        s.close()
