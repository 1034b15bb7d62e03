"""One account per worker death in the store (issue 38), on both backends: a decided death
is one row (read back as a `Death`, its tasks with their roles), its events name it, a
signature counts it once however many of its events carry it, an amend replaces it by its
id (the count moves with it), a repeat is dropped, the reads filter and page it, retention
bounds it, and a file of the schema before deaths keeps what it had."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest

from oomguard import FailureEvent
from oomguard._death.record import Attribution, Crash, Death, Role, Task
from oomguard._store import MIGRATIONS, FailureStore
from pg_lab import BACKENDS, store_on

T0 = 1_790_000_000.0
KERNEL = Attribution("kernel", "kernel log", "confirmed", "the kernel's OOM killer")


@pytest.fixture(params=BACKENDS)
def unstarted(request, tmp_path):
    """The store on both backends, not started: what is queued now is one batch."""
    s = store_on(request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def store(unstarted):
    unstarted.start()
    return unstarted


def death(n: int, *blamed: str, **kw) -> tuple[Death, list[FailureEvent]]:
    """Death `n` of cluster "c" at T0 + n: `blamed` its culprit (one) or suspects (several),
    each with an event; `displaced` and `queued` (keyword lists) tasks without one."""
    displaced = kw.pop("displaced", ())
    queued = kw.pop("queued", ())
    pipelines = kw.pop("pipelines", {})
    role = Role.CULPRIT if len(blamed) == 1 else Role.SUSPECT
    tasks = tuple(
        Task(key=k, prefix=k.split("-")[0], role=r, pipeline=pipelines.get(k, "etl"))
        for keys, r in ((blamed, role), (displaced, Role.DISPLACED), (queued, Role.QUEUED))
        for k in keys
    )
    fields = dict(
        id=f"d{n}",
        cluster="c",
        worker=f"tcp://10.0.0.{n % 4}:4000",
        host=f"node-{n % 4}",
        cause="oom_kill",
        time=T0 + n,
        tasks=tasks,
        killer=KERNEL,
        signature_id="sig-a",
        signature_title="oom_kill in load",
        evidence={"summary": f"death {n}", "n": n},
    )
    fields.update(kw)
    d = Death(**fields)
    events = [
        FailureEvent(
            "infra",
            d.cause,
            k,
            pipelines.get(k, "etl"),
            d.worker,
            d.host,
            d.signature_id,
            d.signature_title,
            dict(d.evidence),
            1,
            d.time,
            killer=KERNEL.name,
            cluster=d.cluster,
            death=d.id,
        )  # fmt: skip
        for k in blamed
    ]
    return d, events


def exception(n: int, **kw) -> FailureEvent:
    fields = dict(
        kind="user",
        cause="exception",
        shard=f"x-{n}",
        pipeline="etl",
        worker="tcp://10.0.0.1:4000",
        host="node-1",
        signature_id="sig-a",
        signature_title="oom_kill in load",
        evidence={"n": n},
        time=T0 + n,
        cluster="c",
    )
    fields.update(kw)
    return FailureEvent(**fields)


def record(store, *deaths, amend: bool = False) -> None:
    for d, events in deaths:
        assert store.record(d, events, example="trace", amend=amend), store.last_error
    assert store.flush(), store.last_error


def counts(store) -> dict[str, int]:
    return {s.id: s.count for s in store.signatures()}


def test_a_death_is_one_row_with_its_tasks_and_roles_its_events_name_it(store):
    d, events = death(1, "load-1", displaced=["other-7"], queued=["load-2"])
    crash = Crash("SIGSEGV", "Fatal Python error: Segmentation fault\n" + "x" * 10_000)
    tasks = tuple(dataclasses.replace(t, stack=(("f.py", 1, "load"),)) for t in d.tasks)
    record(store, (dataclasses.replace(d, crash=crash, tasks=tasks), events))
    (got,) = store.deaths()
    assert (got.id, got.cluster, got.cause, got.worker, got.time) == ("d1", "c", "oom_kill",
                                                                      d.worker, T0 + 1)  # fmt: skip
    assert [(t.key, t.role, t.pipeline) for t in got.tasks] == [
        ("load-1", Role.CULPRIT, "etl"),
        ("other-7", Role.DISPLACED, "etl"),
        ("load-2", Role.QUEUED, "etl"),
    ]
    assert got.killer == KERNEL and got.evidence == d.evidence
    # Slimmed: the trace stays with the signature, not with each death.
    assert got.crash == Crash("SIGSEGV", "") and all(t.stack is None for t in got.tasks)
    assert got.signature_id == "sig-a" and got.signature_title == "oom_kill in load"
    (event,) = store.events()
    assert (event.death, event.shard) == ("d1", "load-1")
    assert store.signature("sig-a").example == "trace"


def test_a_signature_counts_each_death_once_and_each_event_without_one(store):
    # Two suspects share one death: two events, one death, one count.
    record(store, death(1, "load-1", "load-2"), death(2, "load-3"))
    assert store.add(exception(3)) and store.add(exception(4))  # task exceptions: one each
    assert store.flush()
    assert len(store.events()) == 5 and len(store.deaths()) == 2
    assert counts(store) == {"sig-a": 4}
    row = store.signature("sig-a")
    assert row.shards == ["load-1", "load-2", "load-3", "x-3", "x-4"]  # members: every event
    assert (row.first_seen, row.last_seen) == (T0 + 1, T0 + 4)


@pytest.mark.parametrize("same_batch", [False, True])
def test_an_amend_replaces_the_death_and_its_events_by_id(unstarted, same_batch):
    store = unstarted
    lost, lost_events = death(1, "load-1", "load-2", cause="worker_lost", signature_id="lost")
    other = death(2, "load-9", cause="worker_lost", signature_id="lost")
    if same_batch:  # queued before the writer starts: one batch
        for d, events in (other, (lost, lost_events)):
            assert store.record(d, events)
    else:
        store.start()
        record(store, other, (lost, lost_events))
        assert counts(store) == {"lost": 2}
    # The late report: what killed it, which task ran, a signature of its own.
    real, events = death(1, "load-2", signature_id="oom", time=T0 + 1.5)
    assert store.record(real, events, amend=True)
    if same_batch:
        store.start()
    assert store.flush(), store.last_error
    assert [(d.id, d.cause) for d in store.deaths()] == [("d2", "worker_lost"), ("d1", "oom_kill")]
    assert sorted((e.death, e.shard, e.cause) for e in store.events()) == [
        ("d1", "load-2", "oom_kill"),
        ("d2", "load-9", "worker_lost"),
    ]
    assert counts(store) == {"lost": 1, "oom": 1}  # moved, never both
    # Amended again (the pod's verdict): still one death, one count.
    record(store, death(1, "load-2", signature_id="oom", killer=None), amend=True)
    assert len(store.deaths(cluster="c")) == 2 and counts(store) == {"lost": 1, "oom": 1}
    assert store.deaths(signature="oom")[0].killer is None


def test_a_repeat_is_dropped_with_its_events_and_counted_once(unstarted):
    store = unstarted
    d = death(1, "load-1")
    assert store.record(*d) and store.record(*d)  # in one batch
    store.start()
    assert store.flush()
    record(store, d)  # and in a later one
    assert len(store.deaths()) == 1 and len(store.events()) == 1
    assert counts(store) == {"sig-a": 1}


def test_an_amend_of_a_death_never_stored_stores_it(store):
    record(store, death(5, "load-5", signature_id="late"), amend=True)
    assert [d.id for d in store.deaths()] == ["d5"] and counts(store) == {"late": 1}


def test_the_same_id_on_two_clusters_is_two_deaths(store):
    a = death(1, "load-1")
    b = death(1, "load-1", cluster="other")
    b = (b[0], [dataclasses.replace(e, cluster="other") for e in b[1]])
    record(store, a, b)
    record(store, death(1, cluster="other", signature_id="oom"), amend=True)  # no events
    assert sorted((d.cluster, d.signature_id) for d in store.deaths()) == [
        ("c", "sig-a"),
        ("other", "oom"),
    ]
    assert [e.cluster for e in store.events()] == ["c"]  # the amend had no events
    assert counts(store) == {"sig-a": 1, "oom": 1}


def test_deaths_filters_and_pages(store):
    record(
        store,
        death(1, "load-1", displaced=["agg-1"], pipelines={"agg-1": "healthy"}),
        death(2, "load-2", "load-3", cause="sigkill", killer=None, signature_id="sig-b"),
        death(3, "agg-2", worker="tcp://10.0.0.9:4000", queued=["load-1"]),
        death(4, "load-4", cluster="nightly"),
    )
    ids = lambda **q: [d.id for d in store.deaths(**q)]  # noqa: E731
    assert ids() == ["d4", "d3", "d2", "d1"]  # newest first
    assert ids(cluster="c") == ["d3", "d2", "d1"] and ids(cluster="nope") == []
    assert ids(since=T0 + 2.5) == ["d4", "d3"]
    assert ids(cause="sigkill") == ["d2"] and ids(signature="sig-b") == ["d2"]
    assert ids(killer="kernel") == ["d4", "d3", "d1"] and ids(killer="earlyoom") == []
    assert ids(worker="tcp://10.0.0.9:4000") == ["d3"]
    # A shard or pipeline among the tasks, whatever its role: culprit, suspect, displaced,
    # queued.
    assert ids(shard="load-1") == ["d3", "d1"] and ids(shard="load-3") == ["d2"]
    assert ids(pipeline="healthy") == ["d1"] and ids(pipeline="etl", cluster="c") == [
        "d3",
        "d2",
        "d1",
    ]
    assert ids(shard="agg-2", pipeline="healthy") == []  # each filter must match
    assert ids(limit=2) == ["d4", "d3"]
    page = store.deaths(limit=2)
    assert ids(before=(page[-1].time, page[-1].id)) == ["d2", "d1"]
    assert ids(max_bytes=1) == ["d4"]  # the first row always comes back


def test_death_times_are_those_of_the_deaths_read(store):
    """What the dashboard plots (without reading each death) is what deaths() returns."""
    record(store, *(death(n, f"load-{n}", cluster="c" if n % 2 else "x") for n in range(6)))
    for q in ({}, {"cluster": "c"}, {"since": T0 + 3}, {"limit": 2}):
        assert store.death_times(**q) == [(d.time, d.cause) for d in store.deaths(**q)], q


def test_deaths_at_the_same_time_page_by_id(store):
    record(store, *(death(n, f"load-{n}", time=T0) for n in range(5)))
    seen, before = [], None
    while page := store.deaths(limit=2, before=before):
        seen += [d.id for d in page]
        before = (page[-1].time, page[-1].id)
    assert seen == ["d4", "d3", "d2", "d1", "d0"]


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(id=""), "death.id"),
        (dict(time=float("nan")), "death.time"),
        (dict(worker=7), "death.worker"),
        (dict(evidence={"rss": object()}), "death.evidence"),
        (dict(evidence={"rss": float("inf")}), "death.evidence"),
    ],
)
def test_a_bad_death_is_refused_naming_the_field_and_nothing_is_lost(store, change, field):
    d, events = death(1, "load-1")
    assert store.record(dataclasses.replace(d, **change), events) is False
    assert field in store.last_error and store.write_errors == 1
    record(store, death(2, "load-2"))
    assert [d.id for d in store.deaths()] == ["d2"]


def test_events_that_do_not_name_their_death_are_refused(store):
    d, events = death(1, "load-1")
    wrong = [dataclasses.replace(events[0], death="d9")]
    assert store.record(d, wrong) is False and "'death'" in store.last_error
    elsewhere = [dataclasses.replace(events[0], cluster="other")]
    assert store.record(d, elsewhere) is False and "'cluster'" in store.last_error
    assert store.record(d, events, amend="yes") is False  # type: ignore[arg-type]
    assert store.record(d.to_dict(), events) is False  # type: ignore[arg-type]
    assert store.write_errors == 4 and store.flush() and store.deaths() == []


def test_retention_bounds_deaths_and_keeps_the_counts(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), max_events=3, batch_interval=0.01)
    s.start()
    try:
        for n in range(6):
            record(s, death(n, f"load-{n}", displaced=[f"agg-{n}"]))
        assert [d.id for d in s.deaths(limit=None)] == ["d5", "d4", "d3"]
        assert s.deaths(shard="agg-1") == []
        tasks = sqlite3.connect(s.file).execute("SELECT count(*) FROM death_tasks").fetchone()
        assert tasks == (6,)  # two per death kept: the dropped deaths' tasks went with them
        assert s.signature("sig-a").count == 6
    finally:
        s.close()


def test_a_row_from_another_oomguard_reads_leniently(tmp_path):
    """A newer oomguard's death (fields this one does not know, a value of another shape)
    and a row whose JSON is unreadable: each reads, from the columns where nothing else."""
    s = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    s.start()
    try:
        record(s, death(1, "load-1"), death(2, "load-2"))
        newer = {
            **death(1, "load-1")[0].to_dict(),
            "tasks": [{"key": "load-1", "role": "instigator", "future": {"x": 1}}, "junk"],
            "killer": {"name": "kernel", "how": "kernel log"},  # a field it no longer sends
            "memory_limit": "2 GiB",
            "new_field": [1, 2],
        }
        conn = sqlite3.connect(s.file)
        conn.execute("UPDATE deaths SET record = ? WHERE id = 'd1'", (json.dumps(newer),))
        conn.execute("UPDATE deaths SET record = '{not json' WHERE id = 'd2'")
        conn.commit()
        conn.close()
        two, one = s.deaths()
        assert (two.id, two.cause, two.worker, two.tasks) == (
            "d2",
            "oom_kill",
            death(2)[0].worker,
            (),
        )
        assert (one.id, one.memory_limit, one.killer) == ("d1", None, None)
        assert [(t.key, t.role) for t in one.tasks] == [("load-1", None)]
    finally:
        s.close()


def test_a_file_of_the_schema_before_deaths_keeps_its_events_and_counts(tmp_path):
    """Deaths stored before are events only (no backfill): their counts stay per event;
    deaths recorded from now on count once each."""
    path = tmp_path / "v5.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:5]:
        for statement in migration:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 5")
    insert = (
        "INSERT INTO events (time, kind, cause, shard, pipeline, worker, host, signature_id,"
        " signature_title, evidence, attempt, grouping_version, cluster) VALUES"
        " (?, 'infra', 'oom_kill', ?, 'etl', 'w', 'h', 'sig-a', 't', '{}', 1, 1, 'c')"
    )
    conn.execute(insert, (T0, "old-1"))
    conn.execute(insert, (T0, "old-2"))  # one death of two suspects, stored as two events
    conn.execute("INSERT INTO signatures VALUES ('sig-a', 't', 1, 2, ?, ?, '')", (T0, T0))
    conn.close()
    s = FailureStore(str(path), batch_interval=0.01)
    s.start()
    try:
        assert s.deaths() == [] and {e.death for e in s.events()} == {""}
        record(s, death(1, "load-1", "load-2"))
        assert s.signature("sig-a").count == 3 and [d.id for d in s.deaths()] == ["d1"]
        assert [e.shard for e in s.events(shard="old-1")] == ["old-1"]
    finally:
        s.close()


def test_the_shard_filter_takes_the_index(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    s.start()
    try:
        from oomguard._store import query
        from oomguard._store.reads import SQLITE

        sql, args = query.deaths(
            SQLITE, cluster=None, since=None, cause=None, killer=None, signature=None,
            worker=None, shard="load-1", pipeline=None, before=None, limit=10,
        )  # fmt: skip
        conn = sqlite3.connect(s.file)
        plan = " ".join(str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        conn.close()
        assert "death_tasks_shard" in plan, plan
    finally:
        s.close()
