"""Nothing a client names poisons the PostgreSQL history, and no row it refuses stops the
others (issue 39), against a real server (tests/pg_lab.py): odd pipeline names and examples
arrive made safe, then every normal run arrives; a batch PostgreSQL refuses is split down to
the rows it refuses, which are set aside, counted, logged once, returned by `sync()` and
listed by `oomguard doctor --store`."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys

import pytest

from oomguard import FailureEvent, PipelineStatus
from oomguard._safe_text import NAME_BYTES
from oomguard._store import FailureStore
from oomguard._store.pg import Shipper, pg_connect
from oomguard._store.pg.aside import split

T0 = 1_790_000_000.0

#: Names any client can give a span or annotation: each broke a batch of the history.
ODD_NAMES = [
    "nul\x00in the name",
    "x" * 4000,  # past PostgreSQL's index-row limit (2,704 bytes)
    "é" * 2000,  # 4,000 bytes of UTF-8 in 2,000 characters
    "ctrl\x1b]0;title\x07\nnew line\r\t",
    "lone \udcff surrogate \ud800",
    "bidi \u202eevil\u202c",
]


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
        cluster="a",
    )
    fields.update(kw)
    return FailureEvent(**fields)


def run(name: str, started: float, **kw) -> PipelineStatus:
    fields = dict(
        name=name,
        status="succeeded",
        shards_done=3,
        shards_failed=0,
        shards_aborted=0,
        infra_failures=0,
        user_failures=0,
        summary="3 shards done",
        started=started,
        cluster="a",
    )
    fields.update(kw)
    return PipelineStatus(**fields)


def rows(url: str, sql: str, *args) -> list[tuple]:
    with pg_connect(url) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture
def spool(tmp_path):
    s = FailureStore(str(tmp_path / "spool.sqlite3"), batch_interval=0.01)
    s.start()
    yield s
    s.close()


def test_odd_names_and_examples_then_normal_runs_all_arrive(pg_url, spool):
    """Before: a span named with a NUL or 4,000 characters failed its batch for good, and
    every run queued after it never reached the history while sync() said True."""
    shipper = Shipper(spool, pg_url, "a", batch=50)
    shipper.start()
    try:
        for i, name in enumerate(ODD_NAMES):
            spool.upsert_pipeline(run(name, T0 + i, summary=f"odd {name}"))
            assert spool.add(ev(i, pipeline=name, shard=name), example=f"Traceback\n{name}\x00")
        for i in range(300):  # normal runs and events after them, several batches
            spool.upsert_pipeline(run(f"normal-{i}", T0 + 100 + i))
            assert spool.add(ev(100 + i, signature_id=f"n-{i % 5}"), example="ok\ntrace")
        done = shipper.sync(60)
        assert done and done.set_aside == ()
    finally:
        shipper.close()
    names = {r[0] for r in rows(pg_url, "SELECT name FROM pipelines")}
    assert {f"normal-{i}" for i in range(300)} <= names  # every normal run arrived
    assert len(names) == 300 + len(ODD_NAMES)  # and each odd one, made safe
    events = rows(pg_url, "SELECT pipeline, shard FROM events WHERE local_id <= %s", 6)
    for value in names | {v for e in events for v in e}:
        assert value.isprintable() and len(value.encode()) <= NAME_BYTES, value[:80]
    long = next(n for n in names if n.startswith("xxx"))
    assert long.startswith("x" * 900) and len(long.encode()) == NAME_BYTES  # prefix + hash
    assert rows(pg_url, "SELECT count(*) FROM events") == [(306,)]
    examples = [r[0] for r in rows(pg_url, "SELECT example FROM signatures")]
    assert all("\x00" not in e for e in examples) and any("\\x00" in e for e in examples)


def test_a_refused_batch_is_split_down_to_the_rows_refused(pg_url, spool, caplog, tmp_path):
    """Rows PostgreSQL cannot hold even after the door (an integer past its range; an older
    oomguard's spool holding a NUL): set aside, each once; every other row goes through."""
    for n in range(600):
        attempt = 2**40 if n in (17, 400, 401) else 1  # fits SQLite's integer, not PG's
        assert spool.add(ev(n, attempt=attempt, signature_id=f"sig-{n % 7}"))
    for i in range(120):
        spool.upsert_pipeline(run(f"r{i}", T0 + i, shards_done=2**40 if i in (5, 77) else 3))
    assert spool.flush()
    # What an older oomguard stored before names were made safe at the door.
    with sqlite3.connect(spool._file) as older:
        older.execute("UPDATE signatures SET example = ? WHERE id = 'sig-3'", ("nul\x00here",))
        older.execute(
            "INSERT INTO pipelines (name, status, shards_done, shards_failed, shards_aborted, "
            "infra_failures, user_failures, summary, abort_reason, started, cluster, updated)"
            " VALUES (?, 'running', 0, 0, 0, 0, 0, '', '', 1.0, 'a', 1.0)",
            ("old\x00run",),
        )
    older.close()
    shipper = Shipper(spool, pg_url, "a", batch=10_000)
    shipper.start()
    try:
        with caplog.at_level(logging.ERROR, logger="oomguard.store"):
            done = shipper.sync(60)
        assert done
        aside = sorted((a.kind, a.item) for a in done.set_aside)
        assert aside == [
            ("event", "18"),  # the spool's ids: one more than n
            ("event", "401"),
            ("event", "402"),
            ("example", "sig-3"),
            ("run", "old\\x00run@1.0"),
            ("run", f"r5@{T0 + 5!r}"),
            ("run", f"r77@{T0 + 77!r}"),
        ]
        assert all(a.reason and a.cluster == "a" for a in done.set_aside)
        assert shipper.aside.counts == {"event": 3, "run": 3, "example": 1, "delete": 0}
        lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
        assert len(lines) == 3, lines  # logged once per kind
        assert "out of range" in " ".join(lines) and "lab-secret" not in " ".join(lines)
        # Set aside for good: later rows go through, the refused ones are not sent again.
        spool.add(ev(1000))
        spool.upsert_pipeline(run("later", T0 + 1000))
        again = shipper.sync(60)
        assert again and again.set_aside == ()
    finally:
        shipper.close()
    assert rows(pg_url, "SELECT count(*) FROM events") == [(598,)]
    assert rows(pg_url, "SELECT sum(count) FROM signatures") == [(598,)]
    runs = {r[0] for r in rows(pg_url, "SELECT name FROM pipelines")}
    assert runs == {f"r{i}" for i in range(120)} - {"r5", "r77"} | {"later"}
    examples = dict(rows(pg_url, "SELECT id, example FROM signatures"))
    assert examples["sig-3"] == ""  # its example refused, its count kept
    table = rows(pg_url, "SELECT cluster, kind, item FROM set_aside ORDER BY kind, item")
    assert sorted((k, i) for _, k, i in table) == aside
    # The spool keeps them all: this cluster's own queries still show them.
    assert len(spool.events(limit=None)) == 601
    # `oomguard doctor --store` lists them, with the password nowhere.
    doctor = _cli("doctor", "--store", pg_url, cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stderr
    assert "7 row(s) PostgreSQL refused were set aside" in doctor.stdout
    assert "event 402 of cluster 'a'" in doctor.stdout and "lab-secret" not in doctor.stdout
    as_json = json.loads(_cli("doctor", "--store", pg_url, "--json", cwd=tmp_path).stdout)
    assert len(as_json["set_aside"]) == 7
    assert {c["name"]: c["status"] for c in as_json["checks"]} == {
        "history": "ok",
        "role": "warn",  # the lab's role owns the history: every cluster's rows
        "set-aside": "warn",
    }


def test_split_takes_every_row_but_the_refused_in_few_transactions():
    sent: list[list[int]] = []
    bad = {3, 700, 701, 999}

    def send(part):
        sent.append(list(part))
        if bad & set(part):
            raise ValueError("refused")

    refused = split(list(range(1000)), send, (ValueError,), lambda: None)
    assert sorted(r for r, _ in refused) == sorted(bad)
    taken = [r for part in sent if not bad & set(part) for r in part]
    assert sorted(taken) == sorted(set(range(1000)) - bad)  # each other row once
    assert len(sent) < 4 * 2 * 11  # O(k log n): not one transaction per row
    assert split([5], send, (ValueError,), lambda: None) == []
    assert [r for r, _ in split([3], send, (ValueError,), lambda: None)] == [3]


def _cli(*argv: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "oomguard._cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
