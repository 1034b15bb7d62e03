"""The workers' environments in a real PostgreSQL history (issue 40, schema version 4): a
cluster's role granted before the migration writes its workers after it (the migration
grants the new table to the roles there are), reads only its own clusters' workers, and a
history that refuses them is said once while everything else still goes through."""

from __future__ import annotations

import logging

from oomguard import FailureEvent
from oomguard._death.record import Environment
from oomguard._store import FailureStore
from oomguard._store.pg import Shipper, pg_connect, roles
from oomguard._store.pg.schema import CLUSTER_TABLES, MIGRATIONS, migrate

ADMIN_SECRET = "lab-secret"  # pg_lab's owner role
T0 = 1_790_000_000.0


def role_url(admin_url: str, role: str, password: str) -> str:
    return admin_url.replace(f"oomguard:{ADMIN_SECRET}@", f"{role}:{password}@")


def grant(admin_url: str, role: str, cluster: str, *, before_4=None) -> str:
    """`oomguard history grant` of a writer for `cluster`; `before_4` (a monkeypatch): as an
    oomguard from before schema version 4 granted it (its migrations, its tables)."""
    password = f"pw-{role}"
    with pg_connect(admin_url) as conn:
        if before_4 is None:
            roles.grant(conn, admin_url, role, password, [cluster])
        else:
            with before_4.context() as m:
                m.setattr(roles, "migrate", lambda c, url: migrate(c, url, MIGRATIONS[:3]))
                m.setattr(roles, "CLUSTER_TABLES", CLUSTER_TABLES[:-1])
                m.setattr(roles, "SHARED_TABLES", roles.SHARED_TABLES[:3])  # aliases: 5, sites: 6
                roles.grant(conn, admin_url, role, password, [cluster])
    return role_url(admin_url, role, password)


def spool_with_workers(tmp_path, url: str, cluster: str, n: int = 3) -> Shipper:
    spool = FailureStore(str(tmp_path / f"{cluster}.sqlite3"), batch_interval=0.01)
    spool.start()
    shipper = Shipper(spool, url, cluster)
    shipper.start()
    for i in range(n):
        env = Environment(python="3.11.9", labels={"NODE_POOL": "spot" if i else "od"})
        assert spool.worker_environment(cluster, f"tcp://10.0.0.{i}:40000", env, T0 + i)
    event = FailureEvent("infra", "oom_kill", "s", "etl", "w", "h", "sig", "t", {}, 1, T0,
                         cluster=cluster)  # fmt: skip
    assert spool.add(event)
    assert shipper.sync(60)
    return shipper


def stop(shipper: Shipper) -> None:
    shipper.close()
    shipper.spool.close()


def test_a_role_granted_before_the_migration_writes_and_reads_its_own_workers(
    pg_url, tmp_path, monkeypatch
):
    db = pg_url.rsplit("/", 1)[1]
    old = grant(pg_url, f"old_{db}", "a", before_4=monkeypatch)
    with pg_connect(pg_url) as admin:
        assert admin.execute("SELECT version FROM schema_version").fetchone() == (3,)
        migrate(admin, pg_url)  # the owner's scheduler, upgraded
        assert admin.execute("SELECT version FROM schema_version").fetchone() == (len(MIGRATIONS),)
    new = grant(pg_url, f"new_{db}", "b")
    a, b = spool_with_workers(tmp_path, old, "a"), spool_with_workers(tmp_path, new, "b", 2)
    try:
        assert (a.environments.refused, b.environments.refused) == ("", "")
        assert (a.environments.sent, b.environments.sent) == (3, 2)
    finally:
        stop(a)
        stop(b)
    with pg_connect(pg_url) as admin:
        rows = admin.execute("SELECT cluster, count(*) FROM worker_environments GROUP BY 1")
        assert dict(rows.fetchall()) == {"a": 3, "b": 2}
    with pg_connect(old) as conn:  # row-level security: its own cluster's workers only
        rows = conn.execute("SELECT DISTINCT cluster FROM worker_environments").fetchall()
        assert rows == [("a",)]


def test_a_history_that_refuses_the_workers_is_said_once_and_the_rest_goes_through(
    pg_url, tmp_path, caplog
):
    db = pg_url.rsplit("/", 1)[1]
    url = grant(pg_url, f"w_{db}", "a")
    with pg_connect(pg_url) as admin:
        admin.execute(f"REVOKE INSERT, UPDATE ON worker_environments FROM w_{db}")
        admin.commit()
    with caplog.at_level(logging.WARNING, "oomguard.store"):
        shipper = spool_with_workers(tmp_path, url, "a")
        try:
            assert "permission denied" in shipper.environments.refused
            assert shipper.environments.sent == 0
        finally:
            stop(shipper)
    said = [r.getMessage() for r in caplog.records if "environments" in r.getMessage()]
    assert len(said) == 1 and "oomguard history grant" in said[0], said
    with pg_connect(pg_url) as admin:
        assert admin.execute("SELECT count(*) FROM events").fetchone() == (1,)
        assert admin.execute("SELECT count(*) FROM worker_environments").fetchone() == (0,)
