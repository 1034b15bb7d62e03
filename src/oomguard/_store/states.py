"""The state of a crash signature (issue 40): the rules (pure: `state_of`), the facts both
stores read for them (`attach`), a person's resolve (`resolve`), and the regressions the
SQLite writer finds in a batch (`regress`).

The states, the first that holds (docs/reading-a-report.md, "Signature states"):

- `resolved`: a person resolved it (`Failures.resolve`, `oomguard report --resolve`) and
  it has not been seen since;
- `regressed`: seen again after its resolve (a death, or a task's exception, whose time is
  after it). Decided by the store's writer when it stores that sighting, once: the time of
  the first sighting after the resolve is kept (`regressed_at`), `regressions` counts the
  times it came back, and `oomguard_signature_regressions_total` counts each once. It stays
  regressed until resolved again;
- `escalating`: at least ESCALATING_MIN sightings in the last hour, and at least
  ESCALATING_FACTOR times its own hourly average over the 24 h before that hour (or over
  the hours since it was first seen, when fewer, at least one); a signature first seen
  within the last hour has no rate of its own yet;
- `new`: first seen within NEW_FOR (24 h);
- `ongoing`: the rest.

A sighting counts as the signature's count does: each worker death once, each task
exception once. The rates are read when a signature is read, from the stored deaths and
events (indexed by signature and time), at most RATE_CAP rows per count: a cost bounded
per signature shown, and nothing on the write path. Deaths past retention are not counted.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._models import SignatureRow
from .._safe_text import safe_name, safe_text
from .aliases import CANONICAL

NEW, ONGOING, ESCALATING, REGRESSED, RESOLVED = (
    "new",
    "ongoing",
    "escalating",
    "regressed",
    "resolved",
)
STATES = (NEW, ONGOING, ESCALATING, REGRESSED, RESOLVED)
HOUR = 3600.0
#: A signature first seen within this long is new.
NEW_FOR = 24 * HOUR
#: The window before the last hour whose hourly average a signature's last hour is
#: compared with.
BASELINE = 24 * HOUR
ESCALATING_MIN = 5
ESCALATING_FACTOR = 3.0
#: Rows counted at most per signature, table and window when reading its rates: past it the
#: counts (and the state) are decided from the capped counts.
RATE_CAP = 100_000
#: What a resolve keeps of a client's texts: who (a name) and why (prose).
BY_BYTES = 256
NOTE_CHARS = 2000


def state_of(
    now: float,
    first_seen: float,
    resolved_at: float = 0.0,
    regressed_at: float = 0.0,
    last_hour: int = 0,
    before: int = 0,
) -> str:
    """The state of a signature at `now` (seconds since the epoch): `last_hour` and
    `before` are its sightings in the last hour and in the BASELINE before it.

    >>> now = 1_790_000_000.0
    >>> state_of(now, first_seen=now - 7200, last_hour=6, before=1)
    'escalating'
    >>> state_of(now, first_seen=now - 86400 * 3, last_hour=6, before=72)
    'ongoing'
    """
    if resolved_at > 0:
        return REGRESSED if regressed_at > resolved_at else RESOLVED
    if escalating(now, first_seen, last_hour, before):
        return ESCALATING
    return NEW if first_seen >= now - NEW_FOR else ONGOING


def hourly(now: float, first_seen: float, before: int) -> float:
    """The hourly average of `before` sightings over the BASELINE before the last hour, or
    over the hours of it since `first_seen` (at least one)."""
    hours = min(BASELINE, max(HOUR, now - HOUR - first_seen)) / HOUR
    return before / hours


def escalating(now: float, first_seen: float, last_hour: int, before: int) -> bool:
    if first_seen >= now - HOUR or last_hour < ESCALATING_MIN:
        return False
    return last_hour >= ESCALATING_FACTOR * hourly(now, first_seen, before)


# -- read -----------------------------------------------------------------------------

_FACTS = "id, resolved_at, resolved_by, resolve_note, regressed_at, regressions"
# Sightings of one id since a time (and before another): its deaths, and its events with no
# death (each of a death's events is the death's); each count at most a cap.
_COUNT = (
    "SELECT (SELECT count(*) FROM (SELECT 1 FROM deaths WHERE signature_id = {m} AND "
    "time >= {m}{upto} LIMIT {m}) AS d) + (SELECT count(*) FROM (SELECT 1 FROM events WHERE "
    "signature_id = {m} AND time >= {m}{upto} AND death = '' LIMIT {m}) AS e)"
)


def attach(
    rows: Sequence[SignatureRow], ex: Callable[..., Any], m: str, now: float | None = None
) -> list[SignatureRow]:
    """`rows` with their state fields: the stored resolve and regressions, the old ids,
    and the rates of those seen within the last 25 hours. `ex(sql, args)` runs a read and
    returns its cursor, `m` is the dialect's parameter mark."""
    if not rows:
        return []
    now = time.time() if now is None else now
    ids = [r.id for r in rows]
    facts: dict[str, tuple] = {}
    aliases: dict[str, list[str]] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ", ".join([m] * len(chunk))
        for f in ex(f"SELECT {_FACTS} FROM signatures WHERE id IN ({marks})", chunk):
            facts[f[0]] = f[1:]
        for new, old in ex(
            f"SELECT new_id, old_id FROM signature_aliases WHERE new_id IN ({marks}) "
            "ORDER BY new_id, old_id",
            chunk,
        ):
            aliases.setdefault(new, []).append(old)
    since = now - HOUR
    recent = _COUNT.format(m=m, upto="")
    window = _COUNT.format(m=m, upto=f" AND time < {m}")
    out = []
    for r in rows:
        resolved_at, by, note, regressed_at, regressions = facts.get(r.id, (0.0, "", "", 0.0, 0))
        last_hour = before = 0
        if r.last_seen >= since - BASELINE:
            for sid in [r.id, *aliases.get(r.id, ())[:20]]:
                (n,) = ex(recent, (sid, since, RATE_CAP, sid, since, RATE_CAP)).fetchone()
                last_hour += n
                args = (sid, since - BASELINE, since, RATE_CAP)
                (n,) = ex(window, args + args).fetchone()
                before += n
        out.append(
            dataclasses.replace(
                r,
                state=state_of(now, r.first_seen, resolved_at, regressed_at, last_hour, before),
                resolved_at=resolved_at,
                resolved_by=by,
                resolve_note=note,
                regressed_at=regressed_at,
                regressions=regressions,
                last_hour=last_hour,
                hourly=round(hourly(now, r.first_seen, before), 3),
                aliases=aliases.get(r.id, []),
            )
        )
    return out


# -- write ----------------------------------------------------------------------------


def resolve(
    ex: Callable[..., Any], m: str, signature_id: str, note: Any, by: Any, at: float
) -> tuple[str, bool]:
    """Resolve the signature `signature_id` (or the one an old id of it points at) at `at`,
    in the caller's transaction: (its id, whether anything changed). Resolving one that is
    resolved and not seen since changes nothing. KeyError naming the id when there is no
    such signature; TypeError naming the argument for a note or name that is not text."""
    for name, value in (("signature_id", signature_id), ("note", note), ("by", by)):
        if not isinstance(value, str):
            raise TypeError(f"{name}: expected text, not {type(value).__name__}")
    asked = safe_name(signature_id)
    (sid,) = ex(f"SELECT {CANONICAL.format(m)}", (asked, asked)).fetchone()
    lock = "" if m == "?" else " FOR UPDATE"
    row = ex(
        f"SELECT resolved_at, regressed_at FROM signatures WHERE id = {m}{lock}", (sid,)
    ).fetchone()
    if row is None:
        raise KeyError(f"no signature {asked!r} in the history")
    if row[0] > 0 and row[1] <= row[0]:
        return sid, False
    ex(
        f"UPDATE signatures SET resolved_at = {m}, resolved_by = {m}, resolve_note = {m} "
        f"WHERE id = {m}",
        (at, safe_name(by, BY_BYTES), safe_text(note, NOTE_CHARS), sid),
    )
    return sid, True


# Of a batch's sightings (`batch._SIGHTINGS`, its ids already the signatures' own), the
# first after the resolve of each signature resolved and not regressed since.
_REGRESSED = """{sightings}
SELECT g.id, min(s.time) FROM s JOIN signatures AS g ON g.id = s.signature_id
WHERE g.resolved_at > 0 AND g.regressed_at <= g.resolved_at AND s.time > g.resolved_at
GROUP BY g.id"""


def regress(conn: Any, sightings: str, params: dict[str, Any]) -> int:
    """Mark regressed the signatures that this batch (SQLite) saw after their resolve;
    how many."""
    found = conn.execute(_REGRESSED.format(sightings=sightings), params).fetchall()
    conn.executemany(
        "UPDATE signatures SET regressed_at = ?, regressions = regressions + 1 WHERE id = ?",
        [(t, sid) for sid, t in found],
    )
    return len(found)
