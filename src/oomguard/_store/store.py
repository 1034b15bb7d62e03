"""FailureStore: the failure history of one scheduler, its configuration, state and
lifecycle (start, close); its writes and reads are in `writer` and `reads`."""

from __future__ import annotations

import collections
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from .batch import CREATE_BATCH_MEMBERS, ShipMark
from .reads import ReaderMixin
from .schema import MIGRATIONS, check_file, connect, migrate, require_json
from .writer import FULL_RETRY, WAL_CHECKPOINT_PAGES, WRITER_CACHE_KIB, WriterMixin


class FailureStore(WriterMixin, ReaderMixin):
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

    #: Longest list returned per SignatureRow field; distinct_counts() has the true numbers.
    member_cap: int = 1000
    #: The schema's migrations; a subclass may append (tests do).
    migrations: tuple[tuple[str, ...], ...] = MIGRATIONS

    #: A spool of a PostgreSQL history (`oomguard._store.pg`): amends record what they
    #: delete, and `on_commit` is called on the writer thread after each commit.
    ships: bool = False
    on_commit: Callable[[], None] | None = None
    #: The PostgreSQL history this store is the spool of (`oomguard._store.pg.History`);
    #: closed after the store.
    history: Any = None

    written: int  # events committed by this instance
    overflow: int  # items refused because the queue was full
    write_errors: int  # items refused as bad data, or lost with a failed transaction
    disk_full: int  # times the writer found the disk full (see WriterMixin._write_batch)
    last_error: str

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
        if not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, got {max_events!r}.")
        if not isinstance(max_signatures, int) or max_signatures < 1:
            raise ValueError(f"max_signatures must be a positive integer, got {max_signatures!r}.")
        if not isinstance(queue_bytes, int) or queue_bytes < 1:
            raise ValueError(f"queue_bytes must be a positive integer, got {queue_bytes!r}.")
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
        self.max_signatures = max_signatures
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self.full_retry = FULL_RETRY
        self.batch_interval = float(batch_interval)
        self.max_pipelines = max_pipelines
        self.member_rows = member_rows
        self.written = 0
        self.overflow = 0
        self.write_errors = 0
        self.disk_full = 0
        self.last_error = ""
        self._file = ""  # the real file: `path`, or a temporary one for ":memory:"
        self._tmpdir: str | None = None
        self._queue: collections.deque[tuple] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()  # item_size of each
        self._queued_bytes = 0
        self._refusing = False  # the queue is full: the WARNING was logged
        self._full_since: float | None = None  # monotonic time the disk was found full
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
        self._idle: list[sqlite3.Connection] = []
        # Reads in progress on any thread: close() waits for them before it closes the
        # readers' connections (closing one under a running query crashes the process).
        self._reads = 0
        self._reads_done = threading.Condition(self._lock)
        self._event_count = 0
        self._signature_count = 0
        self._last_log = 0.0
        self._ship_mark: ShipMark | None = None  # the shipper's, for the next transaction
        self._marks_asked = 0  # mark_shipped() calls taken
        self._marks_done = 0  # of those, committed
        self._writer_gone = False  # the writer thread ended
        self._interval = self.batch_interval

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
            self._event_count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            self._signature_count = conn.execute("SELECT count(*) FROM signatures").fetchone()[0]
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name="oomguard-store", daemon=True)
        self._thread.start()
        # The first reader now, with the store's other descriptors: what starts later (a
        # worker joining, a query) finds it idle instead of opening one of its own.
        try:
            self._idle.append(self._open_reader())
        except sqlite3.Error:
            pass  # the first read opens it

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
                self._error(
                    f"close(): the writer did not stop within {timeout}s; "
                    f"{len(self._queue)} queued items were not written"
                )
                return  # the writer still owns its connection; it exits on its own
        with self._lock:
            if not self._reads_done.wait_for(lambda: self._reads == 0, timeout):
                self._error(
                    f"close(): {self._reads} reads still running after {timeout}s; "
                    "their connections stay open"
                )
                readers = []
            else:
                readers, self._readers, self._idle = self._readers, [], []
        for conn in readers + ([self._conn] if self._conn is not None else []):
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._conn = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if self.history is not None:
            self.history.close()
