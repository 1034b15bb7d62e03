"""The read queries both stores run, written once: SQL text and its parameters for the
filters and pages of events and deaths, one shard's history, the signature filters and the
names a filter could have meant, in the dialect of SQLite (sqlite3) or PostgreSQL
(psycopg).

Pure: nothing here runs a query. Each store passes its `Dialect` and runs what comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

EVENT_COLUMNS = (
    "id, time, kind, cause, shard, pipeline, worker, host, signature_id, "
    "signature_title, evidence, attempt, killer, killer_how, killer_confidence, killer_summary, "
    "cluster, death"
)
#: A death's columns as `deaths.death_from_row` reads them.
DEATH_READ_COLUMNS = (
    "id, cluster, time, worker, host, cause, signature_id, signature_title, record, incident"
)
#: The member field codes a signature filter looks in (see schema.MEMBER_FIELDS).
_SIGNATURE_FILTERS = (("cause", 4), ("pipeline", 3), ("cluster", 5))


@dataclass(frozen=True)
class Dialect:
    """How a backend writes parameters, and where a death's suspects and tasks are.

    `or_suspect`: for "shard" and "pipeline", the column's value, or (for the one event of
    a death that named no shard) one of the suspects in its evidence; two parameters each.
    `among_tasks`: for "shard" and "pipeline", a death among whose tasks the value is; one
    parameter, made by `task_value`.
    """

    mark: str  # a positional parameter: "?" or "%s"
    named: Callable[[str], str]  # a named one: ":x" or "%(x)s"
    or_suspect: Mapping[str, str]
    among_tasks: Mapping[str, str]
    task_value: Callable[[str, str], Any] = lambda field, value: value


def events(
    d: Dialect,
    *,
    kind: str | None,
    cause: str | None,
    pipeline: str | None,
    shard: str | None,
    signature: str | list[str] | None,
    killer: str | None,
    cluster: str | None,
    since: float | None,
    before: tuple[float, int] | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """Events matching every filter given, newest first (by time, then id); `before` (time,
    id) of the last event of the previous page gives the next page."""
    m = d.mark
    where: list[str] = []
    args: list[Any] = []
    for column, value in (
        ("kind", kind),
        ("cause", cause),
        ("pipeline", pipeline),
        ("shard", shard),
        ("signature_id", signature),
        ("killer", killer),
        ("cluster", cluster),
    ):
        if value is None:
            continue
        if column in d.or_suspect:
            where.append(d.or_suspect[column])
            args += [value, value]
        elif column == "signature_id":
            where.append(_signature(m, value, args))
        else:
            where.append(f"{column} = {m}")
            args.append(value)
    if since is not None:
        where.append(f"time >= {m}")
        args.append(since)
    if before is not None:
        # (time, id) < before, with a range on `time` an index can take.
        where.append(f"time <= {m} AND (time < {m} OR id < {m})")
        args += [before[0], before[0], before[1]]
    sql = f"SELECT {EVENT_COLUMNS} FROM events"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + f" ORDER BY time DESC, id DESC LIMIT {m}", [*args, limit]


def deaths(
    d: Dialect,
    *,
    cluster: str | None,
    since: float | None,
    cause: str | None,
    killer: str | None,
    signature: str | list[str] | None,
    worker: str | None,
    shard: str | None,
    pipeline: str | None,
    before: tuple[float, str] | None,
    limit: int | None,
    columns: str = DEATH_READ_COLUMNS,
) -> tuple[str, list[Any]]:
    """Deaths matching every filter given, newest first (by time, then id); a shard or a
    pipeline among their tasks; `before` (time, id) of the last death of the previous page
    gives the next page. `columns`: what to read of each (all `death_from_row` reads)."""
    m = d.mark
    where: list[str] = []
    args: list[Any] = []
    for column, value in (
        ("cluster", cluster),
        ("cause", cause),
        ("killer", killer),
        ("worker", worker),
    ):
        if value is not None:
            where.append(f"{column} = {m}")
            args.append(value)
    if signature is not None:
        where.append(_signature(m, signature, args))
    for field, value in (("shard", shard), ("pipeline", pipeline)):
        if value is not None:
            where.append(d.among_tasks[field])
            args.append(d.task_value(field, value))
    if since is not None:
        where.append(f"time >= {m}")
        args.append(since)
    if before is not None:
        where.append(f"time <= {m} AND (time < {m} OR id < {m})")
        args += [before[0], before[0], before[1]]
    sql = f"SELECT {columns} FROM deaths"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + f" ORDER BY time DESC, id DESC LIMIT {m}", [*args, limit]


def _signature(m: str, value: Any, args: list[Any]) -> str:
    """The `signature=` filter of one id, or of a signature's ids (its own and its old ones:
    `aliases.signature_ids`); its parameters go to `args`."""
    ids = [value] if isinstance(value, str) else list(value)
    args += ids
    return (
        f"signature_id = {m}"
        if len(ids) == 1
        else f"signature_id IN ({', '.join([m] * len(ids))})"
    )


def shard(
    d: Dialect,
    key: str,
    *,
    cluster: str | None,
    after: tuple[float, int] | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """One shard's own history, oldest first; `after` (time, id) pages."""
    m = d.mark
    sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE shard = {m}"
    args: list[Any] = [key]
    if cluster is not None:
        sql += f" AND cluster = {m}"
        args.append(cluster)
    if after is not None:
        sql += f" AND time >= {m} AND (time > {m} OR id > {m})"
        args += [after[0], after[0], after[1]]
    return sql + f" ORDER BY time, id LIMIT {m}", [*args, limit]


def signatures(
    d: Dialect,
    select: str,
    *,
    cause: str | None,
    pipeline: str | None,
    cluster: str | None,
    since: float | None,
    cap: int,
    limit: int | None,
    offset: int,
) -> tuple[str, dict[str, Any]]:
    """`select` (a signature row with its member lists) filtered: seen with `cause`, in
    `pipeline`, on `cluster` (each looked up in its member lists), last seen at or after
    `since`; by count, then last seen, descending. Named parameters."""
    n = d.named
    where = []
    args: dict[str, Any] = {"cap": cap, "limit": limit, "offset": max(0, int(offset))}
    given = {"cause": cause, "pipeline": pipeline, "cluster": cluster}
    for name, code in _SIGNATURE_FILTERS:
        if given[name] is not None:
            where.append(
                "EXISTS (SELECT 1 FROM signature_members m WHERE m.signature_id = s.id"
                f" AND m.field = {code} AND m.value = {n(f'f{code}')})"
            )
            args[f"f{code}"] = given[name]
    if since is not None:
        where.append(f"s.last_seen >= {n('since')}")
        args["since"] = since
    sql = select
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY count DESC, last_seen DESC, id LIMIT {n('limit')} OFFSET {n('offset')}"
    return sql, args


def known(
    d: Dialect,
    rows: Callable[[str, tuple], list[tuple]],
    distinct: Callable[[str, str, int], list[str]],
    field: str,
    value: str,
    limit: int,
) -> tuple[bool, list[str]]:
    """Whether any event, run or signature has pipeline / signature id / cluster `value`,
    and up to `limit` of the names there are, most recent first (clusters: by name).
    `rows(sql, args)` runs a query; `distinct(table, column, limit)` lists a column's values.
    """
    m = d.mark
    if field == "cluster":
        found = rows(
            f"SELECT 1 FROM events WHERE cluster = {m} UNION ALL "
            f"SELECT 1 FROM pipelines WHERE cluster = {m} LIMIT 1",
            (value, value),
        )
        names = set(distinct("events", "cluster", limit))
        names |= set(distinct("pipelines", "cluster", limit))
        return bool(found), sorted(names)[:limit]
    if field == "signature":  # an old id of a signature too
        found = rows(
            f"SELECT 1 FROM signatures WHERE id = {m} UNION ALL "
            f"SELECT 1 FROM signature_aliases WHERE old_id = {m}",
            (value, value),
        )
        ids = rows(f"SELECT id FROM signatures ORDER BY last_seen DESC LIMIT {m}", (limit,))
        return bool(found), [r[0] for r in ids]
    if field != "pipeline":
        raise ValueError(f"known() takes 'pipeline', 'signature' or 'cluster', not {field!r}")
    found = rows(
        f"SELECT 1 FROM pipelines WHERE name = {m} UNION ALL "
        f"SELECT 1 FROM events WHERE pipeline = {m} LIMIT 1",
        (value, value),
    )
    runs = rows(
        f"SELECT name FROM pipelines GROUP BY name ORDER BY max(updated) DESC LIMIT {m}",
        (limit,),
    )
    seen = distinct("events", "pipeline", limit)
    return bool(found), list(dict.fromkeys([r[0] for r in runs] + seen))[:limit]


def distinct(d: Dialect, table: str, column: str) -> str:
    """Distinct non-empty values of an indexed column, in order, one index step each (no
    scan of a million events); one parameter, the limit."""
    return (
        f"WITH RECURSIVE p(name) AS (SELECT min({column}) FROM {table} WHERE {column} > ''"
        f" UNION ALL SELECT (SELECT min({column}) FROM {table} WHERE {column} > p.name)"
        f" FROM p WHERE p.name IS NOT NULL) SELECT name FROM p WHERE name IS NOT NULL"
        f" LIMIT {d.mark}"
    )
