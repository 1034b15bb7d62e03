"""The shipper: one thread that sends what a scheduler's local store (the spool) committed to
the PostgreSQL history, in order and exactly once, never on the event loop's path.

The spool is the SQLite store the scheduler writes anyway: every event has an id there that
is never reused. The shipper sends the events above the last id sent (`ship_state.sent`),
the deletions amends made (`ship_deletes`) and the pipeline runs changed since last sent
(`shipped = 0`), in one PostgreSQL transaction per batch, and only then moves the spool's
marks: in the spool writer's next transaction, so that the shipper never waits for the
file's write lock. Killed between the two, it sends the batch again: an event is inserted
once per (origin, local id), and only inserted events are counted. While the database is
away the spool keeps everything up to its own bounds (max-events); the shipper retries with
backoff, one WARNING when it goes and one when it is back. A row the history refuses as
data is set aside, and every other row goes through (`aside.py`).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
import uuid
from typing import Any

from ..._exceptions import StoreError
from ..._urls import error_line, redact
from ..batch import ShipMark, apply_mark
from ..schema import connect as connect_spool
from ..store import FailureStore
from . import deaths as _deaths
from . import sql
from .aside import Book, SetAside, Synced, record, run_item, split
from .environments import EnvironmentShipper
from .schema import NAMESPACE, migrate
from .states import AliasShipper, regress

logger = logging.getLogger("oomguard.store")

#: Events sent per PostgreSQL transaction at most.
BATCH = 10_000
#: Seconds between attempts while the database is away: doubling from the first to the last.
RETRY = (0.5, 30.0)
#: Seconds between two retention passes on the history.
RETENTION_EVERY = 60.0


def pg_connect(url: str, timeout: float = 5.0) -> Any:
    """A psycopg connection to `url` with oomguard's schema first on the search path.
    libpq takes the password from the URL, PGPASSWORD, or a password file (`passfile=`,
    ~/.pgpass); TLS from `sslmode=` and friends. A failure raises the driver's error with
    no secret of the URL in it (libpq quotes a malformed part of the URL), unchained."""
    import psycopg

    try:
        return psycopg.connect(
            url,
            connect_timeout=max(1, int(timeout)),
            application_name="oomguard",
            options=f"-c search_path={NAMESPACE} -c statement_timeout=60000",
        )
    except psycopg.Error as e:
        error = _scrubbed(e, url)
    raise error  # out of the except: the driver's own error is not kept as its context


def _scrubbed(e: BaseException, url: str) -> BaseException:
    try:
        return type(e)(error_line(e, url))
    except Exception:
        return StoreError(error_line(e, url))


class Shipper:
    """Sends `spool`'s commits to the history at `url` (see the module docstring), each
    event and run under the cluster it was stored with. `cluster`: this scheduler's, whose
    events and runs in the history `max_events` and `max_pipelines` bound."""

    def __init__(
        self,
        spool: FailureStore,
        url: str,
        cluster: str,
        *,
        max_events: int = 1_000_000,
        max_signatures: int = 100_000,
        max_pipelines: int = 10_000,
        max_age: float | None = None,
        batch: int = BATCH,
    ) -> None:
        self.spool = spool
        self.url = url
        self.cluster = cluster
        self.max_events = max_events
        self.max_signatures = max_signatures
        self.max_pipelines = max_pipelines
        self.max_age = max_age
        self.batch = batch
        self.member_rows = spool.member_rows
        self.up: bool | None = None  # None: not tried yet
        self.refused = ""  # the history cannot be used (a newer schema): why
        self.sent = 0  # events this shipper inserted into the history
        # Rows the history refused as data (set aside: in the spool only; aside.py).
        self.aside = Book(redact(url), spool.path)
        self.outages = 0
        self.errors = 0
        self.last_error = ""
        self.backlog = 0  # events in the spool not sent yet, as of the last round
        self.origin = ""
        self.deaths = _deaths.DeathShipper(redact(url), batch)  # the spool's deaths, its part
        self.environments = EnvironmentShipper(redact(url))  # its workers' environments
        self.aliases = AliasShipper()  # the old ids of the spool's signatures, its part
        self.regressions = 0  # signatures its events found regressed (and `deaths`, `aliases`)
        self._cursor = 0  # the last event id sent
        # Sent, their marks maybe not stored yet: deletions (seq, event id), runs (key: updated).
        self._deletes_sent: set[tuple] = set()
        self._runs_sent: set[tuple] = set()  # (cluster, name, started, updated)
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pg: Any = None
        self._local: Any = None
        self._down_since: float | None = None
        self._retry = RETRY[0]
        self._next_retention = 0.0
        self._rounds = threading.Condition()
        self._round = 0  # rounds completed
        self._clean = 0  # the last round that found nothing to send
        self._want = 0  # the clean round a sync() waits for

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Read (or make) the spool's origin and mark, then start the thread. The database is
        not contacted here: a scheduler starts whether or not it is reachable."""
        local = connect_spool(self.spool.file)
        state = "SELECT key, value FROM ship_state"
        try:
            rows = dict(local.execute(state).fetchall())
            if "origin" not in rows:  # the first shipper of this spool: the only write here
                local.execute("BEGIN IMMEDIATE")
                rows = dict(local.execute(state).fetchall())
                if "origin" not in rows:
                    rows["origin"] = uuid.uuid4().hex
                    local.execute("INSERT INTO ship_state VALUES ('origin', ?)", (rows["origin"],))
                local.execute("COMMIT")
        except BaseException:
            local.close()
            raise
        self._local = local
        self.origin = rows["origin"]
        self._cursor = int(rows.get("sent", 0))
        self.deaths.start(rows)
        self.spool.ships = True
        self.spool.on_commit = self._wake.set
        self._thread = threading.Thread(target=self._run, name="oomguard-ship", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """One last round (within `timeout`), then stop. What is not sent stays in the spool
        and goes with the next scheduler that opens it."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning(
                "oomguard: the history %s did not take the last batch within %.0f s; "
                "it stays in the spool %s",
                redact(self.url),
                timeout,
                self.spool.path,
            )
            return
        if not self.spool.flush_marks(timeout):  # the spool's writer stopped first
            try:
                self._mark_here(ShipMark(self._cursor, [], [], self.deaths.cursor))
            except sqlite3.Error as e:  # sent again by the next shipper: no loss
                self.last_error = f"spool: {e!r}"
        for conn in (self._pg, self._local):
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
        self._pg = self._local = None

    def sync(self, timeout: float = 30.0) -> Synced:
        """Block until what the spool had committed and queued at this call is in the
        history (the spool flushed first), each row sent or set aside: true then, with the
        rows set aside meanwhile (`Synced.set_aside`). False on timeout: the history is
        away."""
        deadline = time.monotonic() + timeout
        if not self.spool.flush(timeout):
            return Synced(False)
        with self._rounds:
            seen = self.aside.total
            target = self._round + 1  # a round that starts after this call
            self._want = max(self._want, target + 1)
            self._wake.set()
            done = self._rounds.wait_for(
                lambda: self._clean > target, max(0.0, deadline - time.monotonic())
            )
        return Synced(done, self.aside.since(seen))

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self._retry if self.up is False else 1.0)
            self._wake.clear()
            stopping = self._stopping
            try:
                pending = self._round_once()
            except sqlite3.Error as e:  # the spool was busy or failed: the next round
                pending = True
                self.errors += 1
                self.last_error = f"spool: {e!r}"
            except Exception as e:  # never let the shipper die: count, log, go on
                pending = True
                self._away(e)
                self._count_backlog()
            with self._rounds:
                self._round += 1
                if not pending:
                    self._clean = self._round
                waited = self._want > self._clean  # a sync() waits for a later round
                self._rounds.notify_all()
            if (pending or waited) and self.up:
                self._wake.set()  # more to send, or a sync() waiting: no wait
            if stopping:
                return

    def _round_once(self) -> bool:
        """Send one batch; whether anything was left to send."""
        if self.refused:
            return True
        if (self._pg is None or self._pg.closed) and not self._connect():
            return True
        events, deletes, pipelines, examples = self._read()
        self.aliases.round(self._local, self._pg)  # before the signatures they fold
        self._ship_deaths()
        self.environments.round(self._local, self._pg)
        if not (events or deletes or pipelines):
            self.backlog = 0
            self._retention()
            return self.deaths.full
        try:
            self._send(events, deletes, pipelines, examples)
        except _data_errors():
            # A row PostgreSQL refuses would stop every later one: set it aside, send the rest.
            self._pg.rollback()
            self._split(events, deletes, pipelines, examples)
        self._mark(events, deletes, pipelines)
        self._retention()
        return len(events) == self.batch or bool(deletes) or bool(pipelines) or self.deaths.full

    def _ship_deaths(self) -> None:
        """The spool's deaths: sent apart from the events (`pg/deaths.py`), their mark
        moved as the events' is."""
        mark = self.deaths.round(self._local, self._pg, self.origin, _data_errors())
        if mark is not None and not self.spool.mark_shipped(mark):
            self._mark_here(mark)

    def _count_backlog(self) -> None:
        """The events waiting in the spool, while the history is away (a range count)."""
        try:
            (self.backlog,) = self._local.execute(sql.SPOOL_BACKLOG, (self._cursor,)).fetchone()
        except Exception as e:
            self.last_error = f"spool: {e!r}"

    def _connect(self) -> bool:
        """Connect and migrate; False (said and counted) when the history is away or
        refused."""
        try:
            conn = pg_connect(self.url)
        except Exception as e:
            self._away(e)
            self._count_backlog()
            return False
        try:
            migrate(conn, self.url)
            conn.execute(sql.CREATE_STAGE)
            conn.execute(_deaths.CREATE_STAGE)
            conn.commit()
        except StoreError as e:
            conn.close()
            if getattr(e, "kind", "") == "newer_schema":
                self.refused = str(e)
                logger.warning("oomguard: %s Events stay in the spool %s.", e, self.spool.path)
                return False
            raise
        self._pg = conn
        if self.up is not True:
            self._back()
        return True

    def _read(self) -> tuple[list, list, list, dict[str, str]]:
        """One consistent snapshot of what the spool has to send."""
        local = self._local
        local.execute("BEGIN")
        try:
            events = local.execute(sql.SPOOL_EVENTS, (self._cursor, self.batch)).fetchall()
            rows = local.execute(sql.SPOOL_DELETES, (2 * self.batch,)).fetchall()
            deletes, self._deletes_sent = _unsent(rows, tuple, self._deletes_sent, 2 * self.batch)
            deletes = deletes[: self.batch]
            rows = local.execute(sql.SPOOL_PIPELINES, (1000,)).fetchall()
            pipelines, self._runs_sent = _unsent(rows, _run_key, self._runs_sent, 1000)
            ids = sorted({e[9] for e in events})
            examples: dict[str, str] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ", ".join("?" * len(chunk))
                examples.update(
                    local.execute(
                        f"SELECT id, example FROM signatures WHERE example <> '' "
                        f"AND id IN ({marks})",
                        chunk,
                    ).fetchall()
                )
            last = events[-1][0] if events else self._cursor
            self.backlog = local.execute(sql.SPOOL_BACKLOG, (last,)).fetchone()[0] + len(events)
        finally:
            local.execute("COMMIT")
        return events, deletes, pipelines, examples

    def _split(self, events: list, deletes: list, pipelines: list, examples: dict) -> None:
        """After a batch was refused as data: each kind of row sent in halves, down to the
        rows the history refuses, which are set aside (aside.py)."""
        aside = []
        for kind, rows, send, item, cluster in (
            ("event", events, lambda p: self._send(p, [], [], {}), _first, _second),
            ("example", sorted(examples.items()), lambda p: self._send([], [], [], dict(p)),
             _first, None),
            ("delete", deletes, lambda p: self._send([], p, [], {}), _first, None),
            ("run", pipelines, lambda p: self._send([], [], p, {}), run_item, _first),
        ):  # fmt: skip
            for row, error in split(rows, send, _data_errors(), self._pg.rollback):
                where = cluster(row) if cluster is not None else self.cluster
                aside.append(record(kind, item(row), error_line(error, self.url), where))
        if aside:
            self._set_aside(aside)

    def _set_aside(self, aside: list[SetAside]) -> None:
        """Count and keep the rows set aside (the first of a kind logged), and record them
        in the history's `set_aside` table for `oomguard doctor --store`."""
        self.aside.add(aside)
        self.errors += len(aside)
        self.last_error = str(aside[-1])
        try:
            with self._pg.transaction(), self._pg.cursor() as cur:
                cur.executemany(
                    sql.SET_ASIDE,
                    [(self.origin, a.cluster, a.kind, a.item, a.reason, a.time) for a in aside],
                )
        except Exception as e:  # counted and logged all the same
            self.last_error = f"recording rows set aside: {error_line(e, self.url)}"
            with contextlib.suppress(Exception):  # a broken connection: the next round
                self._pg.rollback()

    def _send(self, rows: list, deletes: list, pipelines: list, examples: dict) -> None:
        """One transaction: events (`rows`), signatures' examples, deletions, runs."""
        with self._pg.transaction(), self._pg.cursor() as cur:
            inserted = found = 0
            if rows:
                with cur.copy(sql.COPY_STAGE) as copy:
                    for row in rows:
                        copy.write_row(row)
                cur.execute(sql.INSERT_STAGED, {"origin": self.origin, "rows": self.member_rows})
                inserted, _ = cur.fetchone()
                found = regress(cur, "stage")
            if examples:
                cur.executemany(sql.SET_EXAMPLE, [(ex, sid) for sid, ex in examples.items()])
            if deletes:
                cur.execute(sql.DELETE_SENT, (self.origin, [d[1] for d in deletes]))
            if pipelines:
                cur.executemany(sql.UPSERT_PIPELINE, pipelines)
        self.sent += inserted
        self.regressions += found

    def _mark(self, events: list, deletes: list, pipelines: list) -> None:
        """The batch is in the history: move past it here, and in the spool's file with the
        writer's next transaction (or here, when the writer is not running)."""
        if events:
            self._cursor = events[-1][0]
            self.backlog = max(0, self.backlog - len(events))
        self._deletes_sent.update(deletes)
        runs = [_run_key(p) for p in pipelines]
        self._runs_sent.update(runs)
        if events or deletes or runs:
            mark = ShipMark(self._cursor, deletes, runs)
            if not self.spool.mark_shipped(mark):
                self._mark_here(mark)

    def _mark_here(self, mark: ShipMark) -> None:
        local = self._local
        local.execute("BEGIN IMMEDIATE")
        try:
            apply_mark(local, mark)
            local.execute("COMMIT")
        except BaseException:
            local.execute("ROLLBACK")
            raise

    def _retention(self) -> None:
        """Every RETENTION_EVERY seconds: this cluster's events past max-events, everyone's
        past max-age, signatures past max-signatures, this cluster's runs past max-pipelines."""
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + RETENTION_EVERY
        with self._pg.transaction(), self._pg.cursor() as cur:
            cur.execute(sql.CLUSTER_EVENTS, (self.cluster,))
            (n,) = cur.fetchone()
            if n > self.max_events:
                cur.execute(sql.DROP_CLUSTER_EVENTS, (self.cluster, n - self.max_events))
            if self.max_age is not None:
                cur.execute(sql.DROP_OLD_EVENTS, (time.time() - self.max_age,))
            oldest = time.time() - self.max_age if self.max_age is not None else None
            _deaths.retention(cur, self.cluster, self.max_events, oldest)
            cur.execute("SELECT count(*) FROM signatures")
            (n,) = cur.fetchone()
            if n > self.max_signatures:
                cur.execute(sql.DROP_SIGNATURES, (n - self.max_signatures,))
            cur.execute("SELECT count(*) FROM pipelines WHERE cluster = %s", (self.cluster,))
            (n,) = cur.fetchone()
            if n > self.max_pipelines:
                cur.execute(sql.DROP_PIPELINES, (self.cluster, n - self.max_pipelines))

    # -- the database's state -------------------------------------------------------------

    def _away(self, error: BaseException) -> None:
        self.errors += 1
        self.last_error = error_line(error, self.url)
        if self._pg is not None:
            try:
                self._pg.close()
            except Exception:
                pass
            self._pg = None
        if self.up is not False:
            self.up = False
            self.outages += 1
            self._down_since = time.monotonic()
            self._retry = RETRY[0]
            logger.warning(
                "oomguard: the history %s is away (%s); events are kept in the spool %s "
                "(up to oomguard.scheduler.max-events) and sent when it is back",
                redact(self.url),
                self.last_error,
                self.spool.path,
            )
        else:
            self._retry = min(RETRY[1], self._retry * 2)

    def _back(self) -> None:
        was = self._down_since
        self.up = True
        self._retry = RETRY[0]
        self._down_since = None
        if was is not None:
            logger.warning(
                "oomguard: the history %s is back after %.0f s; sending the spool's %d events",
                redact(self.url),
                time.monotonic() - was,
                self.backlog,
            )
        else:
            logger.info("oomguard: sending failure events to the history %s", redact(self.url))


def _unsent(rows: list, key: Any, sent: set, limit: int) -> tuple[list, set]:
    """`rows` less those whose key is in `sent` (sent, their marks not stored yet by the
    spool's writer), and `sent` kept to the keys still read when `rows` is all there is
    (fewer than `limit`): the others' marks are stored."""
    keys = [key(r) for r in rows]
    if len(rows) < limit:
        sent = sent.intersection(keys)
    return [r for r, k in zip(rows, keys) if k not in sent], sent


def _run_key(p: tuple) -> tuple:
    """A spool's pipelines row as its mark names it: (cluster, name, started, updated)."""
    return (p[0], p[1], p[2], p[11])


def _first(row: tuple) -> Any:
    return row[0]


def _second(row: tuple) -> Any:
    return row[1]


def _data_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.ProgramLimitExceeded)
