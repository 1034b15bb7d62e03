"""The reads of a FailureStore, on the caller's thread, each with a read-only connection
while it runs: an idle one, or a new one (as many as ever ran at once, not one per thread
that ever read); in WAL mode a read never waits for the writer."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator

from .._death.record import Death
from .._models import FailureEvent, PipelineStatus, SignatureRow
from . import query
from .aliases import CANONICAL, signature_ids
from .deaths import death_from_row
from .links import SQLITE_RELATED, related_list
from .schema import MEMBER_FIELDS, PIPELINE_COLUMNS, connect
from .states import attach

logger = logging.getLogger("oomguard.store")

# A death without a report that named no shard is stored under shard '' (and pipeline ''
# when its suspects ran in several), its suspects in the evidence: a filter on a shard or a
# pipeline finds it too. Both terms use the column's index: only such rows are parsed.
_OR_SUSPECT = {
    "shard": "(shard = ? OR (shard = '' AND EXISTS (SELECT 1 FROM "
    "json_each(evidence, '$.suspects') WHERE value = ?)))",
    "pipeline": "(pipeline = ? OR (pipeline = '' AND shard = '' AND EXISTS (SELECT 1 FROM "
    "json_each(evidence, '$.suspect_pipelines') WHERE value = ?)))",
}
# A death's tasks (`death_tasks`): its culprit, suspects, displaced and queued tasks alike.
_AMONG_TASKS = {
    "shard": "seq IN (SELECT death FROM death_tasks WHERE shard = ?)",
    "pipeline": "seq IN (SELECT death FROM death_tasks WHERE pipeline = ?)",
}
SQLITE = query.Dialect("?", lambda name: f":{name}", _OR_SUSPECT, _AMONG_TASKS)
# Each member list comes back as one JSON array: one row per signature, not one per member;
# then its related signatures (`links.py`).
_SELECT_SIGNATURE = (
    "SELECT id, title, grouping_version, count, first_seen, last_seen, example, "
    + ", ".join(
        "(SELECT json_group_array(value) FROM (SELECT value FROM signature_members"
        f" WHERE signature_id = s.id AND field = {code} ORDER BY value LIMIT :cap))"
        for code in range(len(MEMBER_FIELDS))
    )
    + f", {SQLITE_RELATED} FROM signatures s"
)


def _read(method):
    """Counts the call as a read in progress (see `FailureStore.close`); refuses a read of
    a closed store with RuntimeError."""

    @functools.wraps(method)
    def read(self, *args, **kwargs):
        with self._lock:
            if self._closed:
                raise RuntimeError(f"FailureStore({self.path!r}) is closed.")
            self._reads += 1
        outer = getattr(self._local, "conn", None) is None  # not a read inside a read
        try:
            return method(self, *args, **kwargs)
        finally:
            conn = getattr(self._local, "conn", None) if outer else None
            if outer:
                self._local.conn = None
            with self._lock:
                if conn is not None:
                    self._idle.append(conn)
                self._reads -= 1
                self._reads_done.notify_all()

    return read


class Reader:
    """The reads of a FailureStore: events(), deaths(), shard(), signatures(), signature(),
    distinct_counts(), totals(), known() and the pipeline reads, each on the caller's
    thread with that thread's own read-only connection. It owns those connections and
    counts the reads in progress, which `close` waits for before closing them (closing one
    under a running query crashes the process)."""

    #: Longest list returned per SignatureRow field; distinct_counts() has the true numbers.
    member_cap: int = 1000

    def __init__(self, path: str) -> None:
        self.path = path  # as the store was given it, for messages
        self._file = ""  # the file, once `open`
        self._lock = threading.Lock()
        self._open = False
        self._closed = False
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._idle: list[sqlite3.Connection] = []  # readers no read uses now
        self._reads = 0  # in progress, on any thread
        self._reads_done = threading.Condition(self._lock)

    def open(self, file: str) -> None:
        """Reads may start: the store's file exists, migrated. The first reader opens now,
        with the store's other descriptors: what starts later (a worker joining, a query)
        finds it idle instead of opening one of its own."""
        self._file = file
        self._open = True
        with contextlib.suppress(sqlite3.Error):  # else the first read opens it
            self._idle.append(self._open_reader())

    def refuse(self) -> None:
        """Reads from now on are refused (RuntimeError)."""
        with self._lock:
            self._closed = True

    @property
    def reads(self) -> int:
        """Reads in progress."""
        return self._reads

    def close(self, timeout: float) -> None:
        """Refuse new reads, wait for those in progress, close every read connection."""
        with self._lock:
            self._closed = True
            if not self._reads_done.wait_for(lambda: self._reads == 0, timeout):
                msg = "oomguard failure store %s: close(): %d reads still running after %ss; %s"
                logger.error(msg, self.path, self._reads, timeout, "their connections stay open")
                return
            readers, self._readers, self._idle = self._readers, [], []
        for conn in readers:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def _reader(self) -> sqlite3.Connection:
        """The read connection of the read running on this thread; only inside a method
        marked `@_read`."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if not self._open or self._closed:
            state = "closed" if self._closed else "not started"
            raise RuntimeError(f"FailureStore({self.path!r}) is {state}; reads need start().")
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._open_reader()
        self._local.conn = conn
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        conn = connect(self._file)
        conn.execute("PRAGMA query_only = 1")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the WAL now
        with self._lock:
            self._readers.append(conn)
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
        killer: str | None = None,
        before: tuple[float, int] | None = None,
        max_bytes: int | None = None,
        cluster: str | None = None,
    ) -> list[FailureEvent]:
        """Stored events, newest first (by event time, then id), matching every filter given.
        `shard` and `pipeline` also match the one event of a death that named no shard
        when it lists the value among its (first 20) suspects or their pipelines. `cluster`:
        the events of that cluster only (None: of every cluster).

        Pages: `before` (time, id) of the last event of the previous page gives the ones
        after it in this order. `max_bytes` stops once the rows read hold that many
        characters of text (always at least one row): a page's memory is bounded.

        >>> [e.shard for e in store.events(cause="oom_kill", since=time.time() - 3600)]
        ["('load-0a1b', 17)"]
        """
        sql, args = query.events(
            SQLITE,
            kind=kind,
            cause=cause,
            pipeline=pipeline,
            shard=shard,
            signature=signature_ids(self._reader().execute, "?", signature),
            killer=killer,
            cluster=cluster,
            since=since,
            before=before,
            limit=_limit(limit),
        )
        return [_event(r) for r in _within(self._reader().execute(sql, args), max_bytes)]

    @_read
    def deaths(
        self,
        *,
        cluster: str | None = None,
        since: float | None = None,
        cause: str | None = None,
        killer: str | None = None,
        signature: str | None = None,
        worker: str | None = None,
        shard: str | None = None,
        pipeline: str | None = None,
        before: tuple[float, str] | None = None,
        limit: int | None = 1000,
        max_bytes: int | None = None,
    ) -> list[Death]:
        """Worker deaths, one each, newest first (by time, then id), matching every filter
        given: `shard` and `pipeline` match a death among whose tasks they are, whatever
        its role there (culprit, suspect, displaced or queued). Pages as `events` does,
        `before` (time, id) the last death of the previous page. Deaths stored before
        deaths had rows (an older oomguard) are not here: their events are.

        >>> [(d.cause, d.with_role(Role.CULPRIT)[0].key) for d in store.deaths(since=t)]
        [('oom_kill', "('load-0a1b', 17)")]
        """
        sql, args = query.deaths(
            SQLITE,
            cluster=cluster,
            since=since,
            cause=cause,
            killer=killer,
            signature=signature_ids(self._reader().execute, "?", signature),
            worker=worker,
            shard=shard,
            pipeline=pipeline,
            before=before,
            limit=_limit(limit),
        )
        rows = _within(self._reader().execute(sql, args), max_bytes)
        return [death_from_row(r) for r in rows]

    @_read
    def death_times(
        self, *, since: float | None = None, cluster: str | None = None, limit: int | None = None
    ) -> list[tuple[float, str]]:
        """(time, cause) of each death `deaths()` returns with these filters, newest first,
        without reading the deaths themselves: what a plot of them needs (the dashboard).

        >>> store.death_times(since=time.time() - 3600)
        [(1790000310.5, 'oom_kill'), (1790000012.0, 'native_crash')]
        """
        sql, args = query.deaths(
            SQLITE, cluster=cluster, since=since, cause=None, killer=None, signature=None,
            worker=None, shard=None, pipeline=None, before=None, limit=_limit(limit),
            columns="time, cause",
        )  # fmt: skip
        return self._reader().execute(sql, args).fetchall()

    @_read
    def shard(
        self,
        key: str,
        *,
        limit: int | None = None,
        after: tuple[float, int] | None = None,
        max_bytes: int | None = None,
        cluster: str | None = None,
    ) -> list[FailureEvent]:
        """One shard's own history, oldest first: the failures that name it (not a death
        it was only one suspect of; `events(shard=...)` finds those too), on `cluster`
        only where given. Pages as `events` does, `after` (time, id) the last event of the
        previous page.

        >>> [(e.attempt, e.cause) for e in store.shard("('load-0a1b', 17)")]
        [(1, 'oom_kill'), (2, 'oom_kill')]
        """
        sql, args = query.shard(SQLITE, key, cluster=cluster, after=after, limit=_limit(limit))
        return [_event(r) for r in _within(self._reader().execute(sql, args), max_bytes)]

    @_read
    def signatures(
        self,
        *,
        cause: str | None = None,
        pipeline: str | None = None,
        since: float | None = None,
        limit: int | None = 100,
        offset: int = 0,
        max_bytes: int | None = None,
        cluster: str | None = None,
    ) -> list[SignatureRow]:
        """Signatures seen with `cause` / in `pipeline` / on `cluster` / last seen at or
        after `since`, by count (lifetime, across every host and cluster) descending, then
        last seen descending. Pages: skip the first `offset`; `max_bytes` as for `events`.
        A signature's counts are never narrowed: on `cluster` means the cluster is among
        its `clusters` (as `cause` and `pipeline` look in its member lists).

        >>> [(s.title, s.count, len(s.hosts)) for s in store.signatures(limit=20)]
        [('MemoryError in parse_block', 3, 3)]
        """
        sql, params = query.signatures(
            SQLITE,
            _SELECT_SIGNATURE,
            cause=cause,
            pipeline=pipeline,
            cluster=cluster,
            since=since,
            cap=self.member_cap,
            limit=_limit(limit),
            offset=offset,
        )
        db = self._reader()
        rows = [_signature(r) for r in _within(db.execute(sql, params), max_bytes)]
        return attach(rows, db.execute, "?")

    @_read
    def totals(self) -> tuple[int, int]:
        """(signatures, the most distinct hosts of one signature), counted in SQL: no row
        is read into Python (the signature gauges, every few seconds).

        >>> store.totals()
        (4, 3)
        """
        db = self._reader()
        (n,) = db.execute("SELECT count(*) FROM signatures").fetchone()
        (hosts,) = db.execute(
            "SELECT coalesce(max(n), 0) FROM signature_distinct WHERE field = ?",
            (MEMBER_FIELDS.index("hosts"),),
        ).fetchone()
        return n, hosts

    @_read
    def signature(self, signature_id: str) -> SignatureRow | None:
        """One signature, or None; an old id (an older grouping's) finds its signature now.

        >>> store.signature("3f2a9c").hosts
        ['node-1', 'node-2', 'node-3']
        """
        db, args = self._reader(), {"id": signature_id, "cap": self.member_cap}
        sql = f"{_SELECT_SIGNATURE} WHERE id = {CANONICAL.format(':id')}"
        return next(
            iter(attach([_signature(r) for r in db.execute(sql, args)], db.execute, "?")), None
        )

    @_read
    def distinct_counts(self, signature_id: str) -> dict[str, int]:
        """The number of distinct hosts, workers, shards, pipelines, causes and clusters of
        a signature (a SignatureRow lists at most `member_cap` of each).

        Exact until a field of the signature has had more distinct values than
        `member_rows`, the rows the store keeps of it. Past that, a lower bound: the stored
        rows plus the most values one write batch brought that were not stored (so it
        still grows when a batch brings more), never a value counted twice.

        >>> store.distinct_counts("3f2a9c")
        {'hosts': 3, 'workers': 3, 'shards': 1, 'pipelines': 1, 'causes': 1, 'clusters': 2}
        """
        counts = dict.fromkeys(MEMBER_FIELDS, 0)
        for code, n in self._reader().execute(
            f"SELECT field, n FROM signature_distinct WHERE signature_id = {CANONICAL.format('?')}",
            (signature_id, signature_id),
        ):
            counts[MEMBER_FIELDS[code]] = n
        return counts

    def pipeline(self, name: str, cluster: str | None = None) -> PipelineStatus | None:
        """The status of the latest run (greatest `started`) of one pipeline, on `cluster`
        where given, or None.

        >>> store.pipeline("nightly").status
        'aborted'
        """
        runs = self.pipeline_runs(name, limit=1, cluster=cluster)
        return runs[0] if runs else None

    @_read
    def pipeline_runs(
        self, name: str, limit: int | None = 100, cluster: str | None = None
    ) -> list[PipelineStatus]:
        """The runs of one pipeline (on `cluster` only, where given), newest (greatest
        `started`) first.

        >>> [(p.started, p.status) for p in store.pipeline_runs("nightly")]
        [(1790086400.0, 'running'), (1790000000.0, 'aborted')]
        """
        # (name, started, cluster) is the key: a cluster's runs of a name differ in
        # `started`; runs of two clusters that share it come in rowid order.
        where, args = ("name = ?", [name])
        if cluster is not None:
            where += " AND cluster = ?"
            args.append(cluster)
        sql = (
            f"SELECT {PIPELINE_COLUMNS} FROM pipelines WHERE {where} "
            "ORDER BY started DESC, rowid DESC LIMIT ?"
        )
        args.append(_limit(limit))
        return [PipelineStatus(*r) for r in self._reader().execute(sql, args)]

    @_read
    def pipelines(
        self, limit: int | None = 100, cluster: str | None = None
    ) -> list[PipelineStatus]:
        """Pipeline runs (a name may come more than once), most recently updated first;
        of `cluster` only, where given.

        >>> [p.name for p in store.pipelines(limit=2)]
        ['nightly', 'backfill']
        """
        where, args = ("", [])
        if cluster is not None:
            where, args = (" WHERE cluster = ?", [cluster])
        sql = (
            f"SELECT {PIPELINE_COLUMNS} FROM pipelines{where} "
            "ORDER BY updated DESC, rowid DESC LIMIT ?"
        )
        args.append(_limit(limit))
        return [PipelineStatus(*r) for r in self._reader().execute(sql, args)]

    @_read
    def known(self, field: str, value: str, limit: int = 1000) -> tuple[bool, list[str]]:
        """Whether any event, run or signature has pipeline (`field` "pipeline"), signature
        id ("signature") or cluster ("cluster") `value`, and up to `limit` of the names
        there are, most recent first (clusters: by name): a filter that matched nothing
        says why.

        >>> store.known("pipeline", "etl ")
        (False, ['etl', 'backfill'])
        """
        db = self._reader()
        return query.known(
            SQLITE,
            lambda sql, args: db.execute(sql, args).fetchall(),
            lambda table, column, limit: _distinct(db, table, column, limit),
            field,
            value,
            limit,
        )


def _distinct(db: sqlite3.Connection, table: str, column: str, limit: int) -> list[str]:
    """Up to `limit` distinct non-empty values of an indexed column, in order: one index
    step each (no scan of a million events)."""
    rows = db.execute(query.distinct(SQLITE, table, column), (limit,))
    return [r[0] for r in rows]


def _event(r: tuple) -> FailureEvent:
    return FailureEvent(
        id=r[0],
        time=r[1],
        kind=r[2],
        cause=r[3],
        shard=r[4],
        pipeline=r[5],
        worker=r[6],
        host=r[7],
        signature_id=r[8],
        signature_title=r[9],
        evidence=json.loads(r[10]),
        attempt=r[11],
        killer=r[12],
        killer_how=r[13],
        killer_confidence=r[14],
        killer_summary=r[15],
        cluster=r[16],
        death=r[17],
    )


def _signature(r: tuple) -> SignatureRow:
    lists = {name: json.loads(r[7 + code]) for code, name in enumerate(MEMBER_FIELDS)}
    return SignatureRow(
        id=r[0],
        title=r[1],
        grouping_version=r[2],
        count=r[3],
        first_seen=r[4],
        last_seen=r[5],
        example=r[6],
        **lists,
        related=related_list(r[7 + len(MEMBER_FIELDS)]),
    )


def _within(rows: Iterable[tuple], max_bytes: int | None) -> Iterator[tuple]:
    """The rows until their text holds more than `max_bytes` characters (the first row
    always): the cursor is read no further, so the rows left never reach Python."""
    total = 0
    for i, r in enumerate(rows):
        if max_bytes is not None:
            total += sum(len(v) for v in r if isinstance(v, str))
            if total > max_bytes and i:
                return
        yield r


def _limit(limit: int | None) -> int:
    return -1 if limit is None else max(0, int(limit))
