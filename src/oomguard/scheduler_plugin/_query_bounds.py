"""The server-side bounds of one `oomguard_query` reply: at most QUERY_MAX_ROWS rows and
about QUERY_MAX_BYTES of text, whatever the client asked for (``limit=None`` included). A
longer list is read page by page with a cursor (`oomguard.Failures` and `oomguard report` do):
``before`` = [time, id] of the last event of the previous page for "events" (of the last
death, its id a str, for "deaths"), ``after`` for "shard" (oldest first), ``offset`` for
"signatures" and "incidents". A cursor or limit that is not one raises ValueError naming
the field. The names a filter gives (a pipeline, a shard, a signature) are made safe as the store makes
the names it keeps (`safe_filters`), so a filter finds what was stored from the same text.
"pipelines" is answered from the runs in memory and the store, read only, and capped alike
(`pipelines_reply`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .._models import PipelineStatus
from .._safe_text import safe_name

#: Rows in one reply at most.
QUERY_MAX_ROWS = 1000
#: Characters of text (evidence, examples, member lists) in one reply at most; the first
#: row always comes back. The scheduler's memory for one query is a few times this.
QUERY_MAX_BYTES = 4 * 2**20

_CURSORS = {"events": "before", "shard": "after", "deaths": "before"}
#: Longest death id a cursor may name (ids are 16 hex digits; a history may hold others).
_ID_MAX = 256
#: The filters that name something the store keeps as a name: "name" (one pipeline) and
#: "value" (a "known" query) included.
_NAMES = (
    "pipeline",
    "shard",
    "signature",
    "signature_id",
    "name",
    "value",
    "killer",
    "cause",
    "worker",
)


def bounded(what: str, filters: dict[str, Any]) -> dict[str, Any]:
    """`filters` of a list query with its limit, byte budget and cursor checked and capped.

    >>> bounded("events", {"limit": None, "cause": "oom_kill"})
    {'limit': 1000, 'cause': 'oom_kill', 'max_bytes': 4194304}
    """
    if what not in ("events", "shard", "signatures", "deaths", "incidents"):
        return filters
    out = dict(filters)
    out["limit"] = capped(out.get("limit", QUERY_MAX_ROWS))
    out["max_bytes"] = min(
        QUERY_MAX_BYTES, _count(out.get("max_bytes", QUERY_MAX_BYTES), "max_bytes")
    )
    cursor = _CURSORS.get(what)
    if cursor is not None and out.get(cursor) is not None:
        out[cursor] = _cursor(out[cursor], cursor, str if what == "deaths" else int)
    if what in ("signatures", "incidents") and "offset" in out:
        out["offset"] = _count(out["offset"], "offset")
    return out


def capped(limit: Any) -> int:
    """A reply's rows: `limit` (None: as many as may be) capped at QUERY_MAX_ROWS."""
    if limit is None:
        return QUERY_MAX_ROWS
    return min(QUERY_MAX_ROWS, _count(limit, "limit"))


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: expected a whole number >= 0")
    return value


def _cursor(value: Any, name: str, kind: type = int) -> tuple[float, Any]:
    """[time, id] of an event (`kind` int) or a death (str): a list over msgpack, a tuple
    in process."""
    ok = isinstance(value, list | tuple) and len(value) == 2
    if ok:
        t, i = value
        ok = (
            isinstance(t, int | float)
            and not isinstance(t, bool)
            and math.isfinite(t)
            and isinstance(i, kind)
            and not isinstance(i, bool)
            and (kind is not str or len(i) <= _ID_MAX)
        )
    if not ok:
        what = "a death" if kind is str else "an event"
        raise ValueError(f"{name}={value!r}: expected [time, id] of {what}")
    return float(t), kind(i)


def safe_filters(filters: dict[str, Any]) -> dict[str, Any]:
    """`filters` with each name made safe as the store keeps names; ValueError naming the
    field for one that is not text.

    >>> safe_filters({"pipeline": "etl\\x00", "limit": 5})
    {'pipeline': 'etl\\\\x00', 'limit': 5}
    """
    out = dict(filters)
    for name in _NAMES:
        value = out.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected text, not {type(value).__name__}")
        out[name] = safe_name(value)
    return out


def pipelines_reply(
    live: Iterable[PipelineStatus], stored: Iterable[PipelineStatus], limit: Any
) -> list[dict[str, Any]]:
    """The "pipelines" reply: the runs in memory (newest first), then the stored ones they
    do not hold, at most `limit` (capped at QUERY_MAX_ROWS) rows and QUERY_MAX_BYTES of
    text (the first row always). Nothing is written: a query changes no run.
    """
    rows = capped(limit)
    seen = set()
    out: list[dict[str, Any]] = []
    budget = QUERY_MAX_BYTES
    for status in [*sorted(live, key=lambda s: -s.started), *stored]:
        key = (status.cluster, status.name, status.started)
        if key in seen:
            continue
        seen.add(key)
        if len(out) >= rows:
            break
        size = len(status.name) + len(status.summary) + len(status.abort_reason) + 128
        if out and size > budget:
            break
        budget -= size
        out.append(status.to_dict())
    return out
