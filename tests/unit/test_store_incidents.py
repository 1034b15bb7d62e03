"""Incidents and related signatures in the store (issue 40), on both backends: incidents
read from the deaths that name them (the same after a restart, whole under retention, an
amend keeps its incident), and signatures linked both ways by a shared crash site or
incident, bounded per signature, gone with their signature."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from oomguard import FailureEvent
from oomguard._death.record import Attribution, Death, Task
from oomguard._models import RELATED_MAX
from oomguard._store import MIGRATIONS, FailureStore
from oomguard._store.links import FAN
from pg_lab import BACKENDS, store_on

T0 = 1_790_000_000.0
UNKNOWN = Attribution("unknown", "inferred", "likely", "SIGKILL from an unknown sender")
SEGV = Attribution("task", "exit status", "confirmed", "the worker's own code: it crashed")


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    s = store_on(request, tmp_path)
    s.start()
    yield s
    s.close()


def death(n: int, t: float, incident: str = "", **kw) -> tuple[Death, list[FailureEvent]]:
    """Death `n` at T0 + `t` of cluster "c" on node-1, a SIGKILL of one task, in `incident`."""
    fields = dict(
        id=f"d{n}",
        cluster="c",
        worker=f"tcp://10.0.0.1:{4000 + n}",
        host="node-1",
        cause="sigkill",
        time=T0 + t,
        killer=UNKNOWN,
        signature_id="sig-idle",
        signature_title="sigkill in <no task>",
        incident=incident,
        tasks=(Task(key=f"load-{n}", prefix="load", pipeline="etl"),),
    )
    fields.update(kw)
    d = Death(**fields)
    event = FailureEvent(
        "infra", d.cause, f"load-{n}", "etl", d.worker, d.host, d.signature_id,
        d.signature_title, {}, 1, d.time, killer=d.killer.name, cluster=d.cluster, death=d.id,
    )  # fmt: skip
    return d, [event]


def record(store, *deaths, amend: bool = False) -> None:
    for d, events in deaths:
        assert store.record(d, events, amend=amend), store.last_error
    assert store.flush(), store.last_error


def incident_of_three(store) -> None:
    """Three workers of node-1 SIGKILLed within 0.4 s (incident d0), one 60 s later alone."""
    record(store, *(death(i, i / 5, "d0") for i in range(3)), death(3, 60.0))


# -- incidents ---------------------------------------------------------------------------------


def test_incidents_are_read_from_the_deaths_that_name_them(store):
    incident_of_three(store)
    alone, three = store.incidents()
    assert (three.id, three.deaths, three.hosts, three.cluster) == ("d0", 3, ["node-1"], "c")
    assert (three.start, three.end) == (T0, T0 + 0.4)
    assert (three.cause, three.killer, three.place) == ("sigkill", "unknown", "host node-1")
    assert three.summary == (
        "host node-1: 3 workers within 0.4 s, sigkill; SIGKILL from an unknown sender"
    )
    assert (alone.id, alone.deaths, alone.summary) == (
        "d3",
        1,
        "host node-1: 1 worker, sigkill; SIGKILL from an unknown sender",
    )
    # Each death names its incident; a death stored without one is its own.
    assert {d.id: d.incident for d in store.deaths()} == {
        "d0": "d0",
        "d1": "d0",
        "d2": "d0",
        "d3": "d3",
    }


def test_incidents_filter_and_page(store):
    incident_of_three(store)
    record(
        store,
        death(4, 120.0, cause="native_crash", killer=SEGV),
        death(5, 120.0, cluster="other"),
    )
    assert [i.id for i in store.incidents()] == ["d5", "d4", "d3", "d0"]
    assert [i.id for i in store.incidents(cluster="c")] == ["d4", "d3", "d0"]
    assert [i.id for i in store.incidents(cause="native_crash")] == ["d4"]
    assert [i.id for i in store.incidents(killer="task")] == ["d4"]
    assert [i.id for i in store.incidents(since=T0 + 60.0, cluster="c")] == ["d4", "d3"]
    assert [i.id for i in store.incidents(limit=2, offset=1)] == ["d4", "d3"]
    assert store.incidents(cause="oom_kill") == []


def test_an_amend_keeps_its_incident_and_its_count(store):
    incident_of_three(store)
    d, events = death(2, 0.4, "d0")
    amended = dataclasses.replace(d, cause="oom_kill", signature_id="sig-oom")
    record(store, (amended, [dataclasses.replace(e, cause="oom_kill") for e in events]),
           amend=True)  # fmt: skip
    three = next(i for i in store.incidents() if i.id == "d0")
    assert three.deaths == 3 and three.signatures == ["sig-idle", "sig-oom"]
    assert store.deaths(cause="oom_kill")[0].incident == "d0"


def test_the_same_incidents_after_a_restart(tmp_path):
    path = str(tmp_path / "history.sqlite3")
    first = FailureStore(path, batch_interval=0.01)
    first.start()
    incident_of_three(first)
    before = first.incidents()
    first.close()
    again = FailureStore(path)
    again.start()
    try:
        assert again.incidents() == before and [i.deaths for i in before] == [1, 3]
    finally:
        again.close()


def test_retention_takes_an_incident_whole(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), max_events=4, batch_interval=0.01)
    s.start()
    try:
        incident_of_three(s)
        record(s, death(4, 100.0))  # five deaths: past four, the oldest incident goes whole
        assert [(i.id, i.deaths) for i in s.incidents()] == [("d4", 1), ("d3", 1)]
        assert [d.id for d in s.deaths()] == ["d4", "d3"]
    finally:
        s.close()


def test_a_file_of_the_schema_before_incidents_reads_each_death_as_its_own(tmp_path):
    path = tmp_path / "v6.sqlite3"
    before = FailureStore(str(path), batch_interval=0.01)
    before.migrations = MIGRATIONS[:6]
    before.start()
    before.close()
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO deaths (id, cluster, time, worker, host, cause, killer, signature_id,"
        " signature_title, grouping_version, record) VALUES"
        " ('old', 'c', ?, 'w', 'node-1', 'sigkill', 'unknown', 's', 't', 2, '{}')",
        (T0,),
    )
    conn.commit()
    conn.close()
    s = FailureStore(str(path), batch_interval=0.01)
    s.start()
    try:
        assert [(i.id, i.deaths) for i in s.incidents()] == [("old", 1)]
        assert s.deaths()[0].incident == "old"
    finally:
        s.close()


def test_the_incident_reads_take_their_indexes(tmp_path):
    from oomguard._store import incidents, query
    from oomguard._store.reads import SQLITE

    s = FailureStore(str(tmp_path / "s.sqlite3"))
    s.start()
    try:
        conn = sqlite3.connect(s.file)

        def plan(sql, args):
            return " ".join(str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))

        heads = dict(since=None, cause=None, killer=None, limit=10, offset=0)
        assert "deaths_incidents" in plan(*incidents.heads(SQLITE, cluster=None, **heads))
        assert "deaths_cluster_incidents" in plan(*incidents.heads(SQLITE, cluster="c", **heads))
        members = plan(*incidents.members(SQLITE, [("c", "d0"), ("c", "d9")]))
        assert "SEARCH d USING INDEX deaths_incident (cluster=? AND incident=?)" in members
        assert query.DEATH_READ_COLUMNS.endswith("incident")
        conn.close()
    finally:
        s.close()


# -- related signatures ------------------------------------------------------------------------


def crash(n: int, signature: str, sites: tuple[str, ...], t: float = 0.0, incident: str = ""):
    return death(n, t, incident, cause="native_crash", killer=SEGV, signature_id=signature,
                 signature_title=f"SIGSEGV in {signature}", sites=sites)  # fmt: skip


NATIVE = "SIGSEGV in ctypes.string_at"


def related(store, signature: str) -> dict[str, str]:
    return {r["id"]: r["why"] for r in store.signature(signature).related}


def test_signatures_of_one_crash_site_are_related_both_ways(store):
    record(store, crash(0, "sig-a", (NATIVE, "SIGSEGV in app.core.parse_record")))
    record(store, crash(1, "sig-b", (NATIVE, "SIGSEGV in app.core.parse_header"), t=5.0))
    record(store, crash(2, "sig-c", ("SIGSEGV in app.core.other",), t=9.0))
    assert related(store, "sig-a") == {"sig-b": "same crash site"}
    assert related(store, "sig-b") == {"sig-a": "same crash site"}
    assert related(store, "sig-c") == {}
    (row,) = [r for r in store.signature("sig-a").related]
    assert row["title"] == "SIGSEGV in sig-b"
    # In the list too, and once more of the same signature adds nothing.
    record(store, crash(3, "sig-b", (NATIVE,), t=20.0))
    assert {s.id: s.related for s in store.signatures()}["sig-b"] == [
        {"id": "sig-a", "title": "SIGSEGV in sig-a", "why": "same crash site"}
    ]


def test_signatures_of_one_incident_are_related_both_ways(store):
    record(store, death(0, 0.0, "d0", signature_id="sig-load"))
    record(store, death(1, 0.2, "d0", signature_id="sig-sort"), death(2, 0.3, "d0"))
    assert related(store, "sig-load") == {"sig-sort": "same incident", "sig-idle": "same incident"}
    assert related(store, "sig-idle") == {"sig-sort": "same incident", "sig-load": "same incident"}
    # Both reasons: one link, saying both.
    record(store, crash(3, "sig-x", (NATIVE,), t=50.0), crash(4, "sig-y", (NATIVE,), 50.1, "d3"))
    assert related(store, "sig-x") == {"sig-y": "same crash site, same incident"}
    assert related(store, "sig-y") == {"sig-x": "same crash site, same incident"}


def test_related_signatures_are_bounded_and_every_link_holds_both_ways(store):
    n = RELATED_MAX + 10
    record(store, *(crash(i, f"sig-{i:02d}", (NATIVE,), t=float(i)) for i in range(n)))
    links = {s.id: {r["id"] for r in s.related} for s in store.signatures(limit=None)}
    assert len(links) == n and 0 < max(map(len, links.values())) <= RELATED_MAX
    assert all(a in links[b] for a, others in links.items() for b in others)
    assert FAN >= RELATED_MAX


def test_a_forgotten_signature_takes_its_links_both_ways(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"), max_signatures=2, batch_interval=0.01)
    s.start()
    try:
        record(s, crash(0, "sig-a", (NATIVE,)), crash(1, "sig-b", (NATIVE,), t=1.0))
        assert related(s, "sig-b") == {"sig-a": "same crash site"}
        record(s, crash(2, "sig-c", ("SIGSEGV in elsewhere",), t=2.0))  # sig-a goes
        assert s.signature("sig-a") is None and related(s, "sig-b") == {}
        conn = sqlite3.connect(s.file)
        left = conn.execute(
            "SELECT count(*) FROM signature_links WHERE 'sig-a' IN (signature_id, related_id)"
        ).fetchone()
        sites = conn.execute(
            "SELECT count(*) FROM signature_sites WHERE signature_id = 'sig-a'"
        ).fetchone()
        conn.close()
        assert left == sites == (0,)
    finally:
        s.close()


def test_a_role_granted_before_keeps_sending_after_the_migration(pg_url):
    """A cluster's writer granted by an older oomguard (`oomguard history grant`) gets on
    the new tables what it has on `signatures`, so its deaths still reach the history."""
    import uuid

    from oomguard._store.pg import MIGRATIONS as PG_MIGRATIONS
    from oomguard._store.pg import migrate, pg_connect

    role = f"old_writer_{uuid.uuid4().hex[:8]}"
    with pg_connect(pg_url) as conn:
        migrate(conn, pg_url, PG_MIGRATIONS[:3])
        with conn.transaction():
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON signatures TO {role}")
        migrate(conn, pg_url)
        rights = {
            (table, right): conn.execute(
                "SELECT has_table_privilege(%s, %s, %s)", (role, f"oomguard.{table}", right)
            ).fetchone()[0]
            for table in ("signature_sites", "signature_links")
            for right in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
        }
    assert rights == {key: key[1] != "TRUNCATE" for key in rights}  # what it had, no more
