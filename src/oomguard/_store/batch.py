"""One transaction of the store's writer: a batch of queued items (see `items`) inserted,
with the death, signature, member and retention updates done by SQLite."""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from . import aliases as _aliases
from . import deaths as _deaths
from . import environments as _environments
from . import states as _states
from .items import DEATH_ROW, ROW
from .links import SQLITE_FORGET, link_sqlite
from .schema import PIPELINE_COLUMNS


class _MultiRow:
    """An INSERT of many rows per statement: each sqlite3 step releases and retakes the
    GIL, so 10,000 single-row steps would fight the event loop's thread 10,000 times."""

    def __init__(self, head: str, columns: int, tail: str = "") -> None:
        # 999: the oldest SQLITE_MAX_VARIABLE_NUMBER still shipped (before SQLite 3.32).
        self.rows = max(1, min(100, 999 // columns))
        one = "(" + ", ".join("?" * columns) + ")"
        self.single = f"{head} {one}{tail}"
        self.many = f"{head} {', '.join([one] * self.rows)}{tail}"


def _insert(conn: sqlite3.Connection, stmt: _MultiRow, rows: list[tuple]) -> None:
    n = stmt.rows
    full = len(rows) - len(rows) % n
    for i in range(0, full, n):
        conn.execute(stmt.many, [v for row in rows[i : i + n] for v in row])
    if full < len(rows):
        conn.executemany(stmt.single, rows[full:])


_INSERT_EVENT = _MultiRow(
    "INSERT INTO events (time, kind, cause, shard, pipeline, worker, host, signature_id,"
    " signature_title, evidence, attempt, grouping_version, killer, killer_how,"
    " killer_confidence, killer_summary, cluster, death) VALUES",
    ROW,
)
# A death already stored under its (cluster, id) is not inserted again (`BatchDeaths`).
_INSERT_DEATH = _MultiRow(_deaths.INSERT_DEATH, DEATH_ROW, " ON CONFLICT (cluster, id) DO NOTHING")
# What a batch adds to its signatures: each death once (with seq > :dlast; its events name
# it and count nothing), each event that has no death once (id > :last: task exceptions,
# and events stored without a death). k orders them: the latest event (else death) gives
# the title and grouping version. NOT INDEXED: a rowid range scan, not a full index scan.
# An old id counts in the signature it is an alias of (`aliases.py`).
_SIGHTINGS = f"""WITH r AS (
    SELECT signature_id, signature_title, grouping_version, time, id AS k, death = '' AS n
    FROM events NOT INDEXED WHERE id > :last
    UNION ALL
    SELECT signature_id, signature_title, grouping_version, time, -seq, 1
    FROM deaths WHERE seq > :dlast), s AS (
    SELECT {_aliases.CANONICAL.format("r.signature_id")} AS signature_id, signature_title,
        grouping_version, time, k, n FROM r)"""
# ("WHERE true" tells the parser that ON CONFLICT is not part of the join.)
_UPSERT_SIGNATURES = f"""{_SIGHTINGS}
    INSERT INTO signatures (id, title, grouping_version, count, first_seen, last_seen, example)
    SELECT s.signature_id, s.signature_title, s.grouping_version, g.n, g.t0, g.t1, ''
    FROM (SELECT signature_id, sum(n) AS n, min(time) AS t0, max(time) AS t1,
                 max(k) AS latest
          FROM s GROUP BY signature_id) AS g
    JOIN s ON s.signature_id = g.signature_id AND s.k = g.latest
    WHERE true
    ON CONFLICT (id) DO UPDATE SET
        count = count + excluded.count,
        first_seen = min(first_seen, excluded.first_seen),
        last_seen = max(last_seen, excluded.last_seen),
        title = CASE WHEN excluded.grouping_version >= grouping_version THEN excluded.title
                     ELSE title END,
        grouping_version = max(grouping_version, excluded.grouping_version)
"""
# The signatures of the batch that have no row yet: the count to add.
_NEW_SIGNATURES = f"""{_SIGHTINGS} SELECT count(DISTINCT signature_id) FROM s
    WHERE signature_id NOT IN (SELECT id FROM signatures)"""
_OLDEST_SIGNATURES = "SELECT id FROM signatures ORDER BY last_seen, id LIMIT ?"
_SET_EXAMPLE = "UPDATE signatures SET example = ? WHERE id = ? AND example = ''"
# Per batch, the members of the events with id > ? that are not stored yet go through the
# writer's temp.batch_members (then emptied): each field's first `:rows` are stored, the
# rest only counted. In key order, so the B-tree cursor walks forward; an empty string
# means "unknown".
_MEMBERS = (
    *(
        f"INSERT INTO temp.batch_members (signature_id, field, value)"
        f" SELECT DISTINCT {_aliases.CANONICAL.format('signature_id')}, {code}, {column}"
        " FROM events NOT INDEXED"
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
    deaths: int  # deaths in the file
    signatures: int  # signature rows in the file
    member_rows: int
    max_pipelines: int
    max_events: int  # events, and deaths, kept at most
    max_signatures: int
    ships: bool = False  # a spool: deletions of events are recorded for the history


class Counts(NamedTuple):
    """What is in the file after a commit, and the events it wrote."""

    events: int
    deaths: int
    signatures: int
    written: int
    regressed: int = 0  # signatures found regressed (a sighting after their resolve)


class ShipMark(NamedTuple):
    """What a spool's shipper has in the history: the events up to id `sent`, these
    deletions (seq, event id), these pipeline runs (cluster, name, started, updated) and
    the deaths up to seq `deaths` (0: not moved)."""

    sent: int
    deletes: list[tuple]
    runs: list[tuple]
    deaths: int = 0

    def merge(self, newer: ShipMark | None) -> ShipMark:
        if newer is None:
            return self
        return ShipMark(
            max(self.sent, newer.sent),
            self.deletes + newer.deletes,
            self.runs + newer.runs,
            max(self.deaths, newer.deaths),
        )


def apply_mark(conn: sqlite3.Connection, mark: ShipMark) -> None:
    """Move a spool's marks past what was shipped, inside the caller's transaction. A run
    updated since it was sent keeps `shipped = 0`: its `updated` no longer matches."""
    if mark.sent:  # 0: a mark of deaths only
        conn.execute("INSERT OR REPLACE INTO ship_state VALUES ('sent', ?)", (str(mark.sent),))
    if mark.deaths:
        conn.execute(
            "INSERT OR REPLACE INTO ship_state VALUES ('deaths_sent', ?)", (str(mark.deaths),)
        )
    # By (seq, event id): a seq is reused once its row is gone, an event id never.
    conn.executemany("DELETE FROM ship_deletes WHERE seq = ? AND event_id = ?", mark.deletes)
    conn.executemany(
        "UPDATE pipelines SET shipped = 1"
        " WHERE cluster = ? AND name = ? AND started = ? AND updated = ?",
        mark.runs,
    )


def commit_batch(
    conn: sqlite3.Connection, items: list[tuple], limits: Limits, mark: ShipMark | None = None
) -> Counts:
    """Commit `items` in one transaction; raises, rolled back, when it fails. `mark`: the
    shipper's, moved in the same transaction (see pg/ship.py).

    Retention, in the same transaction: past `max_pipelines` runs the least recently updated
    finished ones go; past `max_events` the oldest events, and the oldest deaths; past
    `max_signatures` the least recently seen signatures with their members (their events
    stay, until max-events).
    """
    events: list[tuple] = []
    pipelines: list[tuple] = []
    deaths = _deaths.BatchDeaths()
    examples: dict[str, str] = {}
    environments: list[tuple] = []
    aliases: list[tuple] = []
    for item in items:  # as little Python per item as possible: it holds the GIL
        n = len(item)
        if n == ROW:
            events.append(item)
        elif n == ROW + 1:  # an event with an example trace (see event_item)
            events.append(item[:ROW])
            examples.setdefault(item[7], item[ROW])
        elif n == 4:  # a death with its events (see death_item)
            deaths.take(item, events, examples)
        elif n == 2:  # tagged: a worker's environment (environments.item) or old ids
            if item[0] == _environments.ITEM:
                environments.append(item[1])
            else:  # of signatures (aliases.alias_item)
                aliases += item[1]
        else:
            pipelines.append(item[0])
    count, dead = limits.events, limits.deaths
    signatures = limits.signatures
    regressed = 0
    try:
        conn.execute("BEGIN IMMEDIATE")
        if mark is not None:
            apply_mark(conn, mark)
        # The single writer: every id above `last` (seq above `dlast`) is of this batch.
        # The death, signature and member updates are computed from them by SQLite, which
        # does the work without holding the GIL (the event loop's thread needs it).
        last = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
        dlast = conn.execute("SELECT coalesce(max(seq), 0) FROM deaths").fetchone()[0]
        if deaths.replace:
            gone, went = _deaths.replace_stored(conn, deaths.replace, limits.ships)
            count -= gone
            dead -= went
        if deaths.rows:
            _insert(conn, _INSERT_DEATH, list(deaths.rows.values()))
            repeats = deaths.repeats(conn, dlast)
            dead += len(deaths.rows) - len(repeats)
            events = deaths.keep(events, repeats)
            _deaths.insert_tasks(conn, dlast)
            link_sqlite(conn, dlast)  # related signatures: by crash site, by incident
        _insert(conn, _INSERT_EVENT, events)
        count += len(events)
        if events or deaths.rows:
            at = {"last": last, "dlast": dlast}
            signatures += conn.execute(_NEW_SIGNATURES, at).fetchone()[0]
            conn.execute(_UPSERT_SIGNATURES, at)
            conn.executemany(_SET_EXAMPLE, [(ex, sid) for sid, ex in examples.items()])
            members = {"last": last, "rows": limits.member_rows}
            for statement in _MEMBERS:
                conn.execute(statement, members)
        if deaths.rows:
            _environments.first(conn, dlast)
        _environments.write(conn, environments)
        if aliases:  # after the signatures: a fold finds both rows
            regressed += _aliases.record(conn.execute, "?", aliases, distinct=True)
            signatures = conn.execute("SELECT count(*) FROM signatures").fetchone()[0]
        if events or deaths.rows:
            regressed += _states.regress(conn, _SIGHTINGS, {"last": last, "dlast": dlast})
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
        if dead > limits.max_events:
            dead -= _deaths.forget_oldest(conn, dead - limits.max_events)
        if signatures > limits.max_signatures:
            signatures -= _forget_signatures(conn, signatures - limits.max_signatures)
        conn.execute("COMMIT")
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise
    return Counts(count, dead, signatures, len(events), regressed)


def _forget_signatures(conn: sqlite3.Connection, n: int) -> int:
    """Delete the `n` least recently seen signatures with their members; how many went.
    Their events stay (until max-events takes them): a signature seen again starts a new
    row, counted from then."""
    ids = conn.execute(_OLDEST_SIGNATURES, (n,)).fetchall()
    conn.executemany("DELETE FROM signatures WHERE id = ?", ids)
    conn.executemany("DELETE FROM signature_members WHERE signature_id = ?", ids)
    conn.executemany("DELETE FROM signature_distinct WHERE signature_id = ?", ids)
    conn.executemany("DELETE FROM signature_aliases WHERE new_id = ?", ids)
    for statement in SQLITE_FORGET:  # its sites, and its links both ways
        conn.executemany(statement, ids)
    return len(ids)


def disk_full(e: sqlite3.Error) -> bool:
    # SQLite maps ENOSPC to SQLITE_FULL; growing the WAL index (-shm) fails as SHMSIZE.
    code = getattr(e, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_FULL, getattr(sqlite3, "SQLITE_IOERR_SHMSIZE", -1)) or (
        "disk is full" in str(e)
    )
