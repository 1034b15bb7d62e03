"""The server-side bounds of one `oomguard_query` reply: at most QUERY_MAX_ROWS rows and
about QUERY_MAX_BYTES of text, whatever the client asked for (``limit=None`` included). A
longer list is read page by page with a cursor (`oomguard.Failures` and `oomguard report` do):
``before`` = [time, id] of the last event of the previous page for "events" (of the last
death, its id a str, for "deaths"), ``after`` for "shard" (oldest first), ``offset`` for
"signatures". A cursor or limit that is not one
raises ValueError naming the field; nothing else of the filters is changed here.
"""

from __future__ import annotations

import math
from typing import Any

#: Rows in one reply at most.
QUERY_MAX_ROWS = 1000
#: Characters of text (evidence, examples, member lists) in one reply at most; the first
#: row always comes back. The scheduler's memory for one query is a few times this.
QUERY_MAX_BYTES = 4 * 2**20

_CURSORS = {"events": "before", "shard": "after", "deaths": "before"}
#: Longest death id a cursor may name (ids are 16 hex digits; a history may hold others).
_ID_MAX = 256


def bounded(what: str, filters: dict[str, Any]) -> dict[str, Any]:
    """`filters` of a list query with its limit, byte budget and cursor checked and capped.

    >>> bounded("events", {"limit": None, "cause": "oom_kill"})
    {'limit': 1000, 'cause': 'oom_kill', 'max_bytes': 4194304}
    """
    if what not in ("events", "shard", "signatures", "deaths"):
        return filters
    out = dict(filters)
    out["limit"] = _rows(out.get("limit", QUERY_MAX_ROWS))
    out["max_bytes"] = min(
        QUERY_MAX_BYTES, _count(out.get("max_bytes", QUERY_MAX_BYTES), "max_bytes")
    )
    cursor = _CURSORS.get(what)
    if cursor is not None and out.get(cursor) is not None:
        out[cursor] = _cursor(out[cursor], cursor, str if what == "deaths" else int)
    if what == "signatures" and "offset" in out:
        out["offset"] = _count(out["offset"], "offset")
    return out


def _rows(limit: Any) -> int:
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
