"""FailureStore: the failure history of one scheduler, its configuration and lifecycle
(start, close). It holds a `Writer` (`writer`: the queue, the writer thread) and a `Reader`
(`reader`: the read connections), each owning its own state; its public methods are
theirs."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .._models import SignatureRow
from . import environments
from .batch import CREATE_BATCH_MEMBERS
from .incidents import read_incidents
from .reads import Reader, _read
from .schema import MIGRATIONS, check_file, connect, migrate, require_json
from .states import resolve as _resolve
from .writer import WAL_CHECKPOINT_PAGES, WRITER_CACHE_KIB, Writer


def _of(part: str, method: Callable) -> Callable:
    """`method` of the part `part` ("writer", "reader"), as a method of the store."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return method(getattr(self, part), *args, **kwargs)

    return call


def _view(part: str, name: str, doc: str = "") -> property:
    """The attribute `name` of the part `part`, read through the store."""
    return property(lambda self: getattr(getattr(self, part), name), doc=doc)


def _setting(part: str, name: str) -> property:
    """The setting `name` of the part `part`, read and set through the store."""
    return property(
        lambda self: getattr(getattr(self, part), name),
        lambda self, value: setattr(getattr(self, part), name, value),
    )


class FailureStore:
    """The persistent failure history of one scheduler (see the package docstring,
    `oomguard._store`).

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

    #: The schema's migrations; a subclass may append (tests do).
    migrations: tuple[tuple[str, ...], ...] = MIGRATIONS
    #: The PostgreSQL history this store is the spool of (`oomguard._store.pg.History`);
    #: closed after the store.
    history: Any = None

    def __init__(
        self,
        path: str,
        *,
        max_events: int = 1_000_000,
        max_signatures: int = 100_000,
        queue_size: int = 100_000,
        queue_bytes: int = 256 * 2**20,
        batch_interval: float = 0.05,
        max_pipelines: int = 10_000,
        member_rows: int = 1_000,
    ) -> None:
        for name, value in (
            ("max_events", max_events),
            ("max_signatures", max_signatures),
            ("queue_bytes", queue_bytes),
            ("queue_size", queue_size),
            ("max_pipelines", max_pipelines),
            ("member_rows", member_rows),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not batch_interval > 0:
            raise ValueError(f"batch_interval must be > 0 seconds, got {batch_interval!r}.")
        self.path = path
        self.writer = Writer(
            path,
            max_events=max_events,
            max_signatures=max_signatures,
            queue_size=queue_size,
            queue_bytes=queue_bytes,
            batch_interval=batch_interval,
            max_pipelines=max_pipelines,
            member_rows=member_rows,
        )
        self.reader = Reader(path)
        self._file = ""  # the real file: `path`, or a temporary one for ":memory:"
        self._tmpdir: str | None = None
        self._started = False
        self._closed = False

    # -- the writer's and the reader's, as the store's --------------------------------------

    add = _of("writer", Writer.add)
    record = _of("writer", Writer.record)
    upsert_pipeline = _of("writer", Writer.upsert_pipeline)
    worker_environment = _of("writer", Writer.worker_environment)
    flush = _of("writer", Writer.flush)
    mark_shipped = _of("writer", Writer.mark_shipped)
    flush_marks = _of("writer", Writer.flush_marks)
    events = _of("reader", Reader.events)
    deaths = _of("reader", Reader.deaths)
    incidents = _of("reader", read_incidents)
    death_times = _of("reader", Reader.death_times)
    shard = _of("reader", Reader.shard)
    totals = _of("reader", Reader.totals)
    distinct_counts = _of("reader", Reader.distinct_counts)
    pipeline = _of("reader", Reader.pipeline)
    pipeline_runs = _of("reader", Reader.pipeline_runs)
    pipelines = _of("reader", Reader.pipelines)
    known = _of("reader", Reader.known)

    written = _view("writer", "written", "Events committed by this store.")
    regressions = _view("writer", "regressions", "Signatures its writer found regressed.")
    overflow = _view("writer", "overflow", "Items refused because the queue was full.")
    write_errors = _view("writer", "write_errors", "Items refused as bad data, or lost.")
    disk_full = _view("writer", "disk_full", "Times the writer found the disk full.")
    last_error = _view("writer", "last_error")
    pending = _view("writer", "pending", "Items queued and not yet committed.")
    pending_bytes = _view("writer", "pending_bytes", "The encoded size of those items.")
    # Settings: the plugin changes the bounds while it runs (`install(client, ...)`).
    max_events = _setting("writer", "max_events")
    max_signatures = _setting("writer", "max_signatures")
    max_pipelines = _setting("writer", "max_pipelines")
    queue_size = _setting("writer", "queue_size")
    queue_bytes = _setting("writer", "queue_bytes")
    member_rows = _setting("writer", "member_rows")
    batch_interval = _setting("writer", "batch_interval")
    full_retry = _setting("writer", "full_retry")
    member_cap = _setting("reader", "member_cap")  # longest list per SignatureRow field
    #: A spool of a PostgreSQL history (`oomguard._store.pg`): amends record the events
    #: they delete, and `on_commit` is called on the writer thread after each commit.
    ships = _setting("writer", "ships")
    on_commit = _setting("writer", "on_commit")

    def signatures(self, *, environment: bool = True, **filters: Any) -> list[SignatureRow]:
        """`Reader.signatures`, each row with where its crash lives (`environments.attach`;
        `environment=False`: without, as the dashboard's table reads them)."""
        rows = self.reader.signatures(**filters)
        return environments.attach(rows, self._fetch, environments.SQLITE) if environment else rows

    def signature(self, signature_id: str) -> SignatureRow | None:
        """`Reader.signature`, with where its crash lives."""
        row = self.reader.signature(signature_id)
        if row is None:
            return None
        return environments.attach([row], self._fetch, environments.SQLITE)[0]

    def _fetch(self, sql: str, args: Any) -> list[tuple]:
        return _fetch(self.reader, sql, args)

    @property
    def file(self) -> str:
        """The SQLite file (a temporary one for ":memory:"); "" before `start`."""
        return self._file

    def resolve(
        self, signature_id: str, *, note: str = "", by: str = "", at: float | None = None
    ) -> tuple[SignatureRow | None, bool]:
        """Resolve a signature (or the one an old id of it points at): from now on, a
        death with it is a regression (`states.py`). Blocks: commits what is queued
        first, then one short transaction (beside the writer, or a scheduler writing the
        file). (the signature, whether anything changed); KeyError naming an unknown id.

        >>> store.resolve("3f2a9c", note="fixed in shardapp 1.4", by="alice")
        (<SignatureRow 3f2a9c 'SIGSEGV in parse_block' resolved count=4 ...>, True)
        """
        self.flush()
        conn = connect(self._file)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                sid, changed = _resolve(
                    conn.execute, "?", signature_id, note, by, time.time() if at is None else at
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        return self.signature(sid), changed

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Open the file, migrate its schema and start the writer thread. Idempotent.

        Raises StoreError (naming the path) for a file that is not a usable oomguard store.

        >>> FailureStore("/var/lib/oomguard/history.sqlite3").start()
        """
        if self._started:
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
        conn = connect(self._file)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
            conn.execute("PRAGMA temp_store = MEMORY")  # the per-batch GROUP BY and DISTINCT
            require_json(conn, self._file)
            migrate(conn, self._file, self.migrations)
            conn.execute(CREATE_BATCH_MEMBERS)  # TEMP: the connection's own, not the file's
            self.writer.start(conn)
        except BaseException:
            conn.close()
            raise
        self.reader.open(self._file)
        self._started = True

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is queued, stop the writer, close every connection. Idempotent; safe
        when start() never ran (then nothing queued is written).

        >>> store.close()
        """
        if self._closed:
            return
        self._closed = True
        self.reader.refuse()  # reads from now on are refused
        if not self.writer.close(timeout):
            return  # the writer still owns its connection; it exits on its own
        self.reader.close(timeout)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if self.history is not None:
            self.history.close()


@_read
def _fetch(reader: Reader, sql: str, args: Any) -> list[tuple]:
    """One query of `reader` (a read as its own methods are: counted, refused once closed)."""
    return reader._reader().execute(sql, args).fetchall()
