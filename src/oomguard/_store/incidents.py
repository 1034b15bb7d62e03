"""Incidents, read from the deaths that name them, for both backends.

An incident is not a row of its own: each death names its incident (`Death.incident`, the
id of the incident's first death), so an incident is what its deaths say, after a restart
as before it, and an amend or retention needs no second bookkeeping. A read finds the
incidents by their first deaths (`id = incident`, a partial index by time), newest first,
at most `limit` of them, then gathers their deaths by (cluster, incident) in one grouped
query per `_CHUNK` incidents: bounded by the incidents asked for and their deaths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._death.incident import killer_of, place
from .._death.record import Death
from .._models import Incident
from .._words import incident_summary
from . import query
from .deaths import death_from_row
from .reads import SQLITE, Reader, _limit, _read, _within

#: Hosts and signatures an Incident lists at most.
LISTED = 20
_CHUNK = 200  # incidents per grouped query: 400 parameters


def heads(
    d: query.Dialect,
    *,
    cluster: str | None,
    since: float | None,
    cause: str | None,
    killer: str | None,
    limit: int | None,
    offset: int,
) -> tuple[str, list[Any]]:
    """The first deaths of the incidents matching every filter given (their cause, killer,
    cluster; begun at or after `since`), newest first; `offset` skips as many."""
    m = d.mark
    where, args = ["id = incident"], []
    for column, value in (("cluster", cluster), ("cause", cause), ("killer", killer)):
        if value is not None:
            where.append(f"{column} = {m}")
            args.append(value)
    if since is not None:
        where.append(f"time >= {m}")
        args.append(since)
    sql = (
        f"SELECT {query.DEATH_READ_COLUMNS} FROM deaths WHERE {' AND '.join(where)}"
        f" ORDER BY time DESC, id DESC LIMIT {m} OFFSET {m}"
    )
    return sql, [*args, limit, max(0, int(offset))]


def members(d: query.Dialect, keys: Sequence[tuple[str, str]]) -> tuple[str, list[Any]]:
    """The deaths of the incidents `keys` (cluster, id), counted per host and signature: a
    join of the keys with the deaths' (cluster, incident) index (a row-value IN scanned the
    whole index instead; both backends name a VALUES list's columns column1, column2)."""
    m = d.mark
    values = ", ".join([f"({m}, {m})"] * len(keys))
    sql = (
        "SELECT d.cluster, d.incident, d.host, d.signature_id, count(*), min(d.time),"
        f" max(d.time) FROM (VALUES {values}) AS k JOIN deaths AS d"
        " ON d.cluster = k.column1 AND d.incident = k.column2"
        " GROUP BY d.cluster, d.incident, d.host, d.signature_id"
    )
    return sql, [v for key in keys for v in key]


def read(
    rows: Callable[[str, list[Any], int | None], list[tuple]],
    d: query.Dialect,
    *,
    cluster: str | None = None,
    since: float | None = None,
    cause: str | None = None,
    killer: str | None = None,
    limit: int | None = 100,
    offset: int = 0,
    max_bytes: int | None = None,
) -> list[Incident]:
    """Incidents as `FailureStore.incidents` returns them; `rows(sql, args, max_bytes)`
    runs a query of the backend (dialect `d`)."""
    sql, args = heads(
        d, cluster=cluster, since=since, cause=cause, killer=killer, limit=limit, offset=offset
    )
    first = [death_from_row(r) for r in rows(sql, args, max_bytes)]
    gathered: list[tuple] = []
    keys = list(dict.fromkeys((h.cluster, h.id) for h in first))
    for i in range(0, len(keys), _CHUNK):
        gathered += rows(*members(d, keys[i : i + _CHUNK]), None)
    return assemble(first, gathered)


def assemble(first: Sequence[Death], gathered: Sequence[tuple]) -> list[Incident]:
    """The incidents of their first deaths, each with what `members` counted of it."""
    agg: dict[tuple[str, str], list] = {}
    for cluster, incident, host, signature, n, t0, t1 in gathered:
        a = agg.setdefault((cluster, incident), [0, t0, t1, set(), set()])
        a[0] += n
        a[1], a[2] = min(a[1], t0), max(a[2], t1)
        a[3].add(host)
        a[4].add(signature)
    out = []
    for h in first:
        n, t0, t1, hosts, signatures = agg.get(
            (h.cluster, h.id), [1, h.time, h.time, {h.host}, {h.signature_id}]
        )
        where = place(h)
        killer = killer_of(h)
        said = h.killer.summary if h.killer is not None and h.killer.summary else killer
        out.append(
            Incident(
                id=h.id,
                start=t0,
                end=t1,
                deaths=n,
                hosts=sorted(hosts - {""})[:LISTED],
                cause=h.cause,
                killer=killer,
                summary=incident_summary(where, n, t1 - t0, h.cause, said),
                cluster=h.cluster,
                place=where,
                signatures=sorted(signatures - {""})[:LISTED],
            )
        )
    return out


@_read
def read_incidents(
    reader: Reader,
    *,
    cluster: str | None = None,
    since: float | None = None,
    cause: str | None = None,
    killer: str | None = None,
    limit: int | None = 100,
    offset: int = 0,
    max_bytes: int | None = None,
) -> list[Incident]:
    """Incidents (worker deaths one cause explains; a death alone is one too), newest first
    by their first death, matching every filter given: `cluster`, begun at or after `since`,
    of `cause` and `killer` (their first death's). Pages: skip the first `offset`;
    `max_bytes` bounds the first deaths read, as for `deaths`.

    >>> [(i.place, i.deaths, i.cause) for i in store.incidents(since=time.time() - 3600)]
    [('host node-1', 3, 'sigkill')]
    """
    db = reader._reader()

    def rows(sql: str, args: list[Any], max_bytes: int | None) -> list[tuple]:
        return list(_within(db.execute(sql, args), max_bytes))

    return read(
        rows,
        SQLITE,
        cluster=cluster,
        since=since,
        cause=cause,
        killer=killer,
        limit=_limit(limit),
        offset=offset,
        max_bytes=max_bytes,
    )
