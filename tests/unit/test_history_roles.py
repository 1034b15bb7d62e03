"""Per-cluster roles on a real PostgreSQL history (tests/pg_lab.py, issue 39):
`oomguard history grant` makes a login per cluster that adds and amends its own cluster's
rows and no other's (row-level security), and read-only ones for `oomguard report`. What
each role reads is stated in docs/history.md ("Who can read what") and checked here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import psycopg
import pytest

from oomguard import FailureEvent, PipelineStatus
from oomguard._death.record import Death, Role, Task
from oomguard._store import FailureStore
from oomguard._store.pg import Shipper, pg_connect

T0 = 1_790_000_000.0
ADMIN_SECRET = "lab-secret"  # pg_lab's owner role


def ev(n: int, cluster: str, **kw) -> FailureEvent:
    fields = dict(
        kind="infra",
        cause="oom_kill",
        shard=f"{cluster}-s{n}",
        pipeline=f"etl-{cluster}",
        worker="tcp://10.0.0.1:4000",
        host=f"host-{cluster}",
        signature_id="shared" if n == 0 else f"{cluster}-{n % 3}",
        signature_title="MemoryError in parse",
        evidence={"n": n},
        time=T0 + n,
        cluster=cluster,
    )
    fields.update(kw)
    return FailureEvent(**fields)


def cli(*argv: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "oomguard._cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def as_role(admin_url: str, role: str, password: str) -> str:
    return admin_url.replace(f"oomguard:{ADMIN_SECRET}@", f"{role}:{password}@")


def grant(admin_url: str, tmp_path, role: str, *clusters: str, read_only: bool = False) -> str:
    """`oomguard history grant` in a process, as a user runs it; the role's URL."""
    password = f"pw-{role}-S3cret"
    pwfile = tmp_path / f"{role}.pw"
    pwfile.write_text(password + "\n")
    argv = ["history", "grant", "--store", admin_url, "--role", role]
    argv += [a for c in clusters for a in ("--cluster", c)]
    argv += ["--password-file", str(pwfile)] + (["--read-only"] if read_only else [])
    proc = cli(*argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert password not in said and ADMIN_SECRET not in said, said
    assert f"connect as: postgresql://{role}@127.0.0.1:" in said
    return as_role(admin_url, role, password)


def ship(tmp_path, url: str, cluster: str, n: int) -> Shipper:
    """A scheduler's spool and shipper for `cluster`, sending as the role of `url`."""
    spool = FailureStore(str(tmp_path / f"{cluster}.sqlite3"), batch_interval=0.01)
    spool.start()
    shipper = Shipper(spool, url, cluster)
    shipper.start()
    for i in range(n):
        assert spool.add(ev(i, cluster))
    spool.upsert_pipeline(
        PipelineStatus(f"etl-{cluster}", "running", 1, 0, 0, 0, 0, "", started=T0, cluster=cluster)
    )
    assert shipper.sync(60)
    return shipper


def stop(shipper: Shipper) -> None:
    shipper.close()
    shipper.spool.close()


def count(cur, sql: str, *args) -> int:
    cur.execute(sql, args)
    return cur.rowcount


def test_two_clusters_with_their_own_roles(pg_url, tmp_path):
    db = pg_url.rsplit("/", 1)[1]
    w_a = grant(pg_url, tmp_path, f"w_a_{db}", "a")
    w_b = grant(pg_url, tmp_path, f"w_b_{db}", "b")
    r_a = grant(pg_url, tmp_path, f"r_a_{db}", "a", read_only=True)
    r_all = grant(pg_url, tmp_path, f"r_all_{db}", read_only=True)
    a, b = ship(tmp_path, w_a, "a", 30), ship(tmp_path, w_b, "b", 20)
    try:
        # Amends of its own rows work under row-level security (the worker_lost case): a
        # death lost without a report, then amended by its id when the report came late.
        task = Task("a-s99", "a", role=Role.CULPRIT, pipeline="etl-a")
        lost = Death(
            id="d99",
            cluster="a",
            worker="tcp://10.0.0.1:4000",
            host="host-a",
            time=T0 + 99,
            cause="worker_lost",
            tasks=(task,),
            signature_id="lost",
            signature_title="lost",
        )
        event = ev(99, "a", cause="worker_lost", signature_id="lost", death="d99")
        a.spool.record(lost, [event], grouping_version=2, example="")
        assert a.sync(60)
        found = dataclasses.replace(lost, cause="oom_kill", signature_id="a-0")
        event = ev(99, "a", signature_id="a-0", death="d99")
        a.spool.record(found, [event], grouping_version=2, example="", amend=True)
        assert a.sync(60)
    finally:
        stop(a)
        stop(b)
    with pg_connect(pg_url) as admin:  # the owner sees both clusters, all arrived
        by_cluster = dict(admin.execute("SELECT cluster, count(*) FROM events GROUP BY 1"))
        assert by_cluster == {"a": 31, "b": 20}
        assert admin.execute("SELECT count FROM signatures WHERE id = 'lost'").fetchone() == (0,)
        assert admin.execute("SELECT cluster, cause FROM deaths").fetchall() == [("a", "oom_kill")]
    # What a writer reads: its cluster's events, runs and rows set aside; every signature.
    with pg_connect(w_a) as conn, conn.cursor() as cur:
        assert cur.execute("SELECT DISTINCT cluster FROM events").fetchall() == [("a",)]
        assert cur.execute("SELECT DISTINCT cluster FROM pipelines").fetchall() == [("a",)]
        shared = cur.execute("SELECT count FROM signatures WHERE id = 'shared'").fetchone()
        assert shared == (2,)  # one death on each cluster: the signature spans both
        members = cur.execute(
            "SELECT value FROM signature_members WHERE signature_id = 'shared' AND field = 0"
        ).fetchall()
        assert sorted(members) == [("host-a",), ("host-b",)]  # shared lists: stated in docs
        # ... and cannot read-modify or delete another cluster's rows.
        assert count(cur, "UPDATE events SET cause = 'x' WHERE cluster = 'b'") == 0
        assert count(cur, "DELETE FROM events WHERE cluster = 'b'") == 0
        assert count(cur, "UPDATE pipelines SET status = 'x' WHERE cluster = 'b'") == 0
        assert count(cur, "DELETE FROM pipelines WHERE cluster = 'b'") == 0
        assert cur.execute("SELECT DISTINCT cluster FROM deaths").fetchall() == [("a",)]
        assert count(cur, "UPDATE events SET cause = 'sigkill' WHERE local_id = 1") == 1  # own
        conn.commit()
        for forged in (
            "INSERT INTO events (origin, local_id, cluster, time, kind, cause, shard, pipeline,"
            " worker, host, signature_id, signature_title, evidence, attempt, grouping_version,"
            " killer, killer_how, killer_confidence, killer_summary) VALUES ('x', 1, 'b', 1,"
            " 'infra', 'oom_kill', 's', 'p', 'w', 'h', 'sig', 't', '{}', 1, 1, '', '', '', '')",
            "UPDATE events SET cluster = 'b' WHERE cluster = 'a'",
            "INSERT INTO pipelines VALUES ('b', 'forged', 1, 'running', 0, 0, 0, 0, 0, '', '', 1)",
            "UPDATE pipelines SET cluster = 'b'",
            "UPDATE deaths SET cluster = 'b'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                cur.execute(forged)
            conn.rollback()
    # Read-only roles read and write nothing.
    with pg_connect(r_a) as conn, conn.cursor() as cur:
        assert cur.execute("SELECT DISTINCT cluster FROM events").fetchall() == [("a",)]
        assert cur.execute("SELECT count(*) FROM signatures").fetchone()[0] > 0
        for statement in ("DELETE FROM events", "UPDATE signatures SET count = 0"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                cur.execute(statement)
            conn.rollback()
    with pg_connect(w_b) as conn, conn.cursor() as cur:  # a's death is out of b's reach
        assert cur.execute("SELECT count(*) FROM deaths").fetchone() == (0,)
        assert count(cur, "DELETE FROM deaths") == 0
        conn.commit()
    with pg_connect(r_all) as conn:
        clusters = conn.execute("SELECT DISTINCT cluster FROM events ORDER BY 1")
        assert clusters.fetchall() == [("a",), ("b",)]
    with pg_connect(pg_url) as admin:  # b's rows are as b's scheduler left them
        assert admin.execute(
            "SELECT count(*), min(cause), max(cause) FROM events WHERE cluster = 'b'"
        ).fetchone() == (20, "oom_kill", "oom_kill")
        assert admin.execute("SELECT status FROM pipelines WHERE cluster = 'b'").fetchall() == [
            ("running",)
        ]
    # `oomguard report` as the read-only role: its cluster's events, no password shown.
    report = cli("report", "--store", r_a, "--events", "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "a-s1" in report.stdout and "b-s1" not in report.stdout
    assert "S3cret" not in report.stdout + report.stderr
    doctor = cli("doctor", "--store", w_a, cwd=tmp_path)
    assert f"ok    role       w_a_{db} writes cluster 'a' and reads the rows of 'a' only" in (
        doctor.stdout
    ), doctor.stdout
    assert "S3cret" not in doctor.stdout


def test_a_writer_cannot_send_another_clusters_rows(pg_url, tmp_path, caplog):
    """A scheduler given the wrong cluster's role: its events are refused, kept in its
    spool and said, never set aside as if PostgreSQL could not hold them."""
    db = pg_url.rsplit("/", 1)[1]
    w_a = grant(pg_url, tmp_path, f"w_only_a_{db}", "a")
    spool = FailureStore(str(tmp_path / "b.sqlite3"), batch_interval=0.01)
    spool.start()
    shipper = Shipper(spool, w_a, "b")
    shipper.start()
    try:
        spool.add(ev(1, "b"))
        assert not shipper.sync(timeout=3)
        assert shipper.up is False and "row-level security" in shipper.last_error
        assert shipper.aside.total == 0 and shipper.backlog == 1
    finally:
        shipper.close()
        spool.close()
    with pg_connect(pg_url) as admin:
        assert admin.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_grant_refuses_what_row_level_security_cannot_hold(pg_url, tmp_path):
    pwfile = tmp_path / "pw"
    pwfile.write_text("x-S3cret\n")
    base = ["history", "grant", "--store", pg_url, "--password-file", str(pwfile)]
    owner = cli(*base, "--role", "oomguard", "--cluster", "a", cwd=tmp_path)
    assert owner.returncode == 2 and "superuser or BYPASSRLS" in owner.stderr
    two = cli(*base, "--role", "w_two", "--cluster", "a", "--cluster", "b", cwd=tmp_path)
    assert two.returncode == 2 and "exactly one cluster" in two.stderr
    bad = cli(*base, "--role", "Robert'); DROP", "--cluster", "a", cwd=tmp_path)
    assert bad.returncode == 2 and "--role" in bad.stderr
    for proc in (owner, two, bad):
        assert "S3cret" not in proc.stdout + proc.stderr
        assert ADMIN_SECRET not in proc.stdout + proc.stderr
