"""The failure history: every failure event, one deduplicated row per signature, and the
last status of every pipeline run, in one SQLite file (stdlib `sqlite3`). Knows nothing of
Dask.

Writes never touch the disk on the caller's thread: `add()` and `upsert_pipeline()` append
to a bounded in-memory queue (O(1), no I/O, never blocks; a full queue returns False and is
counted in `overflow`). One writer thread commits the queue in batches, one transaction
each, every `batch_interval` seconds or every `BATCH_EVENTS` items. Reads run on the
caller's thread with that thread's own connection; the file is in WAL mode, so a read never
waits for the writer. Exactly one `FailureStore` may write a given file at a time.

Durability: WAL with `synchronous=NORMAL`. A commit is written to the WAL file (the OS page
cache) before `flush()` returns True, so it survives the process being SIGKILLed; it is
not fsynced, so a power loss or kernel crash may lose the last commits (never corrupt the
file). A failure history is diagnostics, not a ledger: we trade that for write speed.

Deduplication: `signatures` holds one row per signature id across every host: count,
first/last seen (event times), title and grouping version (from the latest write), and the
example trace (the first non-empty one given to `add()`). The distinct hosts, workers,
shards, pipelines and causes of a signature live in `signature_members` (empty strings are
not recorded), at most `member_rows` of each: the first to arrive (within one batch, the
smallest), so a signature hit by millions of shards stays small. A returned SignatureRow
lists at most `member_cap` of those, sorted; the `cause` and `pipeline` filters of
`signatures()` see only them. `distinct_counts()` counts on past them: exact until a value
goes unstored, a lower bound after (see there). Rows already stored past the bound (by an
older oomguard, or a larger `member_rows`) are kept.

A pipeline is stored per run, keyed by (name, `started`): a second run of "etl", or the
name reused by a new scheduler, does not overwrite the first.

Retention, in the writer's commits: past `max_events` the oldest events (in insertion
order) are deleted, signatures never, so counts survive; past `max_pipelines` runs the
least recently updated finished ones, never a running one.

Schema: `PRAGMA user_version` is the number of migrations applied; `MIGRATIONS[i]` takes
version i to i+1 in one transaction. `PRAGMA application_id` marks the file as ours. A
file from a newer oomguard, from another application, or that is not SQLite is refused
with `StoreError` naming the path, and left byte-for-byte untouched.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import pathlib
import shutil
import sqlite3
import tempfile
import threading
import time
from typing import Any

from ._exceptions import StoreError
from ._models import FailureEvent, PipelineStatus, SignatureRow

logger = logging.getLogger("oomguard.store")

#: "OOMG": marks a SQLite file as an oomguard store.
APPLICATION_ID = 0x4F4F4D47

#: MIGRATIONS[i] takes the schema from version i to i + 1. Append; never edit a released one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"PRAGMA application_id = {APPLICATION_ID}",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after retention
            time REAL NOT NULL,
            kind TEXT NOT NULL,
            cause TEXT NOT NULL,
            shard TEXT NOT NULL,
            pipeline TEXT NOT NULL,
            worker TEXT NOT NULL,
            host TEXT NOT NULL,
            signature_id TEXT NOT NULL,
            signature_title TEXT NOT NULL,
            evidence TEXT NOT NULL,  -- JSON object
            attempt INTEGER NOT NULL,
            grouping_version INTEGER NOT NULL
        )""",
        "CREATE INDEX events_time ON events(time)",
        "CREATE INDEX events_shard ON events(shard, time)",
        "CREATE INDEX events_signature ON events(signature_id, time)",
        "CREATE INDEX events_pipeline ON events(pipeline, time)",
        "CREATE INDEX events_cause ON events(cause, time)",
        """CREATE TABLE signatures (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            grouping_version INTEGER NOT NULL,
            count INTEGER NOT NULL,
            first_seen REAL NOT NULL,
            last_seen REAL NOT NULL,
            example TEXT NOT NULL
        )""",
        "CREATE INDEX signatures_rank ON signatures(count DESC, last_seen DESC)",
        # field: the index of the SignatureRow list in MEMBER_FIELDS.
        """CREATE TABLE signature_members (
            signature_id TEXT NOT NULL,
            field INTEGER NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (signature_id, field, value)
        ) WITHOUT ROWID""",
        """CREATE TABLE signature_distinct (
            signature_id TEXT NOT NULL,
            field INTEGER NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (signature_id, field)
        ) WITHOUT ROWID""",
        # Fires only for members really inserted (INSERT OR IGNORE skips duplicates).
        """CREATE TRIGGER signature_members_count AFTER INSERT ON signature_members BEGIN
            INSERT INTO signature_distinct (signature_id, field, n)
            VALUES (NEW.signature_id, NEW.field, 1)
            ON CONFLICT (signature_id, field) DO UPDATE SET n = n + 1;
        END""",
        """CREATE TABLE pipelines (
            name TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            shards_done INTEGER NOT NULL,
            shards_failed INTEGER NOT NULL,
            shards_aborted INTEGER NOT NULL,
            infra_failures INTEGER NOT NULL,
            user_failures INTEGER NOT NULL,
            summary TEXT NOT NULL,
            abort_reason TEXT NOT NULL,
            updated REAL NOT NULL
        )""",
        "CREATE INDEX pipelines_updated ON pipelines(updated)",
    ),
    (
        # Runs, not names: a pipeline's second run (or a name reused after a restart) gets
        # a row of its own. Rows stored before runs existed become the run started at 0.0.
        """CREATE TABLE pipeline_runs (
            name TEXT NOT NULL,
            started REAL NOT NULL,  -- when the run began; 0.0 when not known
            status TEXT NOT NULL,
            shards_done INTEGER NOT NULL,
            shards_failed INTEGER NOT NULL,
            shards_aborted INTEGER NOT NULL,
            infra_failures INTEGER NOT NULL,
            user_failures INTEGER NOT NULL,
            summary TEXT NOT NULL,
            abort_reason TEXT NOT NULL,
            updated REAL NOT NULL,
            PRIMARY KEY (name, started)
        )""",
        # In rowid order: pipelines() breaks ties of `updated` by rowid.
        """INSERT INTO pipeline_runs SELECT name, 0.0, status, shards_done, shards_failed,
            shards_aborted, infra_failures, user_failures, summary, abort_reason, updated
            FROM pipelines ORDER BY rowid""",
        "DROP TABLE pipelines",  # and its index
        "ALTER TABLE pipeline_runs RENAME TO pipelines",
        "CREATE INDEX pipelines_updated ON pipelines(updated)",
        # Bounded members: `stored` counts a field's rows in signature_members (at most the
        # writer's member_rows), `n` its distinct values (see FailureStore.distinct_counts).
        # Until now every member was stored, so stored = n; the writer now counts per batch.
        "ALTER TABLE signature_distinct ADD COLUMN stored INTEGER NOT NULL DEFAULT 0",
        "UPDATE signature_distinct SET stored = n",
        "DROP TRIGGER signature_members_count",
    ),
)

#: The SignatureRow lists kept in signature_members; the position is the stored code.
MEMBER_FIELDS = ("hosts", "workers", "shards", "pipelines", "causes")

#: Items committed per transaction at most. Large: the shard index and signature_members
#: take keys in random order, so a commit rewrites nearly every page of them it touches;
#: fewer, larger commits write far fewer pages per event (see .notes/perf-store.md).
BATCH_EVENTS = 50_000
#: The writer's page cache (KiB) and WAL checkpoint interval (pages): same reason.
WRITER_CACHE_KIB = 32 * 1024
WAL_CHECKPOINT_PAGES = 16_384

_TEXT_FIELDS = ("kind", "cause", "shard", "pipeline", "worker", "host", "signature_id",
                "signature_title")  # fmt: skip
_PIPELINE_INT_FIELDS = ("shards_done", "shards_failed", "shards_aborted", "infra_failures",
                        "user_failures")  # fmt: skip
_EVENT_COLUMNS = ("id, time, kind, cause, shard, pipeline, worker, host, signature_id, "
                  "signature_title, evidence, attempt")  # fmt: skip
# In PipelineStatus's field order.
_PIPELINE_COLUMNS = ("name, status, shards_done, shards_failed, shards_aborted, "
                     "infra_failures, user_failures, summary, abort_reason, started")  # fmt: skip


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
    " signature_title, evidence, attempt, grouping_version) VALUES",
    12,
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
_CREATE_BATCH_MEMBERS = """CREATE TEMP TABLE batch_members (
    signature_id TEXT NOT NULL,
    field INTEGER NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (signature_id, field, value)
) WITHOUT ROWID"""
# Each member list comes back as one JSON array: one row per signature, not one per member.
_SELECT_SIGNATURE = (
    "SELECT id, title, grouping_version, count, first_seen, last_seen, example, "
    + ", ".join(
        "(SELECT json_group_array(value) FROM (SELECT value FROM signature_members"
        f" WHERE signature_id = s.id AND field = {code} ORDER BY value LIMIT :cap))"
        for code in range(len(MEMBER_FIELDS))
    )
    + " FROM signatures s"
)
_UPSERT_PIPELINE = f"""
    INSERT INTO pipelines ({_PIPELINE_COLUMNS}, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (name, started) DO UPDATE SET
        status = excluded.status, shards_done = excluded.shards_done,
        shards_failed = excluded.shards_failed, shards_aborted = excluded.shards_aborted,
        infra_failures = excluded.infra_failures, user_failures = excluded.user_failures,
        summary = excluded.summary, abort_reason = excluded.abort_reason,
        updated = excluded.updated
"""


def _read(method):
    """Counts the call as a read in progress (see `FailureStore.close`); refuses a read of
    a closed store with RuntimeError."""

    @functools.wraps(method)
    def read(self, *args, **kwargs):
        with self._lock:
            if self._closed:
                raise RuntimeError(f"FailureStore({self.path!r}) is closed.")
            self._reads += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            with self._lock:
                self._reads -= 1
                self._reads_done.notify_all()

    return read


class FailureStore:
    """The persistent failure history of one scheduler (see the module docstring).

    `path` is a file (its directory is created), or ":memory:" for a private temporary
    file that `close()` deletes (WAL needs a real file, so tests get the same semantics).

    >>> store = FailureStore(":memory:")
    >>> store.start()
    >>> store.add(event)                    # from the event loop: queued, no I/O
    True
    >>> store.flush()                       # committed
    True
    >>> [row.count for row in store.signatures(limit=1)]
    [1]
    >>> store.close()
    """

    #: Longest list returned per SignatureRow field; distinct_counts() has the true numbers.
    member_cap: int = 1000
    #: The schema's migrations; a subclass may append (tests do).
    migrations: tuple[tuple[str, ...], ...] = MIGRATIONS

    written: int  # events committed by this instance
    overflow: int  # items refused because the queue was full
    write_errors: int  # items refused as bad data, or lost with a failed transaction
    last_error: str

    def __init__(
        self,
        path: str,
        *,
        max_events: int = 1_000_000,
        queue_size: int = 100_000,
        batch_interval: float = 0.05,
        max_pipelines: int = 10_000,
        member_rows: int = 1_000,
    ) -> None:
        if not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, got {max_events!r}.")
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be a positive integer, got {queue_size!r}.")
        if not isinstance(max_pipelines, int) or max_pipelines < 1:
            raise ValueError(f"max_pipelines must be a positive integer, got {max_pipelines!r}.")
        if not isinstance(member_rows, int) or member_rows < 1:
            raise ValueError(f"member_rows must be a positive integer, got {member_rows!r}.")
        if not batch_interval > 0:
            raise ValueError(f"batch_interval must be > 0 seconds, got {batch_interval!r}.")
        self.path = path
        self.max_events = max_events
        self.queue_size = queue_size
        self.batch_interval = float(batch_interval)
        self.max_pipelines = max_pipelines
        self.member_rows = member_rows
        self.written = 0
        self.overflow = 0
        self.write_errors = 0
        self.last_error = ""
        self._file = ""  # the real file: `path`, or a temporary one for ":memory:"
        self._tmpdir: str | None = None
        self._queue: collections.deque[tuple] = collections.deque()
        self._lock = threading.Lock()  # makes "check length, append, count" one step
        self._enqueued = 0  # items ever queued; an item's sequence number is its rank
        self._processed = 0  # items taken from the queue: committed, or lost (see _lost)
        self._lost: collections.deque[tuple[int, int]] = collections.deque(maxlen=1024)
        self._done = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None  # the writer's
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        # Reads in progress on any thread: close() waits for them before it closes the
        # readers' connections (closing one under a running query crashes the process).
        self._reads = 0
        self._reads_done = threading.Condition(self._lock)
        self._event_count = 0
        self._last_log = 0.0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Open the file, migrate its schema and start the writer thread. Idempotent.

        Raises StoreError (naming the path) for a file that is not a usable oomguard store.

        >>> FailureStore("/var/lib/oomguard/history.sqlite3").start()
        """
        if self._thread is not None:
            return
        if self._closed:
            raise RuntimeError(f"FailureStore({self.path!r}) is closed; make a new one.")
        if self.path == ":memory:":
            self._tmpdir = tempfile.mkdtemp(prefix="oomguard-store-")
            self._file = os.path.join(self._tmpdir, "store.sqlite3")
        else:
            self._file = os.path.abspath(self.path)
            os.makedirs(os.path.dirname(self._file), exist_ok=True)
        if os.path.exists(self._file) and os.path.getsize(self._file) > 0:
            check_file(self._file, len(self.migrations))  # read-only: refuse before any write
        conn = _connect(self._file)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
            conn.execute("PRAGMA temp_store = MEMORY")  # the per-batch GROUP BY and DISTINCT
            _require_json(conn, self._file)
            _migrate(conn, self._file, self.migrations)
            conn.execute(_CREATE_BATCH_MEMBERS)  # TEMP: the connection's own, not the file's
            self._event_count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name="oomguard-store", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is queued, stop the writer, close every connection. Idempotent; safe
        when start() never ran (then nothing queued is written).

        >>> store.close()
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True  # reads from now on are refused
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._error(f"close(): the writer did not stop within {timeout}s; "
                            f"{len(self._queue)} queued items were not written")  # fmt: skip
                return  # the writer still owns its connection; it exits on its own
        with self._lock:
            if not self._reads_done.wait_for(lambda: self._reads == 0, timeout):
                self._error(f"close(): {self._reads} reads still running after {timeout}s; "
                            "their connections stay open")  # fmt: skip
                readers = []
            else:
                readers, self._readers = self._readers, []
        for conn in readers + ([self._conn] if self._conn is not None else []):
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._conn = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

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
            item = _event_item(event, grouping_version, example)
        except Exception as e:  # a scheduler hook must never raise
            self._error(f"add(): {_describe(event)}: {e}")
            return False
        return self._put(item)

    def amend(self, event: FailureEvent, *, grouping_version: int = 1, example: str = "",
              lost_at: float | None = None) -> bool:
        """Queue the real cause of a death first recorded as ``worker_lost`` (its report came
        late, or the pod said what happened): the worker's ``worker_lost`` events of time
        `lost_at` (default: its latest) are replaced by `event`, so the death stays one
        event. Otherwise as `add`.

        >>> store.amend(event_with_the_real_cause)
        True
        """
        try:
            item = _event_item(event, grouping_version, example)
        except Exception as e:  # a scheduler hook must never raise
            self._error(f"amend(): {_describe(event)}: {e}")
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
            row = _pipeline_row(status, time.time())
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
            if n == 12:
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
                        events = [e for e in events
                                  if e[5] != worker or e[2] != "worker_lost" or e[0] != when]
                        when = None
                if when is not None or worker not in lost:
                    amends.append((worker, when))
                events.append(item[1][:12])
                if len(item[1]) == 13:
                    examples.setdefault(item[1][7], item[1][12])
            elif n == 13:  # an event with an example trace (see _event_item)
                events.append(item[:12])
                examples.setdefault(item[7], item[12])
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
                conn.executemany("UPDATE signatures SET count = count - 1 WHERE id = ?",
                                 [(sid,) for _, sid in replaced])
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
            logger.error("oomguard failure store %s: %s (write errors so far: %d)",
                         self.path, message, self.write_errors)  # fmt: skip

    # -- reads (on the caller's thread) ---------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection; only inside a method marked `@_read`."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._thread is None or self._closed:
            state = "closed" if self._closed else "not started"
            raise RuntimeError(f"FailureStore({self.path!r}) is {state}; reads need start().")
        conn = _connect(self._file)
        conn.execute("PRAGMA query_only = 1")
        with self._lock:
            self._readers.append(conn)
        self._local.conn = conn
        return conn

    @_read
    def events(
        self,
        *,
        kind: str | None = None,
        cause: str | None = None,
        pipeline: str | None = None,
        shard: str | None = None,
        signature: str | None = None,
        since: float | None = None,
        limit: int | None = 1000,
    ) -> list[FailureEvent]:
        """Stored events, newest first (by event time), matching every filter given.

        >>> [e.shard for e in store.events(cause="oom_kill", since=time.time() - 3600)]
        ["('load-0a1b', 17)"]
        """
        where, args = [], []
        for column, value in (("kind", kind), ("cause", cause), ("pipeline", pipeline),
                              ("shard", shard), ("signature_id", signature)):  # fmt: skip
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("time >= ?")
            args.append(since)
        sql = f"SELECT {_EVENT_COLUMNS} FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY time DESC, id DESC LIMIT ?"
        args.append(_limit(limit))
        return [_event(r) for r in self._reader().execute(sql, args)]

    @_read
    def shard(self, key: str) -> list[FailureEvent]:
        """One shard's history, oldest first.

        >>> [(e.attempt, e.cause) for e in store.shard("('load-0a1b', 17)")]
        [(1, 'oom_kill'), (2, 'oom_kill')]
        """
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE shard = ? ORDER BY time, id"
        return [_event(r) for r in self._reader().execute(sql, (key,))]

    @_read
    def signatures(
        self,
        *,
        cause: str | None = None,
        pipeline: str | None = None,
        since: float | None = None,
        limit: int | None = 100,
    ) -> list[SignatureRow]:
        """Signatures seen with `cause` / in `pipeline` / last seen at or after `since`,
        by count (lifetime, across every host) descending, then last seen descending.

        >>> [(s.title, s.count, len(s.hosts)) for s in store.signatures(limit=20)]
        [('MemoryError in parse_block', 3, 3)]
        """
        where = []
        args: dict[str, Any] = {"cap": self.member_cap, "limit": _limit(limit)}
        for code, value in ((4, cause), (3, pipeline)):
            if value is not None:
                where.append(f"EXISTS (SELECT 1 FROM signature_members m WHERE "
                             f"m.signature_id = s.id AND m.field = {code} AND m.value = :f{code})")  # fmt: skip
                args[f"f{code}"] = value
        if since is not None:
            where.append("s.last_seen >= :since")
            args["since"] = since
        sql = _SELECT_SIGNATURE
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY count DESC, last_seen DESC LIMIT :limit"
        return [_signature(r) for r in self._reader().execute(sql, args)]

    @_read
    def signature(self, signature_id: str) -> SignatureRow | None:
        """One signature, or None.

        >>> store.signature("3f2a9c").hosts
        ['node-1', 'node-2', 'node-3']
        """
        r = self._reader().execute(
            _SELECT_SIGNATURE + " WHERE id = :id", {"id": signature_id, "cap": self.member_cap}
        ).fetchone()
        return None if r is None else _signature(r)

    @_read
    def distinct_counts(self, signature_id: str) -> dict[str, int]:
        """The number of distinct hosts, workers, shards, pipelines and causes of a
        signature (a SignatureRow lists at most `member_cap` of each).

        Exact until a field of the signature has had more distinct values than
        `member_rows`, the rows the store keeps of it. Past that, a lower bound: the stored
        rows plus the most values one write batch brought that were not stored (so it
        still grows when a batch brings more), never a value counted twice.

        >>> store.distinct_counts("3f2a9c")
        {'hosts': 3, 'workers': 3, 'shards': 1, 'pipelines': 1, 'causes': 1}
        """
        counts = dict.fromkeys(MEMBER_FIELDS, 0)
        for code, n in self._reader().execute(
            "SELECT field, n FROM signature_distinct WHERE signature_id = ?", (signature_id,)
        ):
            counts[MEMBER_FIELDS[code]] = n
        return counts

    def pipeline(self, name: str) -> PipelineStatus | None:
        """The status of the latest run (greatest `started`) of one pipeline, or None.

        >>> store.pipeline("nightly").status
        'aborted'
        """
        runs = self.pipeline_runs(name, limit=1)
        return runs[0] if runs else None

    @_read
    def pipeline_runs(self, name: str, limit: int | None = 100) -> list[PipelineStatus]:
        """The runs of one pipeline, newest (greatest `started`) first.

        >>> [(p.started, p.status) for p in store.pipeline_runs("nightly")]
        [(1790086400.0, 'running'), (1790000000.0, 'aborted')]
        """
        # (name, started) is the key: no two runs of a name share `started`.
        sql = (f"SELECT {_PIPELINE_COLUMNS} FROM pipelines WHERE name = ? "
               "ORDER BY started DESC LIMIT ?")  # fmt: skip
        return [PipelineStatus(*r) for r in self._reader().execute(sql, (name, _limit(limit)))]

    @_read
    def pipelines(self, limit: int | None = 100) -> list[PipelineStatus]:
        """Pipeline runs (a name may come more than once), most recently updated first.

        >>> [p.name for p in store.pipelines(limit=2)]
        ['nightly', 'backfill']
        """
        sql = (f"SELECT {_PIPELINE_COLUMNS} FROM pipelines "
               "ORDER BY updated DESC, rowid DESC LIMIT ?")  # fmt: skip
        return [PipelineStatus(*r) for r in self._reader().execute(sql, (_limit(limit),))]


# -- helpers ----------------------------------------------------------------------------------


def _connect(file: str) -> sqlite3.Connection:
    # Autocommit mode: transactions are explicit. check_same_thread off so close() can close
    # every connection; each is still used by one thread only.
    conn = sqlite3.connect(file, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


def check_file(file: str, known: int) -> None:
    """Refuse, before writing a byte, a file we must not touch: StoreError naming `file` and
    the fix when it is not SQLite, is another application's, or has a schema version above
    `known`. Opens the file read-only."""
    try:
        with open(file, "rb") as f:
            magic = f.read(16)
    except OSError as e:
        raise StoreError(f"Cannot read the failure store {file}: {e}.") from e
    if magic != b"SQLite format 3\x00":
        # SQLite would take a file shorter than its header for an empty database and
        # write over it; whatever it is, it is not ours.
        raise StoreError(
            f"The failure store {file} is not a SQLite database (it does not start with the "
            "SQLite header). oomguard left it untouched: move it aside, or point "
            "oomguard.scheduler.store at another path."
        )
    uri = pathlib.Path(file).as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as e:
        raise StoreError(f"Cannot open the failure store {file}: {e}.") from e
    try:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as e:
        raise StoreError(
            f"The failure store {file} is not a usable SQLite database ({e}). oomguard left "
            "it untouched: move it aside, or point oomguard.scheduler.store at another path."
        ) from e
    finally:
        conn.close()
    if app not in (0, APPLICATION_ID) or (app == 0 and tables):
        raise StoreError(
            f"{file} is a SQLite database of another application (application_id {app}, "
            f"{tables} schema objects), not an oomguard failure store. oomguard left it "
            "untouched: point oomguard.scheduler.store at another path."
        )
    if version > known:
        raise StoreError(
            f"The failure store {file} has schema version {version}, but this oomguard "
            f"knows versions up to {known}: it was written by a newer oomguard. Upgrade "
            "oomguard, or point oomguard.scheduler.store at another path. The file was left "
            "untouched."
        )


def _require_json(conn: sqlite3.Connection, file: str) -> None:
    try:
        conn.execute("SELECT json_group_array(1)").fetchone()
    except sqlite3.OperationalError as e:
        raise StoreError(
            f"The failure store {file} needs SQLite's JSON functions, which this Python's "
            f"SQLite {sqlite3.sqlite_version} lacks ({e}). Use a Python built with SQLite "
            ">= 3.38, or with the JSON1 extension."
        ) from e


def _migrate(conn: sqlite3.Connection, file: str, migrations: tuple[tuple[str, ...], ...]) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for target in range(version + 1, len(migrations) + 1):
        try:
            conn.execute("BEGIN IMMEDIATE")
            for statement in migrations[target - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")  # in the same transaction
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(
                f"Migrating the failure store {file} from schema version {target - 1} to "
                f"{target} failed ({e}); it was rolled back and the file is at version "
                f"{target - 1}."
            ) from e


def _event_item(e: FailureEvent, grouping_version: Any, example: Any) -> tuple:
    """The queued form of an event: the events row (12 atomics, in _INSERT_EVENT's column
    order), plus the example when there is one. Atomics only, so the GC stops tracking it."""
    if not isinstance(e, FailureEvent):
        raise TypeError(f"expected a FailureEvent, got {type(e).__name__}")
    t = e.time
    if type(t) is not float:
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise TypeError(f"field 'time' must be seconds since the epoch, got {t!r}")
        t = float(t)
    if t != t:
        raise ValueError("field 'time' is NaN")
    texts = []
    for name in _TEXT_FIELDS:
        value = getattr(e, name)
        if type(value) is not str:
            if not isinstance(value, str):
                raise TypeError(f"field {name!r} must be a str, got {type(value).__name__}")
            value = str.__str__(value)  # Cause.OOM_KILL -> "oom_kill", a plain str
        texts.append(value)
    attempt = e.attempt
    if type(attempt) is not int:
        raise TypeError(f"field 'attempt' must be an int, got {attempt!r}")
    if type(grouping_version) is not int:
        raise TypeError(f"grouping_version must be an int, got {grouping_version!r}")
    if type(example) is not str:
        raise TypeError(f"example must be a str, got {type(example).__name__}")
    if type(e.evidence) is not dict:
        raise TypeError(f"field 'evidence' must be a dict, got {type(e.evidence).__name__}")
    try:
        # Encoded now: a snapshot, even if the caller mutates the dict afterwards.
        evidence = _encode_json(e.evidence)
    except (TypeError, ValueError) as err:
        raise TypeError(f"field 'evidence' is not JSON-serialisable: {err}") from None
    if example:
        return (t, *texts, evidence, attempt, grouping_version, example)
    return (t, *texts, evidence, attempt, grouping_version)


_encode_json = json.JSONEncoder(separators=(",", ":")).encode


def _pipeline_row(p: PipelineStatus, updated: float) -> tuple:
    if not isinstance(p, PipelineStatus):
        raise TypeError(f"expected a PipelineStatus, got {type(p).__name__}")
    texts = {}
    for name in ("name", "status", "summary", "abort_reason"):
        value = getattr(p, name)
        if not isinstance(value, str):
            raise TypeError(f"field {name!r} must be a str, got {type(value).__name__}")
        texts[name] = str.__str__(value)
    for name in _PIPELINE_INT_FIELDS:
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"field {name!r} must be an int, got {value!r}")
    started = p.started
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        raise TypeError(f"field 'started' must be seconds since the epoch, got {started!r}")
    if started != started:
        raise ValueError("field 'started' is NaN")
    return (texts["name"], texts["status"], int(p.shards_done), int(p.shards_failed),
            int(p.shards_aborted), int(p.infra_failures), int(p.user_failures),
            texts["summary"], texts["abort_reason"], float(started), updated)  # fmt: skip


def _describe(event: Any) -> str:
    try:
        return f"event of shard {event.shard!r} (signature {event.signature_id!r})"
    except Exception:
        return f"a {type(event).__name__}"


def _event(r: tuple) -> FailureEvent:
    return FailureEvent(id=r[0], time=r[1], kind=r[2], cause=r[3], shard=r[4], pipeline=r[5],
                        worker=r[6], host=r[7], signature_id=r[8], signature_title=r[9],
                        evidence=json.loads(r[10]), attempt=r[11])  # fmt: skip


def _signature(r: tuple) -> SignatureRow:
    lists = {name: json.loads(r[7 + code]) for code, name in enumerate(MEMBER_FIELDS)}
    return SignatureRow(id=r[0], title=r[1], grouping_version=r[2], count=r[3],
                        first_seen=r[4], last_seen=r[5], example=r[6], **lists)  # fmt: skip


def _limit(limit: int | None) -> int:
    return -1 if limit is None else max(0, int(limit))
