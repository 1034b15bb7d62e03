"""The writes of a FailureStore: add(), amend() and upsert_pipeline() append to a bounded
queue on the caller's thread (no I/O); one writer thread commits the queue in batches, one
transaction each, with the signature, member and retention updates done by SQLite."""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
import time

from .._models import FailureEvent, PipelineStatus
from .items import ROW, describe_event, event_item, pipeline_row
from .schema import PIPELINE_COLUMNS

logger = logging.getLogger("oomguard.store")

#: Items committed per transaction at most. Large: the shard index and signature_members
#: take keys in random order, so a commit rewrites nearly every page of them it touches;
#: fewer, larger commits write far fewer pages per event (see .notes/perf-store.md).
BATCH_EVENTS = 50_000
#: The writer's page cache (KiB) and WAL checkpoint interval (pages): same reason.
WRITER_CACHE_KIB = 32 * 1024
WAL_CHECKPOINT_PAGES = 16_384


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


_LOST_EVENTS = (
    "SELECT id, signature_id FROM events WHERE worker = ? AND cause = 'worker_lost' AND time ="
    " (SELECT max(time) FROM events WHERE worker = ? AND cause = 'worker_lost')"
)
_LOST_EVENTS_AT = (
    "SELECT id, signature_id FROM events WHERE worker = ? AND cause = 'worker_lost' AND time = ?"
)
_INSERT_EVENT = _MultiRow(
    "INSERT INTO events (time, kind, cause, shard, pipeline, worker, host, signature_id,"
    " signature_title, evidence, attempt, grouping_version, killer, killer_how,"
    " killer_confidence, killer_summary) VALUES",
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
        for code, column in enumerate(("host", "worker", "shard", "pipeline", "cause"))
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
    INSERT INTO pipelines ({PIPELINE_COLUMNS}, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (name, started) DO UPDATE SET
        status = excluded.status, shards_done = excluded.shards_done,
        shards_failed = excluded.shards_failed, shards_aborted = excluded.shards_aborted,
        infra_failures = excluded.infra_failures, user_failures = excluded.user_failures,
        summary = excluded.summary, abort_reason = excluded.abort_reason,
        updated = excluded.updated
"""


class WriterMixin:
    """add(), amend(), upsert_pipeline(), flush() and the writer thread of a FailureStore.
    FailureStore.__init__ sets the state below; start() opens `_conn` and starts `_thread`."""

    path: str
    max_events: int
    queue_size: int
    batch_interval: float
    max_pipelines: int
    member_rows: int
    written: int
    overflow: int
    write_errors: int
    last_error: str
    _lock: threading.Lock
    _closed: bool
    _queue: collections.deque[tuple]
    _enqueued: int
    _processed: int
    _lost: collections.deque[tuple[int, int]]
    _done: threading.Condition
    _wake: threading.Event
    _stopping: bool
    _thread: threading.Thread | None
    _conn: sqlite3.Connection | None
    _event_count: int
    _last_log: float

    # -- writes (from the event loop) -----------------------------------------------------

    def add(self, event: FailureEvent, *, grouping_version: int = 1, example: str = "") -> bool:
        """Queue one failure event. Never blocks, never raises, no I/O: it checks the fields,
        encodes the evidence as JSON (small, so O(1) in practice) and appends to the queue.

        Returns False when the event was refused: the queue is full (counted in `overflow`),
        a field is bad (counted in `write_errors`, `last_error` names the field) or the
        store is closed. The event's `id` is ignored: the store assigns one.

        >>> store.add(event, grouping_version=1, example=normalised_trace)
        True
        """
        try:
            item = event_item(event, grouping_version, example)
        except Exception as e:  # a scheduler hook must never raise
            self._error(f"add(): {describe_event(event)}: {e}")
            return False
        return self._put(item)

    def amend(
        self,
        event: FailureEvent,
        *,
        grouping_version: int = 1,
        example: str = "",
        lost_at: float | None = None,
    ) -> bool:
        """Queue the real cause of a death first recorded as ``worker_lost`` (its report came
        late, or the pod said what happened): the worker's ``worker_lost`` events of time
        `lost_at` (default: its latest) are replaced by `event`, so the death stays one
        event. Otherwise as `add`.

        >>> store.amend(event_with_the_real_cause)
        True
        """
        try:
            item = event_item(event, grouping_version, example)
        except Exception as e:  # a scheduler hook must never raise
            self._error(f"amend(): {describe_event(event)}: {e}")
            return False
        return self._put(("amend", item, lost_at))

    def upsert_pipeline(self, status: PipelineStatus) -> None:
        """Queue the latest status of one run of a pipeline: it replaces the stored status
        of the same (name, started), and leaves the other runs of that name alone. Like
        add(): never blocks, never raises; a refusal is counted in `overflow` or
        `write_errors`.

        Past `max_pipelines` runs, the writer deletes the least recently updated finished
        ones (status other than "running") in the same commit; it never deletes a running one.

        >>> store.upsert_pipeline(PipelineStatus("nightly", "running", 10, 0, 0, 0, 0, "",
        ...                                      started=1_790_000_000.0))
        """
        try:
            row = pipeline_row(status, time.time())
        except Exception as e:
            self._error(f"upsert_pipeline(): {e}")
            return
        self._put((row,))

    def _put(self, item: tuple) -> bool:
        with self._lock:
            if self._closed:
                self.write_errors += 1
                self.last_error = "the store is closed"
                return False
            if len(self._queue) >= self.queue_size:
                self.overflow += 1
                return False
            self._queue.append(item)
            self._enqueued += 1
        return True

    @property
    def pending(self) -> int:
        """Items queued and not yet committed."""
        return len(self._queue)

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until every item queued before this call is committed. False on timeout, or
        when a transaction holding one of them failed (see `last_error`).

        Blocks: call it from a thread (or an executor), not from the event loop.

        >>> store.add(event); store.flush()
        True
        """
        with self._lock:
            target = self._enqueued
        with self._done:
            since = self._processed
            if since >= target:
                return True
            if self._thread is None or not self._thread.is_alive():
                return False
            self._wake.set()
            if not self._done.wait_for(lambda: self._processed >= target, timeout):
                return False
            return not any(lo < target and hi > since for lo, hi in self._lost)

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self.batch_interval)
            self._wake.clear()
            stopping = self._stopping
            try:
                while self._queue:
                    self._write_batch()
            except Exception as e:  # never let the writer die: count, log, go on
                self._error(f"writer: {e!r}")
            if stopping and not self._queue:
                return

    def _write_batch(self) -> None:
        queue = self._queue
        items = [queue.popleft() for _ in range(min(BATCH_EVENTS, len(queue)))]
        first = self._processed  # sequence numbers first+1 .. first+len(items)
        events: list[tuple] = []
        pipelines: list[tuple] = []
        amends: list[tuple] = []
        lost: set[str] = set()  # workers with a worker_lost event in this batch
        examples: dict[str, str] = {}
        for item in items:  # as little Python per item as possible: it holds the GIL
            n = len(item)
            if n == ROW:
                events.append(item)
                if item[2] == "worker_lost":
                    lost.add(item[5])
            elif n == 3:  # ("amend", event item, lost_at)
                worker = item[1][5]
                when = item[2]
                if worker in lost:  # its worker_lost events may be in this very batch
                    mine = [e[0] for e in events if e[5] == worker and e[2] == "worker_lost"]
                    when = max(mine) if when is None else when
                    if when in mine:
                        events = [
                            e
                            for e in events
                            if e[5] != worker or e[2] != "worker_lost" or e[0] != when
                        ]
                        when = None
                if when is not None or worker not in lost:
                    amends.append((worker, when))
                events.append(item[1][:ROW])
                if len(item[1]) == ROW + 1:
                    examples.setdefault(item[1][7], item[1][ROW])
            elif n == ROW + 1:  # an event with an example trace (see event_item)
                events.append(item[:ROW])
                examples.setdefault(item[7], item[ROW])
            else:
                pipelines.append(item[0])
        conn = self._conn
        assert conn is not None
        count = self._event_count + len(events)
        uncommitted: list[tuple[int, int]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            # The single writer: every id above `last` is an event of this batch. The
            # signature and member updates are computed from them by SQLite, which does the
            # work without holding the GIL (the event loop's thread needs it).
            last = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
            for worker, lost_at in amends:
                # The death's worker_lost events go; the amended one is inserted below.
                if lost_at is None:
                    replaced = conn.execute(_LOST_EVENTS, (worker, worker)).fetchall()
                else:
                    replaced = conn.execute(_LOST_EVENTS_AT, (worker, lost_at)).fetchall()
                conn.executemany("DELETE FROM events WHERE id = ?", [(i,) for i, _ in replaced])
                conn.executemany(
                    "UPDATE signatures SET count = count - 1 WHERE id = ?",
                    [(sid,) for _, sid in replaced],
                )
                count -= len(replaced)
            _insert(conn, _INSERT_EVENT, events)
            if events:
                conn.execute(_UPSERT_SIGNATURES, (last,))
                conn.executemany(_SET_EXAMPLE, [(ex, sid) for sid, ex in examples.items()])
                members = {"last": last, "rows": self.member_rows}
                for statement in _MEMBERS:
                    conn.execute(statement, members)
            conn.executemany(_UPSERT_PIPELINE, pipelines)
            if pipelines:
                runs = conn.execute("SELECT count(*) FROM pipelines").fetchone()[0]
                if runs > self.max_pipelines:
                    # The oldest finished runs. Never a running one: pipeline(name) would
                    # answer with an older run until the next update brought it back.
                    conn.execute(
                        "DELETE FROM pipelines WHERE rowid IN (SELECT rowid FROM pipelines"
                        " WHERE status <> 'running' ORDER BY updated, rowid LIMIT ?)",
                        (runs - self.max_pipelines,),
                    )
            if count > self.max_events:
                # Oldest first by id (insertion order); signature rows are never recounted.
                cur = conn.execute(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY id LIMIT ?)",
                    (count - self.max_events,),
                )
                count -= cur.rowcount
            conn.execute("COMMIT")
        except Exception as e:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            uncommitted = [(first, first + len(items))]
            self._error(f"writer: a batch of {len(items)} items was not committed: {e!r}")
        else:
            self._event_count = count
            self.written += len(events)
        with self._done:
            self._lost.extend(uncommitted)
            self._processed = first + len(items)
            self._done.notify_all()

    def _error(self, message: str) -> None:
        self.write_errors += 1
        self.last_error = message
        now = time.monotonic()
        if now - self._last_log > 60:  # log once a minute at most; the counter has the rest
            self._last_log = now
            logger.error(
                "oomguard failure store %s: %s (write errors so far: %d)",
                self.path,
                message,
                self.write_errors,
            )
