"""The deaths of the store: what one write batch does with them (`BatchDeaths`), the SQL that
stores, replaces and forgets them, and the `Death` read back from a row.

A death is stored once per (cluster, id). `record()` of a death already stored is a repeat
and is dropped with its events (the first account stands: nothing is counted twice); an
amend replaces the stored death and its events, in the same batch or an earlier one. Its
signature's count moves with it: one per death (see `batch._UPSERT_SIGNATURES`).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from .._death.record import Death
from .items import DEATH_COLUMNS

__all__ = [
    "BatchDeaths",
    "death_from_row",
    "forget_oldest",
    "insert_tasks",
    "replace_stored",
]

Key = tuple[str, str]  # (cluster, id)

INSERT_DEATH = f"INSERT INTO deaths ({DEATH_COLUMNS}) VALUES"
# A death's tasks, for the shard and pipeline filters: from the JSON just stored, by SQLite
# (no Python per task). OR IGNORE: a report that named a task twice still stores.
_INSERT_TASKS = """INSERT OR IGNORE INTO death_tasks (death, shard, pipeline, role)
    SELECT d.seq, coalesce(json_extract(t.value, '$.key'), ''),
           coalesce(json_extract(t.value, '$.pipeline'), ''),
           coalesce(json_extract(t.value, '$.role'), '')
    FROM deaths AS d, json_each(d.record, '$.tasks') AS t WHERE d.seq > ?"""
_STORED = "SELECT seq, signature_id FROM deaths WHERE cluster = ? AND id = ?"
# `death <> ''` repeated: what lets SQLite take the partial index events_death.
_ITS_EVENTS = "SELECT id FROM events WHERE cluster = ? AND death = ? AND death <> ''"


class BatchDeaths:
    """The deaths of one batch, in queue order, with the span of each one's events in the
    batch's list of event rows (`take`); `keep` drops the events of those replaced or
    dropped."""

    def __init__(self) -> None:
        self.rows: dict[Key, tuple] = {}  # the deaths to insert, in order
        self._spans: dict[Key, tuple[int, int]] = {}
        self._dropped: list[tuple[int, int]] = []
        self.replace: list[Key] = []  # amends: the death stored before, if any, goes
        self.plain: set[Key] = set()  # recorded as new: a repeat of a stored one is dropped

    def take(self, item: tuple, events: list, examples: dict[str, str]) -> None:
        row, rows, example, amend = item
        key = (row[1], row[0])
        if key in self.rows:
            if not amend:
                return  # a repeat within the batch: the first account stands
            self._dropped.append(self._spans.pop(key))
            del self.rows[key]
        if amend:
            self.replace.append(key)
            self.plain.discard(key)
        else:
            self.plain.add(key)
        start = len(events)
        events.extend(rows)
        self._spans[key] = (start, len(events))
        self.rows[key] = row
        if example:
            examples.setdefault(row[7], example)

    def keep(self, events: list, repeats: set[Key]) -> list:
        """`events` without those of replaced deaths, and of `repeats` (deaths recorded as
        new that were stored already)."""
        spans = self._dropped + [self._spans[key] for key in repeats]
        if not spans:
            return events
        gone = {i for a, b in spans for i in range(a, b)}
        return [e for i, e in enumerate(events) if i not in gone]

    def repeats(self, conn: sqlite3.Connection, after: int) -> set[Key]:
        """After the insert (ON CONFLICT DO NOTHING): the deaths recorded as new that were
        not inserted, because a death of that (cluster, id) was stored already."""
        if not self.plain:
            return set()
        inserted = set(conn.execute("SELECT cluster, id FROM deaths WHERE seq > ?", (after,)))
        return self.plain - inserted


def replace_stored(conn: sqlite3.Connection, keys: list[Key], ships: bool) -> tuple[int, int]:
    """Delete the stored deaths of `keys` (amended in this batch) with their tasks and
    events, and take each back from its signature's count: (events, deaths) deleted. A
    spool records the events it deleted for the history (`ship_deletes`)."""
    events = deaths = 0
    for cluster, identity in keys:
        found = conn.execute(_STORED, (cluster, identity)).fetchone()
        if found is not None:
            seq, signature = found
            conn.execute("DELETE FROM death_tasks WHERE death = ?", (seq,))
            conn.execute("DELETE FROM deaths WHERE seq = ?", (seq,))
            conn.execute("UPDATE signatures SET count = count - 1 WHERE id = ?", (signature,))
            deaths += 1
        ids = conn.execute(_ITS_EVENTS, (cluster, identity)).fetchall()
        conn.executemany("DELETE FROM events WHERE id = ?", ids)
        if ships:
            conn.executemany("INSERT INTO ship_deletes (event_id) VALUES (?)", ids)
        events += len(ids)
    return events, deaths


def insert_tasks(conn: sqlite3.Connection, after: int) -> None:
    conn.execute(_INSERT_TASKS, (after,))


def forget_oldest(conn: sqlite3.Connection, n: int) -> int:
    """Retention: delete the `n` oldest deaths (by insertion) with their tasks, and the
    other deaths of their incidents (an incident goes whole); how many went. Their
    signatures keep their counts, as for events."""
    oldest = (
        "SELECT d.seq FROM deaths AS d JOIN (SELECT DISTINCT cluster, incident FROM deaths"
        " WHERE seq IN (SELECT seq FROM deaths ORDER BY seq LIMIT ?)) AS o"
        " ON d.cluster = o.cluster AND d.incident = o.incident"
    )
    conn.execute(f"DELETE FROM death_tasks WHERE death IN ({oldest})", (n,))
    return conn.execute(f"DELETE FROM deaths WHERE seq IN ({oldest})", (n,)).rowcount


def death_from_row(r: tuple) -> Death:
    """A stored death (`query.DEATH_READ_COLUMNS`), read leniently: its JSON may be from an older
    or newer oomguard, or unreadable; the columns are what the store indexed."""
    try:
        d: Any = json.loads(r[8])
    except (TypeError, ValueError):
        d = {}
    if not isinstance(d, dict):
        d = {}
    columns = ("id", "cluster", "time", "worker", "host", "cause", "signature_id")
    d.update(zip(columns, r[:7], strict=True), signature_title=r[7], incident=r[9])
    return Death.from_dict(d)
