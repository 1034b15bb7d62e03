"""The reads of a FailureStore: queries on the caller's thread, each read with a read-only
connection of its own while it runs (taken from the store's idle ones, opened when none is
idle: as many as reads ever ran at once, not one per thread that ever read, so a thread
pool's new threads open no new descriptors); the file is in WAL mode, so a read never waits
for the writer."""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator

from .._models import FailureEvent, PipelineStatus, SignatureRow
from . import query
from .schema import MEMBER_FIELDS, PIPELINE_COLUMNS, connect

# A death without a report that named no shard is stored under shard '' (and pipeline ''
# when its suspects ran in several), its suspects in the evidence: a filter on a shard or a
# pipeline finds it too. Both terms use the column's index: only such rows are parsed.
_OR_SUSPECT = {
    "shard": "(shard = ? OR (shard = '' AND EXISTS (SELECT 1 FROM "
    "json_each(evidence, '$.suspects') WHERE value = ?)))",
    "pipeline": "(pipeline = ? OR (pipeline = '' AND shard = '' AND EXISTS (SELECT 1 FROM "
    "json_each(evidence, '$.suspect_pipelines') WHERE value = ?)))",
}
SQLITE = query.Dialect("?", lambda name: f":{name}", _OR_SUSPECT)
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
            conn = self._local.conn if outer else None
            if outer:
                self._local.conn = None
            with self._lock:
                if conn is not None:
                    self._idle.append(conn)
                self._reads -= 1
                self._reads_done.notify_all()

    return read


class ReaderMixin:
    """events(), shard(), signatures(), signature(), distinct_counts() and the pipeline reads
    of a FailureStore. FailureStore.__init__ sets the state below; close() waits for the
    reads in progress (`_reads`) before it closes their connections (`_readers`)."""

    path: str
    member_cap: int
    _file: str
    _lock: threading.Lock
    _closed: bool
    _thread: threading.Thread | None
    _local: threading.local
    _readers: list[sqlite3.Connection]
    _idle: list[sqlite3.Connection]  # readers no read uses now
    _reads: int
    _reads_done: threading.Condition

    def _reader(self) -> sqlite3.Connection:
        """The read connection of the read running on this thread; only inside a method
        marked `@_read`."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._thread is None or self._closed:
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
            signature=signature,
            killer=killer,
            cluster=cluster,
            since=since,
            before=before,
            limit=_limit(limit),
        )
        return [_event(r) for r in _within(self._reader().execute(sql, args), max_bytes)]

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
        return [_signature(r) for r in _within(self._reader().execute(sql, params), max_bytes)]

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
        """One signature, or None.

        >>> store.signature("3f2a9c").hosts
        ['node-1', 'node-2', 'node-3']
        """
        r = (
            self._reader()
            .execute(
                _SELECT_SIGNATURE + " WHERE id = :id", {"id": signature_id, "cap": self.member_cap}
            )
            .fetchone()
        )
        return None if r is None else _signature(r)

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
            "SELECT field, n FROM signature_distinct WHERE signature_id = ?", (signature_id,)
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
