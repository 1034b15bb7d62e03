"""The PostgreSQL history against a real server (tests/pg_lab.py): schedulers' spools sent
exactly once, at once, through outages; the schema versioned and refused when newer; a URL's
password nowhere. The store's API on PostgreSQL is tests/unit/test_store.py's `store`."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from oomguard import FailureEvent
from oomguard._death.record import Death, Role, Task
from oomguard._exceptions import ConfigError
from oomguard._store import FailureStore
from oomguard._store.pg import MIGRATIONS, PgReader, Shipper, migrate, pg_connect
from oomguard._urls import check, redact, scheme

T0 = 1_790_000_000.0


def ev(n: int, **kw) -> FailureEvent:
    fields = dict(
        kind="infra",
        cause="oom_kill",
        shard=f"s{n}",
        pipeline="etl",
        worker="tcp://10.0.0.1:4000",
        host="h1",
        signature_id=f"sig-{n % 7}",
        signature_title="MemoryError in parse",
        evidence={"n": n},
        time=T0 + n,
    )
    fields.update(kw)
    return FailureEvent(**fields)


def one(url: str, sql: str, *args):
    with pg_connect(url) as conn:
        return conn.execute(sql, args).fetchone()


def lose_the_mark(spool: FailureStore) -> None:
    """As a shipper killed after the history committed and before the spool's mark moved."""
    conn = sqlite3.connect(spool.file, isolation_level=None)
    conn.execute("UPDATE ship_state SET value = '0' WHERE key IN ('sent', 'deaths_sent')")
    conn.close()


@pytest.fixture
def spool(tmp_path):
    s = FailureStore(str(tmp_path / "spool.sqlite3"), batch_interval=0.01)
    s.start()
    yield s
    s.close()


def test_an_outage_keeps_events_in_the_spool_and_sends_them_once(postgres, pg_url, spool, caplog):
    shipper = Shipper(spool, pg_url, "a")
    shipper.start()
    try:
        for n in range(100):
            assert spool.add(ev(n))
        assert shipper.sync()
        assert shipper.up is True and shipper.sent == 100
        postgres.stop()
        with caplog.at_level(logging.WARNING, logger="oomguard.store"):
            for n in range(100, 250):
                assert spool.add(ev(n))
            assert spool.flush()
            assert not shipper.sync(timeout=3)  # away: kept, not lost
            assert shipper.up is False and shipper.backlog == 150
            postgres.start()
            assert shipper.sync(timeout=60)
        away = [r.getMessage() for r in caplog.records if "is away" in r.getMessage()]
        back = [r.getMessage() for r in caplog.records if "is back after" in r.getMessage()]
        assert len(away) == 1 and len(back) == 1, (away, back)
        assert "lab-secret" not in " ".join(away + back) and "***" in away[0]
    finally:
        shipper.close()
    assert one(pg_url, "SELECT count(*), count(DISTINCT local_id) FROM events") == (250, 250)
    assert one(pg_url, "SELECT sum(count) FROM signatures") == (250,)
    assert shipper.sent == 250 and shipper.outages == 1


def test_a_batch_sent_twice_is_counted_once(pg_url, spool):
    """Killed after the database committed and before the spool's mark moved: the next
    shipper sends the batch again; the history keeps one copy and one count, of events and
    of deaths alike."""
    for n in range(20):
        spool.add(ev(n))
    for n in range(20, 30):  # ten deaths, one event each: each counts once, as a death
        d = Death(id=f"d{n}", cluster="a", time=T0 + n, signature_id=f"sig-{n % 7}")
        assert spool.record(d, [ev(n, cluster="a", death=d.id)])
    assert spool.flush()
    first = Shipper(spool, pg_url, "a")
    first.start()
    assert first.sync()
    first.close()
    lose_the_mark(spool)
    again = Shipper(spool, pg_url, "a")
    again.start()
    assert again.sync()
    again.close()
    assert again.sent == 0 and again.deaths.sent == 10  # upserted again, counted no more
    assert one(pg_url, "SELECT count(*), sum(attempt) FROM events") == (30, 30)
    assert one(pg_url, "SELECT count(*) FROM deaths") == (10,)
    assert one(pg_url, "SELECT sum(count) FROM signatures") == (30,)


def test_the_shipper_never_waits_for_the_spools_write_lock(pg_url, spool):
    """Another writer holds the spool's lock (as the writer thread does during its long
    commits): the batch still goes out at once, and its mark is stored by the spool's writer
    once the lock is free."""
    first = Shipper(spool, pg_url, "a")  # the spool's origin made, nothing to send
    first.start()
    first.close()
    for n in range(40):
        spool.add(ev(n))
    assert spool.flush()
    holder = sqlite3.connect(spool.file, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    shipper = Shipper(spool, pg_url, "a")
    shipper.start()
    try:
        assert shipper.sync(timeout=30)  # never, were the mark waiting for the lock
        assert one(pg_url, "SELECT count(*) FROM events") == (40,)
        stored = "SELECT value FROM ship_state WHERE key = 'sent'"
        assert holder.execute(stored).fetchall() == []
        holder.execute("COMMIT")
    finally:
        shipper.close()
        holder.close()
    conn = sqlite3.connect(spool.file)
    last = conn.execute("SELECT max(id) FROM events").fetchone()[0]
    assert conn.execute(stored).fetchone() == (str(last),)
    conn.close()


def test_an_amend_after_sending_replaces_the_death_and_its_events_in_the_history(pg_url, spool):
    def death(cause: str, signature: str) -> tuple[Death, list[FailureEvent]]:
        d = Death(id="d1", cluster="a", worker="tcp://10.0.0.1:4000", cause=cause, time=T0,
                  signature_id=signature, tasks=(Task("s1", role=Role.CULPRIT),))  # fmt: skip
        return d, [ev(1, cause=cause, signature_id=signature, cluster="a", death="d1")]

    shipper = Shipper(spool, pg_url, "a")
    shipper.start()
    try:
        assert spool.record(*death("worker_lost", "lost"))
        assert shipper.sync()
        assert spool.record(*death("oom_kill", "oom"), amend=True)
        assert shipper.sync()
    finally:
        shipper.close()
    reader = PgReader(pg_url)
    reader.start()
    try:
        assert [(e.cause, e.death) for e in reader.events()] == [("oom_kill", "d1")]
        assert [(d.id, d.cause) for d in reader.deaths()] == [("d1", "oom_kill")]
        assert {s.id: s.count for s in reader.signatures()} == {"lost": 0, "oom": 1}
    finally:
        reader.close()


WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = {paths!r}
    from oomguard import FailureEvent
    from oomguard._store import FailureStore
    from oomguard._store.pg import Shipper

    spool = FailureStore(sys.argv[1], batch_interval=0.01)
    spool.start()
    shipper = Shipper(spool, sys.argv[2], sys.argv[3], batch=500)
    shipper.start()
    for n in range(int(sys.argv[4])):
        spool.add(FailureEvent("infra", "oom_kill", f"s{{n}}", "etl", "w", sys.argv[3],
                               f"sig-{{n % 13}}", "t", {{}}, time=1.0 + n, cluster=sys.argv[3]))
        if n % 100 == 0:
            time.sleep(0.001)
    assert shipper.sync(120), "not sent"
    shipper.close()
    spool.close()
    """
)


def test_four_schedulers_at_once_lose_and_duplicate_nothing(pg_url, tmp_path):
    n = 3000
    code = WRITER.format(paths=sys.path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / f"{i}.sqlite3"), pg_url, f"c{i}", str(n)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for p in procs:
        assert p.wait(240) == 0, p.stderr.read()
    assert one(pg_url, "SELECT count(*), count(DISTINCT (origin, local_id)) FROM events") == (
        4 * n,
        4 * n,
    )
    with pg_connect(pg_url) as conn:
        counts = dict(conn.execute("SELECT id, count FROM signatures").fetchall())
        clusters = conn.execute(
            "SELECT count(DISTINCT value) FROM signature_members WHERE field = 5"
        ).fetchone()[0]
    expected = {f"sig-{k}": 4 * len(range(k, n, 13)) for k in range(13)}
    assert counts == expected
    assert clusters == 4


def test_migrations_run_once_and_a_newer_schema_is_refused_untouched(pg_url, spool):
    conns = [pg_connect(pg_url) for _ in range(3)]
    try:
        assert [migrate(c, pg_url) for c in conns] == [len(MIGRATIONS)] * 3
        conns[0].execute("UPDATE schema_version SET version = 99")
        conns[0].commit()
    finally:
        for c in conns:
            c.close()
    shipper = Shipper(spool, pg_url, "a")
    shipper.start()
    try:
        spool.add(ev(1))
        assert not shipper.sync(timeout=3)
        assert "schema version 99" in shipper.refused
        assert f"up to {len(MIGRATIONS)}" in shipper.refused
        assert "lab-secret" not in shipper.refused
    finally:
        shipper.close()
    assert one(pg_url, "SELECT count(*) FROM events") == (0,)


def test_urls_are_checked_and_redacted():
    url = "postgresql://u:s3cret@db:5432/h?sslmode=require&password=s3cret"
    assert scheme(url) == "postgresql" and scheme("/var/lib/x.sqlite3") is None
    assert check(url) == url
    assert "s3cret" not in redact(url) and redact(url).startswith("postgresql://u:***@db:5432/h")
    with pytest.raises(ValueError, match="scheme 'mysql'"):
        check("mysql://u:s3cret@db/h")
    import dask

    from oomguard._config import scheduler_settings

    with dask.config.set({"oomguard.scheduler.store": "mysql://u:pw@db/x"}):
        with pytest.raises(ConfigError, match="oomguard.scheduler.store") as e:
            scheduler_settings()
    assert "pw" not in str(e.value).replace("postgresql", "")


def test_a_url_is_never_taken_for_a_path(tmp_path):
    """Before, `--store postgresql://...` was a path: 'the file does not exist'."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", "--store",
         "postgresql://u:s3cret@127.0.0.1:1/h"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "cannot read the history postgresql://u:***@127.0.0.1:1/h" in proc.stderr
    assert "s3cret" not in proc.stderr and proc.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())  # no directory named after the URL


def test_a_row_the_database_refuses_is_set_aside_and_said_the_rest_arrive(pg_url, spool, caplog):
    """More in tests/unit/test_history_trust.py (issue 39)."""
    spool.add(ev(1))
    spool.add(ev(2, attempt=2**40))  # fits SQLite's integer, not PostgreSQL's
    spool.add(ev(3, shard="nul\x00in key"))  # made safe at the store's door
    spool.add(ev(4))
    shipper = Shipper(spool, pg_url, "a")
    shipper.start()
    try:
        with caplog.at_level(logging.ERROR, logger="oomguard.store"):
            assert shipper.sync()
    finally:
        shipper.close()
    with pg_connect(pg_url) as conn:
        shards = [r[0] for r in conn.execute("SELECT shard FROM events ORDER BY local_id")]
    assert shards == ["s1", "nul\\x00in key", "s4"]
    assert shipper.aside.counts["event"] == 1 and shipper.up is True
    (line,) = [r.getMessage() for r in caplog.records if "refused event" in r.getMessage()]
    assert "refused event 2: " in line and "out of range" in line and "set aside" in line
    assert one(pg_url, "SELECT sum(count) FROM signatures") == (3,)


def test_retention_per_cluster_by_age_and_of_signatures(pg_url, spool):
    other = Shipper(spool, pg_url, "other")  # another cluster's 10 old events
    other.start()
    for n in range(10):
        spool.add(ev(n, cluster="other", time=1_000.0 + n, signature_id=f"old-{n}"))
    assert other.sync()
    other.close()
    shipper = Shipper(spool, pg_url, "a", max_events=50, max_signatures=8, max_age=3600.0 * 24)
    shipper.start()
    try:
        for n in range(80):  # 80 of cluster a, now, on 7 signatures
            spool.add(ev(n, cluster="a", time=time.time() - 80 + n))
        assert shipper.sync()
        shipper._next_retention = 0.0  # the next round's pass, not in a minute
        spool.add(ev(999, cluster="a", time=time.time()))
        assert shipper.sync()
    finally:
        shipper.close()
    with pg_connect(pg_url) as conn:
        by_cluster = dict(conn.execute("SELECT cluster, count(*) FROM events GROUP BY 1"))
        signatures = {r[0] for r in conn.execute("SELECT id FROM signatures")}
        fields = {r[0] for r in conn.execute("SELECT signature_id FROM signature_fields")}
        members = {r[0] for r in conn.execute("SELECT signature_id FROM signature_members")}
    # Cluster a keeps its newest 50; the other cluster's events are past max-age; past 8
    # signatures the least recently seen go, with their lists.
    assert by_cluster == {"a": 50}
    assert signatures == {f"sig-{k}" for k in range(7)} | {"old-9"}
    assert fields == members == signatures
