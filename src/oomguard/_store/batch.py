"""One transaction of the store's writer: a batch of queued items (see `items`) inserted,
with the signature, member and retention updates done by SQLite."""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from .items import CLUSTER, ROW
from .schema import PIPELINE_COLUMNS


class _MultiRow:
    """An INSERT of many rows per statement: each sqlite3 step releases and retakes the
    GIL, so 10,000 single-row steps would fight the event loop's thread 10,000 times."""

    def __init__(self, head: str, columns: int) -> None:
        # 999: the oldest SQLITE_MAX_VARIABLE_NUMBER still shipped (before SQLite 3.32).
        self.rows = max(1, min(100, 999 // columns))
        one = "(" + ", ".join("?" * columns) + ")"
        self.single = f"{head} {one}"
        self.many = f"{head} {', '.join([one] * self.rows)}"


def _insert(conn: sqlite3.Connection, stmt: _MultiRow, rows: list[tuple]) -> None:
    n = stmt.rows
    full = len(rows) - len(rows) % n
    for i in range(0, full, n):
        conn.execute(stmt.many, [v for row in rows[i : i + n] for v in row])
    if full < len(rows):
        conn.executemany(stmt.single, rows[full:])


# A worker's address is only unique within its cluster: the amend's cluster narrows them.
_LOST_EVENTS = (
    "SELECT id, signature_id FROM events WHERE worker = :worker AND cluster = :cluster"
    " AND cause = 'worker_lost' AND time = (SELECT max(time) FROM events"
    " WHERE worker = :worker AND cluster = :cluster AND cause = 'worker_lost')"
)
_LOST_EVENTS_AT = (
    "SELECT id, signature_id FROM events WHERE worker = :worker AND cluster = :cluster"
    " AND cause = 'worker_lost' AND time = :time"
)
_INSERT_EVENT = _MultiRow(
    "INSERT INTO events (time, kind, cause, shard, pipeline, worker, host, signature_id,"
    " signature_title, evidence, attempt, grouping_version, killer, killer_how,"
    " killer_confidence, killer_summary, cluster) VALUES",
    ROW,
)
# Per batch: one row per signature of the events with id > ?; title and grouping version
# from the batch's latest event. NOT INDEXED: a rowid range scan, not a full index scan.
# ("WHERE true" tells the parser that ON CONFLICT is not part of the join.)
_UPSERT_SIGNATURES = """
    INSERT INTO signatures (id, title, grouping_version, count, first_seen, last_seen, example)
    SELECT e.signature_id, e.signature_title, e.grouping_version, g.n, g.t0, g.t1, ''
    FROM (SELECT signature_id, count(*) AS n, min(time) AS t0, max(time) AS t1,
                 max(id) AS latest
          FROM events NOT INDEXED WHERE id > ? GROUP BY signature_id) AS g
    JOIN events AS e ON e.id = g.latest
    WHERE true
    ON CONFLICT (id) DO UPDATE SET
        count = count + excluded.count,
        first_seen = min(first_seen, excluded.first_seen),
        last_seen = max(last_seen, excluded.last_seen),
        title = excluded.title,
        grouping_version = excluded.grouping_version
"""
# The signatures of the events with id > ? that have no row yet: the count to add.
_NEW_SIGNATURES = """SELECT count(DISTINCT signature_id) FROM events NOT INDEXED
    WHERE id > ? AND signature_id NOT IN (SELECT id FROM signatures)"""
_OLDEST_SIGNATURES = "SELECT id FROM signatures ORDER BY last_seen, id LIMIT ?"
_SET_EXAMPLE = "UPDATE signatures SET example = ? WHERE id = ? AND example = ''"
# Per batch, the members of the events with id > ? that are not stored yet go through the
# writer's temp.batch_members (then emptied): each field's first `:rows` are stored, the
# rest only counted. In key order, so the B-tree cursor walks forward; an empty string
# means "unknown".
_MEMBERS = (
    *(
        f"INSERT INTO temp.batch_members (signature_id, field, value)"
        f" SELECT DISTINCT signature_id, {code}, {column} FROM events NOT INDEXED"
        f" WHERE id > :last AND {column} <> '' ORDER BY 1, 3"
        for code, column in enumerate(("host", "worker", "shard", "pipeline", "cause", "cluster"))
    ),
    """DELETE FROM temp.batch_members WHERE EXISTS (SELECT 1 FROM signature_members AS m
        WHERE m.signature_id = batch_members.signature_id AND m.field = batch_members.field
          AND m.value = batch_members.value)""",
    # Room for `:rows - stored` more rows per field; the smallest values of the batch take
    # it. Already in key order: the window walks temp.batch_members by its key.
    """INSERT INTO signature_members (signature_id, field, value)
    SELECT b.signature_id, b.field, b.value
    FROM (SELECT signature_id, field, value,
                 row_number() OVER (PARTITION BY signature_id, field ORDER BY value) AS k
          FROM temp.batch_members) AS b
    LEFT JOIN signature_distinct AS d ON d.signature_id = b.signature_id AND d.field = b.field
    WHERE b.k <= :rows - coalesce(d.stored, 0)""",
    # The stored rows and this batch's new values are all distinct and all real, so their
    # sum is a lower bound of the distinct values; it is the exact count as long as no
    # earlier batch had a value left unstored. (SET reads the values from before the update.)
    """INSERT INTO signature_distinct (signature_id, field, n, stored)
    SELECT signature_id, field, count(*), min(count(*), :rows) FROM temp.batch_members
    WHERE true GROUP BY signature_id, field
    ON CONFLICT (signature_id, field) DO UPDATE SET
        n = max(n, stored + excluded.n),
        stored = stored + max(0, min(excluded.n, :rows - stored))""",
    "DELETE FROM temp.batch_members",
)
CREATE_BATCH_MEMBERS = """CREATE TEMP TABLE batch_members (
    signature_id TEXT NOT NULL,
    field INTEGER NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (signature_id, field, value)
) WITHOUT ROWID"""
_UPSERT_PIPELINE = f"""
    INSERT INTO pipelines ({PIPELINE_COLUMNS}, updated)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (name, started, cluster) DO UPDATE SET
        status = excluded.status, shards_done = excluded.shards_done,
        shards_failed = excluded.shards_failed, shards_aborted = excluded.shards_aborted,
        infra_failures = excluded.infra_failures, user_failures = excluded.user_failures,
        summary = excluded.summary, abort_reason = excluded.abort_reason,
        updated = excluded.updated, shipped = 0
"""


class Limits(NamedTuple):
    """What a commit needs of its store: the counts before it, and the bounds."""

    events: int  # events in the file
    signatures: int  # signature rows in the file
    member_rows: int
    max_pipelines: int
    max_events: int
    max_signatures: int
    ships: bool = False  # a spool: deletions of events are recorded for the history


class ShipMark(NamedTuple):
    """What a spool's shipper has in the history: the events up to id `sent`, these
    deletions (seq, event id) and these pipeline runs (cluster, name, started, updated)."""

    sent: int
    deletes: list[tuple]
    runs: list[tuple]

    def merge(self, newer: ShipMark | None) -> ShipMark:
        if newer is None:
            return self
        return ShipMark(
            max(self.sent, newer.sent), self.deletes + newer.deletes, self.runs + newer.runs
        )


def apply_mark(conn: sqlite3.Connection, mark: ShipMark) -> None:
    """Move a spool's marks past what was shipped, inside the caller's transaction. A run
    updated since it was sent keeps `shipped = 0`: its `updated` no longer matches."""
    conn.execute("INSERT OR REPLACE INTO ship_state VALUES ('sent', ?)", (str(mark.sent),))
    # By (seq, event id): a seq is reused once its row is gone, an event id never.
    conn.executemany("DELETE FROM ship_deletes WHERE seq = ? AND event_id = ?", mark.deletes)
    conn.executemany(
        "UPDATE pipelines SET shipped = 1"
        " WHERE cluster = ? AND name = ? AND started = ? AND updated = ?",
        mark.runs,
    )


def commit_batch(
    conn: sqlite3.Connection, items: list[tuple], limits: Limits, mark: ShipMark | None = None
) -> tuple[int, int, int]:
    """Commit `items` in one transaction: (events, signatures) in the file after it, and
    the events written. Raises, rolled back, when it fails. `mark`: the shipper's, moved in
    the same transaction (see pg/ship.py).

    Retention, in the same transaction: past `max_pipelines` runs the least recently updated
    finished ones go; past `max_events` the oldest events; past `max_signatures` the least
    recently seen signatures with their members (their events stay, until max-events).
    """
    events: list[tuple] = []
    pipelines: list[tuple] = []
    amends: list[tuple] = []
    lost: set[tuple[str, str]] = set()  # (worker, cluster) with a worker_lost event here
    examples: dict[str, str] = {}
    for item in items:  # as little Python per item as possible: it holds the GIL
        n = len(item)
        if n == ROW:
            events.append(item)
            if item[2] == "worker_lost":
                lost.add((item[5], item[CLUSTER]))
        elif n == 3:  # ("amend", event item, lost_at)
            who = (item[1][5], item[1][CLUSTER])  # (worker, cluster)
            when = item[2]
            if who in lost:  # its worker_lost events may be in this very batch
                mine = [
                    e[0] for e in events if (e[5], e[CLUSTER]) == who and e[2] == "worker_lost"
                ]
                when = max(mine) if when is None else when
                if when in mine:
                    events = [
                        e
                        for e in events
                        if (e[5], e[CLUSTER]) != who or e[2] != "worker_lost" or e[0] != when
                    ]
                    when = None
            if when is not None or who not in lost:
                amends.append((*who, when))
            events.append(item[1][:ROW])
            if len(item[1]) == ROW + 1:
                examples.setdefault(item[1][7], item[1][ROW])
        elif n == ROW + 1:  # an event with an example trace (see event_item)
            events.append(item[:ROW])
            examples.setdefault(item[7], item[ROW])
        else:
            pipelines.append(item[0])
    count = limits.events + len(events)
    signatures = limits.signatures
    try:
        conn.execute("BEGIN IMMEDIATE")
        if mark is not None:
            apply_mark(conn, mark)
        # The single writer: every id above `last` is an event of this batch. The
        # signature and member updates are computed from them by SQLite, which does the
        # work without holding the GIL (the event loop's thread needs it).
        last = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
        for worker, cluster, lost_at in amends:
            # The death's worker_lost events go; the amended one is inserted below.
            who = {"worker": worker, "cluster": cluster, "time": lost_at}
            replaced = conn.execute(
                _LOST_EVENTS if lost_at is None else _LOST_EVENTS_AT, who
            ).fetchall()
            conn.executemany("DELETE FROM events WHERE id = ?", [(i,) for i, _ in replaced])
            if limits.ships:
                conn.executemany(
                    "INSERT INTO ship_deletes (event_id) VALUES (?)", [(i,) for i, _ in replaced]
                )
            conn.executemany(
                "UPDATE signatures SET count = count - 1 WHERE id = ?",
                [(sid,) for _, sid in replaced],
            )
            count -= len(replaced)
        _insert(conn, _INSERT_EVENT, events)
        if events:
            signatures += conn.execute(_NEW_SIGNATURES, (last,)).fetchone()[0]
            conn.execute(_UPSERT_SIGNATURES, (last,))
            conn.executemany(_SET_EXAMPLE, [(ex, sid) for sid, ex in examples.items()])
            members = {"last": last, "rows": limits.member_rows}
            for statement in _MEMBERS:
                conn.execute(statement, members)
        conn.executemany(_UPSERT_PIPELINE, pipelines)
        if pipelines:
            runs = conn.execute("SELECT count(*) FROM pipelines").fetchone()[0]
            if runs > limits.max_pipelines:
                # The oldest finished runs. Never a running one: pipeline(name) would
                # answer with an older run until the next update brought it back.
                conn.execute(
                    "DELETE FROM pipelines WHERE rowid IN (SELECT rowid FROM pipelines"
                    " WHERE status <> 'running' ORDER BY updated, rowid LIMIT ?)",
                    (runs - limits.max_pipelines,),
                )
        if count > limits.max_events:
            # Oldest first by id (insertion order); signature rows are never recounted.
            cur = conn.execute(
                "DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY id LIMIT ?)",
                (count - limits.max_events,),
            )
            count -= cur.rowcount
        if signatures > limits.max_signatures:
            signatures -= _forget_signatures(conn, signatures - limits.max_signatures)
        conn.execute("COMMIT")
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise
    return count, signatures, len(events)


def _forget_signatures(conn: sqlite3.Connection, n: int) -> int:
    """Delete the `n` least recently seen signatures with their members; how many went.
    Their events stay (until max-events takes them): a signature seen again starts a new
    row, counted from then."""
    ids = conn.execute(_OLDEST_SIGNATURES, (n,)).fetchall()
    conn.executemany("DELETE FROM signatures WHERE id = ?", ids)
    conn.executemany("DELETE FROM signature_members WHERE signature_id = ?", ids)
    conn.executemany("DELETE FROM signature_distinct WHERE signature_id = ?", ids)
    return len(ids)


def disk_full(e: sqlite3.Error) -> bool:
    # SQLite maps ENOSPC to SQLITE_FULL; growing the WAL index (-shm) fails as SHMSIZE.
    code = getattr(e, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_FULL, getattr(sqlite3, "SQLITE_IOERR_SHMSIZE", -1)) or (
        "disk is full" in str(e)
    )
