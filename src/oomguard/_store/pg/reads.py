"""Reads of the PostgreSQL history: the read methods of a FailureStore, over every cluster
(or one, `cluster=`), each a bounded query on a pooled connection."""

from __future__ import annotations

import threading
from typing import Any

from ..._death.record import Death
from ..._exceptions import StoreError
from ..._models import RELATED_MAX, FailureEvent, Incident, PipelineStatus, SignatureRow
from ..._urls import check_url, redact
from .. import incidents, query
from ..aliases import CANONICAL, signature_ids
from ..deaths import death_from_row
from ..environments import attach as attach_environments
from ..reads import _event, _signature, _within
from ..schema import MEMBER_FIELDS
from ..states import attach as attach_states
from .deaths import among_tasks
from .environments import POSTGRES as _ENVIRONMENTS
from .schema import NAMESPACE
from .states import resolve

# As in the SQLite store: a death that named no shard is found by each of its suspects.
_OR_SUSPECT = {
    "shard": "(shard = %s OR (shard = '' AND evidence::jsonb -> 'suspects' ? %s))",
    "pipeline": "(pipeline = %s OR (pipeline = '' AND shard = ''"
    " AND evidence::jsonb -> 'suspect_pipelines' ? %s))",
}
# A signature's related ones, as links.SQLITE_RELATED has them.
_RELATED = f"""(SELECT coalesce(json_agg(json_build_array(l.related_id, coalesce(r.title, ''),
        l.site, l.incident) ORDER BY l.related_id), '[]')::text
    FROM (SELECT related_id, site, incident FROM signature_links WHERE signature_id = s.id
          ORDER BY related_id LIMIT {RELATED_MAX}) AS l
    LEFT JOIN signatures AS r ON r.id = l.related_id)"""
# A death among whose tasks a shard or pipeline is: the GIN index on `tasks`.
_AMONG_TASKS = {"shard": "tasks @> %s::jsonb", "pipeline": "tasks @> %s::jsonb"}
POSTGRES = query.Dialect("%s", lambda name: f"%({name})s", _OR_SUSPECT, _AMONG_TASKS, among_tasks)
_SELECT_SIGNATURE = (
    "SELECT id, title, grouping_version, count, first_seen, last_seen, example, "
    + ", ".join(
        "(SELECT coalesce(json_agg(value ORDER BY value), '[]')::text FROM (SELECT value"
        f" FROM signature_members WHERE signature_id = s.id AND field = {code}"
        " ORDER BY value LIMIT %(cap)s) AS m)"
        for code in range(len(MEMBER_FIELDS))
    )
    + f", {_RELATED} FROM signatures s"
)
_PIPELINE_COLUMNS = (
    "name, status, shards_done, shards_failed, shards_aborted, infra_failures, "
    "user_failures, summary, abort_reason, started, cluster"
)


class PgReader:
    """The history at `url`, read. Thread-safe: each read borrows a pooled connection.

    >>> reader = PgReader("postgresql://oomguard@db/oomguard"); reader.start()
    >>> [(s.title, s.count, s.clusters) for s in reader.signatures(limit=5)]
    """

    member_cap: int = 1000

    def __init__(self, url: str, *, timeout: float = 10.0, max_connections: int = 4) -> None:
        self.url = url
        self.path = redact(url)  # what a message may show
        self.timeout = timeout
        self.max_connections = max_connections
        self._pool: Any = None
        self._refused = ""  # why a URL libpq cannot read gets no pool
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PgReader({self.path!r})"

    def start(self) -> None:
        """Open the pool (connections are made as reads need them). A URL libpq cannot
        read gets no pool (which would log the driver's message, quoting the URL, at each
        attempt): each read raises StoreError instead, with no secret in it."""
        from psycopg_pool import ConnectionPool

        try:
            check_url(self.url)
        except StoreError as e:
            self._refused = str(e)
            return
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.url,
                    min_size=0,
                    max_size=self.max_connections,
                    timeout=self.timeout,
                    open=True,
                    connection_class=_connection_class(),
                    kwargs=_kwargs(),
                    name="oomguard-reads",
                )

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _rows(self, sql: str, args: Any = None, max_bytes: int | None = None) -> list[tuple]:
        if self._refused:
            raise StoreError(self._refused)
        if self._pool is None:
            raise RuntimeError(f"{self!r} is not started.")
        with self._pool.connection() as conn:
            cur = conn.execute(sql, args)
            return list(_within(cur, max_bytes))

    def states(self, rows: list[SignatureRow]) -> list[SignatureRow]:
        """`rows` with their states as the history has them (`..states.attach`)."""
        if not rows:
            return []
        if self._pool is None:
            raise RuntimeError(f"{self!r} is not started.")
        with self._pool.connection() as conn:
            return attach_states(rows, conn.execute, "%s")

    # -- events ----------------------------------------------------------------------------

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
        """As FailureStore.events, over every cluster or the one named."""
        sql, args = query.events(
            POSTGRES,
            kind=kind,
            cause=cause,
            pipeline=pipeline,
            shard=shard,
            signature=signature_ids(self._rows, "%s", signature),
            killer=killer,
            cluster=cluster,
            since=since,
            before=before,
            limit=_limit(limit),
        )
        return [_event(r) for r in self._rows(sql, args, max_bytes)]

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
        """As FailureStore.deaths, over every cluster or the one named."""
        sql, args = query.deaths(
            POSTGRES,
            cluster=cluster,
            since=since,
            cause=cause,
            killer=killer,
            signature=signature_ids(self._rows, "%s", signature),
            worker=worker,
            shard=shard,
            pipeline=pipeline,
            before=before,
            limit=_limit(limit),
        )
        return [death_from_row(r) for r in self._rows(sql, args, max_bytes)]

    def shard(
        self,
        key: str,
        *,
        limit: int | None = None,
        after: tuple[float, int] | None = None,
        max_bytes: int | None = None,
        cluster: str | None = None,
    ) -> list[FailureEvent]:
        """As FailureStore.shard: one shard's own history, oldest first."""
        sql, args = query.shard(POSTGRES, key, cluster=cluster, after=after, limit=_limit(limit))
        return [_event(r) for r in self._rows(sql, args, max_bytes)]

    def incidents(
        self,
        *,
        cluster: str | None = None,
        since: float | None = None,
        cause: str | None = None,
        killer: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
        max_bytes: int | None = None,
    ) -> list[Incident]:
        """As FailureStore.incidents, over every cluster or the one named."""
        return incidents.read(
            self._rows,
            POSTGRES,
            cluster=cluster,
            since=since,
            cause=cause,
            killer=killer,
            limit=_limit(limit),
            offset=offset,
            max_bytes=max_bytes,
        )

    # -- signatures ------------------------------------------------------------------------

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
        environment: bool = True,
    ) -> list[SignatureRow]:
        """As FailureStore.signatures; counts are across every cluster, suspects against
        the workers of every cluster their deaths were in. `cluster`: only the signatures
        that cluster saw."""
        sql, params = query.signatures(
            POSTGRES,
            _SELECT_SIGNATURE,
            cause=cause,
            pipeline=pipeline,
            cluster=cluster,
            since=since,
            cap=self.member_cap,
            limit=_limit(limit),
            offset=offset,
        )
        rows = self.states([_row(r) for r in self._rows(sql, params, max_bytes)])
        return attach_environments(rows, self._rows, _ENVIRONMENTS) if environment else rows

    def signature(self, signature_id: str) -> SignatureRow | None:
        """One signature, or None; an old id (an older grouping's) finds its signature."""
        sql = f"{_SELECT_SIGNATURE} WHERE id = {CANONICAL.format('%(id)s')}"
        rows = self._rows(sql, {"id": signature_id, "cap": self.member_cap})
        found = self.states([_row(r) for r in rows])
        return attach_environments(found, self._rows, _ENVIRONMENTS)[0] if found else None

    def resolve(
        self, signature_id: str, *, note: str = "", by: str = "", at: float | None = None
    ) -> tuple[SignatureRow | None, bool]:
        """As FailureStore.resolve, for the whole fleet (`pg/states.py`): PermissionError
        for a role that reads only."""
        if self._refused:
            raise StoreError(self._refused)
        if self._pool is None:
            raise RuntimeError(f"{self!r} is not started.")
        with self._pool.connection() as conn:
            sid, changed = resolve(conn, self.url, signature_id, note, by, at)
        return self.signature(sid), changed

    def distinct_counts(self, signature_id: str) -> dict[str, int]:
        """The stored distinct values of each member field: exact up to the bound of values
        kept per field (member_rows), a lower bound past it."""
        counts = dict.fromkeys(MEMBER_FIELDS, 0)
        for code, n in self._rows(
            f"SELECT field, n FROM signature_fields WHERE signature_id = {CANONICAL.format('%s')}",
            (signature_id, signature_id),
        ):
            counts[MEMBER_FIELDS[code]] = n
        return counts

    def totals(self) -> tuple[int, int]:
        ((n, hosts),) = self._rows(
            "SELECT (SELECT count(*) FROM signatures),"
            " (SELECT coalesce(max(n), 0) FROM signature_fields WHERE field = 0)"
        )
        return n, hosts

    # -- pipelines ---------------------------------------------------------------------------

    def pipeline(self, name: str, cluster: str | None = None) -> PipelineStatus | None:
        runs = self.pipeline_runs(name, limit=1, cluster=cluster)
        return runs[0] if runs else None

    def pipeline_runs(
        self, name: str, limit: int | None = 100, cluster: str | None = None
    ) -> list[PipelineStatus]:
        sql = f"SELECT {_PIPELINE_COLUMNS} FROM pipelines WHERE name = %s"
        args: list[Any] = [name]
        if cluster is not None:
            sql += " AND cluster = %s"
            args.append(cluster)
        sql += " ORDER BY started DESC LIMIT %s"
        args.append(_limit(limit))
        return [PipelineStatus(*r) for r in self._rows(sql, args)]

    def pipelines(
        self, limit: int | None = 100, cluster: str | None = None
    ) -> list[PipelineStatus]:
        sql = f"SELECT {_PIPELINE_COLUMNS} FROM pipelines"
        args: list[Any] = []
        if cluster is not None:
            sql += " WHERE cluster = %s"
            args.append(cluster)
        sql += " ORDER BY updated DESC, name, started DESC LIMIT %s"
        args.append(_limit(limit))
        return [PipelineStatus(*r) for r in self._rows(sql, args)]

    def known(self, field: str, value: str, limit: int = 1000) -> tuple[bool, list[str]]:
        """As FailureStore.known: "pipeline", "signature" or "cluster"."""
        return query.known(POSTGRES, self._rows, self._distinct, field, value, limit)

    def _distinct(self, table: str, column: str, limit: int) -> list[str]:
        """Up to `limit` distinct non-empty values of an indexed column, one index step
        each (no scan of a million events)."""
        rows = self._rows(query.distinct(POSTGRES, table, column), (limit,))
        return [r[0] for r in rows]


def _row(r: tuple) -> SignatureRow:
    return _signature(r)


def _limit(limit: int | None) -> int | None:
    return None if limit is None else max(0, int(limit))


def _kwargs() -> dict[str, Any]:
    return {
        "application_name": "oomguard",
        "options": f"-c search_path={NAMESPACE} -c statement_timeout=30000",
        "connect_timeout": 5,
        "autocommit": True,
    }


def _connection_class() -> Any:
    import psycopg

    return psycopg.Connection
