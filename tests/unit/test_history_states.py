"""Signature states across clusters on a real PostgreSQL history (tests/pg_lab.py, issue
40): a resolve is the fleet's (made by one cluster's writer, seen by every role), a
read-only role cannot resolve (a clear refusal, from the API and from `oomguard report`),
a death of another cluster after the resolve regresses it, and two clusters sending such
deaths at once count the regression once. The migration that adds the tables gives the
roles granted before it their rights on them."""

from __future__ import annotations

import threading

import psycopg
import pytest
from test_history_roles import T0, as_role, cli, ev, grant, ship, stop

from oomguard._death.record import Death, Role, Task
from oomguard._store.pg import MIGRATIONS, PgReader, migrate, pg_connect


def death(n: int, cluster: str, t: float) -> tuple[Death, list]:
    task = Task(f"{cluster}-s{n}", "s", role=Role.CULPRIT, pipeline=f"etl-{cluster}")
    d = Death(
        id=f"{cluster}-d{n}",
        cluster=cluster,
        worker="tcp://10.0.0.1:4000",
        host=f"host-{cluster}",
        time=t,
        cause="oom_kill",
        tasks=(task,),
        signature_id="shared",
        signature_title="MemoryError in parse",
    )
    return d, [ev(n, cluster, signature_id="shared", death=d.id, time=t)]


def reader(url: str) -> PgReader:
    r = PgReader(url)
    r.start()
    return r


def test_a_resolve_is_the_fleets_and_its_regression_is_counted_once(pg_url, tmp_path):
    db = pg_url.rsplit("/", 1)[1]
    w_a = grant(pg_url, tmp_path, f"w_a_{db}", "a")
    w_b = grant(pg_url, tmp_path, f"w_b_{db}", "b")
    r_all = grant(pg_url, tmp_path, f"r_all_{db}", read_only=True)
    a, b = ship(tmp_path, w_a, "a", 3), ship(tmp_path, w_b, "b", 2)
    ra, rb, rr = reader(w_a), reader(w_b), reader(r_all)
    try:
        assert rr.signature("shared").count == 2  # event 0 of each cluster
        # A role that reads only is refused, from the API and the command, and nothing changes.
        with pytest.raises(PermissionError, match=f"role r_all_{db} may not resolve.*reads only"):
            rr.resolve("shared", note="no", by="mallory")
        done = cli("report", "--store", r_all, "--resolve", "shared", cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done
        assert "reads only" in done.stderr and "Traceback" not in done.stderr
        assert rr.signature("shared").resolved_at == 0.0
        # Cluster a's writer resolves it: every role sees it resolved.
        row, changed = ra.resolve("shared", note="fixed", by="alice", at=T0 + 100)
        assert changed and row.state == "resolved"
        assert [r.signature("shared").resolved_by for r in (rb, rr)] == ["alice", "alice"]
        # A death of cluster b after it: regressed, found by b's shipper.
        d, events = death(1, "b", T0 + 200)
        assert b.spool.record(d, events, grouping_version=2) and b.sync(60)
        row = rr.signature("shared")
        assert (row.state, row.regressed_at, row.regressions) == ("regressed", T0 + 200, 1)
        assert (b.deaths.regressions, a.deaths.regressions) == (1, 0)
        # Resolved again; both clusters' deaths arrive at once: one regression.
        ra.resolve("shared", at=T0 + 300)
        for n, (shipper, cluster) in enumerate(((a, "a"), (b, "b"))):
            d, events = death(10 + n, cluster, T0 + 400 + n)
            assert shipper.spool.record(d, events, grouping_version=2)
        threads = [threading.Thread(target=s.sync, args=(60,)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert a.sync(60) and b.sync(60)
        row = rr.signature("shared")
        assert (row.state, row.regressions) == ("regressed", 2)
        assert row.regressed_at in (T0 + 400, T0 + 401)
        assert a.deaths.regressions + b.deaths.regressions == 2
    finally:
        for r in (ra, rb, rr):
            r.close()
        stop(a)
        stop(b)


def test_roles_granted_before_the_migration_reach_the_new_table(pg_url):
    """A history at schema 3, a writer and a reader granted then (as `grant` did), then the
    migration of issue 40: the writer adds old ids, the reader reads them."""
    db = pg_url.rsplit("/", 1)[1]
    writer, watcher = f"old_w_{db}", f"old_r_{db}"
    with pg_connect(pg_url) as owner:
        migrate(owner, pg_url, MIGRATIONS[:3])
        with owner.transaction(), owner.cursor() as cur:
            for role, writes in ((writer, True), (watcher, False)):
                cur.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
                cur.execute(f"GRANT CONNECT ON DATABASE {db} TO {role}")
                cur.execute(f"GRANT USAGE ON SCHEMA oomguard TO {role}")
                cur.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA oomguard TO {role}")
                if writes:
                    cur.execute(
                        f"GRANT INSERT, UPDATE, DELETE ON signatures, signature_members,"
                        f" signature_fields, events, deaths TO {role}"
                    )
                cur.execute(
                    "INSERT INTO cluster_roles (role, cluster, writes) VALUES (%s, 'a', %s)",
                    (role, writes),
                )
        assert migrate(owner, pg_url) == len(MIGRATIONS)
    with pg_connect(as_role(pg_url, writer, f"pw-{writer}")) as conn:
        conn.execute("INSERT INTO signature_aliases VALUES ('old', 'new', 2, 3, %s)", (T0,))
        conn.commit()
    with pg_connect(as_role(pg_url, watcher, f"pw-{watcher}")) as conn:
        assert conn.execute("SELECT new_id FROM signature_aliases").fetchall() == [("new",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO signature_aliases VALUES ('x', 'y', 2, 3, 0)")
