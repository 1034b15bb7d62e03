"""The writes of a FailureStore: add(), record() and upsert_pipeline() append to a bounded
queue on the caller's thread (no I/O); one writer thread commits the queue in batches, one
transaction each, with the death, signature, member and retention updates done by SQLite."""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence

from .._death.record import Death, Environment
from .._models import FailureEvent, PipelineStatus
from .aliases import Queued
from .batch import Counts, Limits, ShipMark, commit_batch, disk_full
from .environments import item as environment_item
from .items import death_item, describe_event, event_item, item_size, pipeline_row

logger = logging.getLogger("oomguard.store")

#: Items committed per transaction at most. Large: the shard index and signature_members
#: take keys in random order, so a commit rewrites nearly every page of them it touches;
#: fewer, larger commits write far fewer pages per event (see .notes/perf-store.md).
BATCH_EVENTS = 50_000
#: The writer's page cache (KiB) and WAL checkpoint interval (pages): same reason.
WRITER_CACHE_KIB = 32 * 1024
WAL_CHECKPOINT_PAGES = 16_384
#: Seconds between retries while the disk is full (each retry commits one item).
FULL_RETRY = 1.0
#: A commit of FLOOD_ITEMS items or more means a flood of events: until a commit is smaller,
#: the writer commits every FLOOD_INTERVAL seconds instead of every batch_interval. Fewer,
#: larger transactions: each has a fixed cost (the signature and member statements), and
#: under a flood that cost is what limits the rate (with a PostgreSQL history:
#: docs/performance.md). One event alone still waits batch_interval at most.
FLOOD_ITEMS = 500
FLOOD_INTERVAL = 0.25


class Writer:
    """The writes of a FailureStore: add(), record(), upsert_pipeline(), flush() and the
    shipper's marks queue on the caller's thread; one writer thread commits the queue.
    It owns the queue, the thread, the writer's connection (given by `start`) and the
    counters below; the settings may change while it runs (`configure_store`)."""

    written: int  # events committed by this writer
    regressions: int  # signatures this writer found regressed (a sighting after a resolve)
    overflow: int  # items refused because the queue was full
    write_errors: int  # items refused as bad data, or lost with a failed transaction
    disk_full: int  # times the writer found the disk full (see _write_batch)
    last_error: str
    interval: float  # seconds until the next commit (batch_interval, or longer in a flood)
    #: A spool of a PostgreSQL history (`oomguard._store.pg`): amends record the events
    #: they delete, and `on_commit` is called on the writer thread after each commit.
    ships: bool
    on_commit: Callable[[], None] | None

    def __init__(
        self,
        path: str,
        *,
        max_events: int,
        max_signatures: int,
        queue_size: int,
        queue_bytes: int,
        batch_interval: float,
        max_pipelines: int,
        member_rows: int,
    ) -> None:
        self.path = path  # for the log
        self.max_events = max_events
        self.max_signatures = max_signatures
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self.full_retry = FULL_RETRY
        self.batch_interval = float(batch_interval)
        self.max_pipelines = max_pipelines
        self.member_rows = member_rows
        self.written = 0
        self.regressions = 0
        self._aliases = Queued()  # the aliases queued so far
        self.overflow = 0
        self.write_errors = 0
        self.disk_full = 0
        self.last_error = ""
        self.interval = self.batch_interval
        self.ships = False
        self.on_commit = None
        self._queue: collections.deque[tuple] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()  # item_size of each
        self._queued_bytes = 0
        self._refusing = False  # the queue is full: the WARNING was logged
        self._full_since: float | None = None  # monotonic time the disk was found full
        self._lock = threading.Lock()  # makes "check length, append, count" one step
        self._closed = False
        self._enqueued = 0  # items ever queued; an item's sequence number is its rank
        self._processed = 0  # items taken from the queue: committed, or lost (see _lost)
        self._lost: collections.deque[tuple[int, int]] = collections.deque(maxlen=1024)
        self._done = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._counts = Counts(0, 0, 0, 0)  # in the file (events, deaths, signatures)
        self._last_log = 0.0
        self._ship_mark: ShipMark | None = None  # the shipper's, for the next transaction
        self._marks_asked = 0  # mark_shipped() calls taken
        self._marks_done = 0  # of those, committed
        self._writer_gone = False  # the writer thread ended

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, conn: sqlite3.Connection) -> None:
        """Take the store's migrated connection and start the writer thread."""
        (events,) = conn.execute("SELECT count(*) FROM events").fetchone()
        (deaths,) = conn.execute("SELECT count(*) FROM deaths").fetchone()
        (signatures,) = conn.execute("SELECT count(*) FROM signatures").fetchone()
        self._counts = Counts(events, deaths, signatures, 0)
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name="oomguard-store", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: float) -> bool:
        """Refuse new items, commit what is queued, stop the thread and close the
        connection. False when the thread did not stop within `timeout` (it keeps its
        connection and exits on its own)."""
        with self._lock:
            self._closed = True
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._error(
                    f"close(): the writer did not stop within {timeout}s; "
                    f"{len(self._queue)} queued items were not written"
                )
                return False
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
        return True

    # -- writes (from the event loop) -----------------------------------------------------

    def add(
        self,
        event: FailureEvent,
        *,
        grouping_version: int = 1,
        example: str = "",
        aliases: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """Queue one failure event. Never blocks, never raises, no I/O: it checks the fields,
        encodes the evidence as JSON (small, so O(1) in practice) and appends to the queue.

        Returns False when the event was refused: the queue is full (counted in `overflow`),
        a field is bad (counted in `write_errors`, `last_error` names the field) or the
        store is closed. The event's `id` is ignored: the store assigns one. `aliases`: the
        ids older grouping versions gave its signature, (id, version) (`aliases.py`).

        >>> store.add(event, grouping_version=1, example=normalised_trace)
        True
        """
        try:
            item = event_item(event, grouping_version, example)
        except Exception as e:  # a scheduler hook must never raise
            self._error(f"add(): {describe_event(event)}: {e}")
            return False
        self._put_aliases(aliases, item[7], grouping_version, item[0])
        return self._put(item)

    def record(
        self,
        death: Death,
        events: Sequence[FailureEvent],
        *,
        grouping_version: int = 1,
        example: str = "",
        amend: bool = False,
        aliases: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """Queue one decided worker death with the events of the tasks it is blamed on
        (each names it: its `death` is the death's id, its cluster the death's), written in
        one transaction. As `add`: never blocks, never raises, no I/O on the caller's
        thread; False when refused (`last_error` names a bad field).

        The death is stored once per (cluster, id): a repeat is dropped. `amend=True`
        replaces the stored death of that (cluster, id) and its events (a late report, a
        pod's or SLURM's verdict on a worker lost with its nanny); its signature's count
        moves from the old signature to the new one. A signature counts each death that
        carries it once, however many of its events name it. `aliases` as for `add`.

        >>> store.record(death, [event], grouping_version=1, example=normalised_trace)
        True
        """
        try:
            item = death_item(death, events, grouping_version, example, amend)
        except Exception as e:  # a scheduler hook must never raise
            self._error(f"record(): death {getattr(death, 'id', '?')!r}: {e}")
            return False
        self._put_aliases(aliases, item[0][7], grouping_version, item[0][2])
        return self._put(item)

    def _put_aliases(self, aliases: Sequence, new_id: str, version: int, when: float) -> None:
        what = f"aliases of signature {new_id!r}"
        self._build(what, lambda: self._aliases.new(aliases, new_id, version, when))

    def upsert_pipeline(self, status: PipelineStatus) -> None:
        """Queue the latest status of one run of a pipeline: it replaces the stored status
        of the same (name, started), not the other runs of that name. As add(): never
        blocks, never raises; a refusal is counted in `overflow` or `write_errors`.

        Past `max_pipelines` runs, the writer deletes the least recently updated finished
        ones (status other than "running") in the same commit; it never deletes a running one.

        >>> store.upsert_pipeline(PipelineStatus("nightly", "running", 10, 0, 0, 0, 0, "",
        ...                                      started=1_790_000_000.0))
        """
        self._build("upsert_pipeline()", lambda: (pipeline_row(status, time.time()),))

    def worker_environment(
        self, cluster: str, slot: str, environment: Environment, time: float
    ) -> bool:
        """Queue the environment a worker of `cluster` said at its start (`slot`: its
        nanny; see `environments`). As `add`: never blocks, never raises, no I/O.

        >>> store.worker_environment("etl", "tcp://10.0.0.5:40000", environment, 1.7e9)
        True
        """
        return self._build(
            "worker_environment()", lambda: environment_item(cluster, slot, environment, time)
        )

    def _build(self, what: str, make: Callable[[], tuple | None]) -> bool:
        """`_put` the item `make()` builds (None: nothing to put); False, the error counted,
        when it raises."""
        try:
            item = make()
        except Exception as e:
            self._error(f"{what}: {e}")
            return False
        return item is None or self._put(item)

    def _put(self, item: tuple) -> bool:
        size = item_size(item)
        with self._lock:
            if self._closed:
                self.write_errors += 1
                self.last_error = "the store is closed"
                return False
            if len(self._queue) >= self.queue_size or self._queued_bytes + size > self.queue_bytes:
                # The newest is refused: what is queued is older history, already accepted.
                self.overflow += 1
                if self._refusing:
                    return False
                self._refusing = was_full = True
            else:
                self._sizes.append(size)  # before its item: the writer pops both by items
                self._queue.append(item)
                self._queued_bytes += size
                self._enqueued += 1
                if not self._refusing:
                    return True
                self._refusing = was_full = False
        self._log_queue(was_full)  # once per episode: a flood must not flood the log
        return not was_full

    def _log_queue(self, full: bool) -> None:
        if full:
            logger.warning(
                "oomguard failure store %s: the write queue is full (%d items, %d of %d "
                "bytes); new events are refused and counted (oomguard_store_errors_total"
                '{kind="queue_full"}) until it drains%s',
                self.path,
                len(self._queue),
                self._queued_bytes,
                self.queue_bytes,
                " (the disk is full)" if self._full_since is not None else "",
            )
        else:
            logger.info(
                "oomguard failure store %s: the write queue takes events again "
                "(%d refused so far)",
                self.path,
                self.overflow,
            )

    @property
    def pending(self) -> int:
        """Items queued and not yet committed."""
        return len(self._queue)

    @property
    def pending_bytes(self) -> int:
        """The encoded size of the items queued (`items.item_size`), capped by queue_bytes."""
        return self._queued_bytes

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

    # -- the shipper's marks (pg/ship.py) -------------------------------------------------

    def mark_shipped(self, mark: ShipMark) -> bool:
        """Move the spool's marks past `mark` in the writer's next transaction, so that the
        shipper never waits for the file's write lock. No I/O. False when the writer is not
        running: the caller writes the mark itself."""
        with self._lock:
            if self._closed or self._thread is None or not self._thread.is_alive():
                return False
            self._ship_mark = mark if self._ship_mark is None else self._ship_mark.merge(mark)
            self._marks_asked += 1
        self._wake.set()
        return True

    def flush_marks(self, timeout: float = 10.0) -> bool:
        """Block until every mark taken before this call is committed. False on timeout or
        when the writer stopped first (then the caller writes the mark itself)."""
        with self._lock:
            target = self._marks_asked
        with self._done:
            if self._marks_done >= target:
                return True
            self._wake.set()
            self._done.wait_for(lambda: self._marks_done >= target or self._writer_gone, timeout)
            return self._marks_done >= target

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        self.interval = self.batch_interval
        while True:
            full = self._full_since is not None
            self._wake.wait(max(self.full_retry, self.interval) if full else self.interval)
            self._wake.clear()
            stopping = self._stopping
            flood = len(self._queue) >= FLOOD_ITEMS
            self.interval = (
                max(self.batch_interval, FLOOD_INTERVAL) if flood else self.batch_interval
            )
            try:
                while self._queue and self._write_batch():
                    pass
                if self._ship_mark is not None and self._full_since is None:
                    self._commit([])  # a mark with no item to go with
            except Exception as e:  # never let the writer die: count, log, go on
                self._error(f"writer: {e!r}")
            if stopping and (not self._queue or self._full_since is not None):
                self._abandon()
                with self._done:
                    self._writer_gone = True  # flush_marks() waits no longer
                    self._done.notify_all()
                return

    def _write_batch(self) -> bool:
        """Commit the head of the queue; False when the disk is full. A batch that does not
        fit is committed in halves, down to single items: what fits is written, the rest
        stays at the head of the queue, in order, and is retried every `full_retry` seconds
        one item first."""
        queue, sizes = self._queue, self._sizes
        n = min(1 if self._full_since is not None else BATCH_EVENTS, len(queue))
        items = [queue.popleft() for _ in range(n)]
        taken = [sizes.popleft() for _ in range(n)]
        done = self._commit_fitting(items, self._processed)
        if done < n:
            sizes.extendleft(reversed(taken[done:]))
            queue.extendleft(reversed(items[done:]))
        with self._lock:
            self._queued_bytes -= sum(taken[:done])
        if done < n and self._full_since is None:
            self._full_since = time.monotonic()
            self.disk_full += 1
            logger.warning(
                "oomguard failure store %s: the disk is full; %d items (%d bytes) wait in "
                "memory, up to oomguard.scheduler.store-queue-limit (%d bytes), and are "
                "written once there is room (retried every %.1f s)",
                self.path,
                len(queue),
                self._queued_bytes,
                self.queue_bytes,
                max(self.full_retry, self.batch_interval),
            )
        elif done == n and self._full_since is not None:
            logger.warning(
                "oomguard failure store %s: the disk has room again after %.0f s; writing "
                "the %d queued items",
                self.path,
                time.monotonic() - self._full_since,
                len(queue),
            )
            self._full_since = None
        return done == n

    def _commit_fitting(self, items: list[tuple], first: int) -> int:
        """How many of `items`, from the first, are done (committed, or lost to an error
        other than a full disk); `first` is the sequence number before them."""
        try:
            self._commit(items)
        except sqlite3.Error as e:
            if not disk_full(e):
                self._finish(first, len(items), e)
                return len(items)
            if len(items) == 1:
                self.last_error = f"writer: the disk is full: {e!r}"
                return 0
            half = len(items) // 2
            done = self._commit_fitting(items[:half], first)
            if done < half:
                return done
            return half + self._commit_fitting(items[half:], first + half)
        except Exception as e:
            self._finish(first, len(items), e)
            return len(items)
        self._finish(first, len(items))
        return len(items)

    def _finish(self, first: int, n: int, error: BaseException | None = None) -> None:
        if error is not None:
            self._error(f"writer: a batch of {n} items was not committed: {error!r}")
        with self._done:
            if error is not None:
                self._lost.append((first, first + n))
            self._processed = first + n
            self._done.notify_all()

    def _abandon(self) -> None:
        """At close with the disk still full: what is queued is lost, counted and said."""
        n = len(self._queue)
        if not n:
            return
        self._queue.clear()
        self._sizes.clear()
        with self._lock:
            self._queued_bytes = 0
        self._finish(self._processed, n, OSError(f"the disk is still full at close ({n} items)"))

    def _commit(self, items: list[tuple]) -> None:
        """One transaction of `items`; raises (rolled back) when it fails."""
        assert self._conn is not None
        bounds = (self.member_rows, self.max_pipelines, self.max_events, self.max_signatures)
        limits = Limits(*self._counts[:3], *bounds, self.ships)  # counts: events, deaths, sigs
        with self._lock:
            mark, self._ship_mark = self._ship_mark, None
            asked = self._marks_asked
        try:
            self._counts = commit_batch(self._conn, items, limits, mark)
        except BaseException:
            if mark is not None:  # taken again by the next transaction
                with self._lock:
                    self._ship_mark = mark.merge(self._ship_mark)
            raise
        self.written += self._counts.written
        self.regressions += self._counts.regressed
        if mark is not None:
            with self._done:
                self._marks_done = asked
                self._done.notify_all()
        if self.on_commit is not None and items:
            self.on_commit()

    def _error(self, message: str) -> None:
        """Count and remember an error; log it once a minute at most."""
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
