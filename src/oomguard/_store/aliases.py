"""Old signature ids that point at new ones (issue 40, versioned signatures).

When the grouping rules change (`oomguard._signature._versions`), a crash seen again is
signed with the new rules and carries the id the old rules gave it. The store records that
old id as an alias of the new one (`signature_aliases`, one row per old id) and folds the
old signature into the new: the new row's count, first and last seen, lists, example and
resolve take the old row's in, and the old row goes. So:

- the old id still finds the signature (`signature(old)`, the `signature=` filters of
  `events()` and `deaths()`, which look for every id of the signature: its own and its old
  ones), and `known("signature", old)` is true;
- counts are continuous: the new signature's count includes the deaths counted under the
  old id (they keep their old `signature_id` row by row);
- a sighting under an old id afterwards (an older oomguard still writing, one cluster of a
  fleet not upgraded yet) counts in the new signature (`CANONICAL` in the writes);
- a resolve of the old signature carries over, and its crash seen again after the resolve
  under the new id is a regression (found here at the fold, or by the batch).

An old id points at one new id, the first it was seen under (rules that split a group: the
other new signature counts from then on); a chain (1 -> 2 -> 3) is kept one hop long. The
first alias of an old id wins; a fold may leave a list past the store's member bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .._safe_text import safe_name

#: What a queued alias item starts with (an item of two: this, and its rows).
ITEM = "aliases"
#: The id a signature id stands for now: itself, or the new id it is an alias of. `{0}` is
#: the expression of the id (a column, or a parameter mark: then given twice).
CANONICAL = "coalesce((SELECT new_id FROM signature_aliases WHERE old_id = {0}), {0})"
# The ids of one signature: `{m}` the mark of its id, or of one of its old ids (given 4
# times); its id first.
_SAME = (
    f"SELECT {CANONICAL.replace('{0}', '{m}')} UNION ALL SELECT old_id FROM signature_aliases"
    f" WHERE new_id = {CANONICAL.replace('{0}', '{m}')}"
)
# The columns a fold moves, in this order (the rest of a row: its id).
_COLUMNS = (
    "title, grouping_version, count, first_seen, last_seen, example, resolved_at, "
    "resolved_by, resolve_note, regressed_at, regressions, first_environment"
)


def signature_ids(run: Callable[..., Iterable[tuple]], m: str, value: Any) -> Any:
    """The ids a `signature=` filter looks for: the signature `value` names (its id, or an
    old id of it) and its old ids; None for None. `run(sql, args)` gives the rows of a read
    (the filter stays an equality, an index's order, when there is one id)."""
    if value is None:
        return None
    return [r[0] for r in run(_SAME.format(m=m), (value,) * 4)][:100] or [value]


class Queued:
    """The aliases a writer queued, (old id, new id), remembered up to a bound (one queued
    again is recorded once all the same)."""

    def __init__(self, bound: int = 4096) -> None:
        self.bound = bound
        self._seen: set[tuple[str, str]] = set()

    def new(self, aliases: Any, new_id: str, version: int, when: float) -> tuple | None:
        """The item to queue for `aliases` of `new_id` (`alias_item`): None when each was
        queued before."""
        if not aliases:
            return None
        _, rows = alias_item(aliases, new_id, version, when)
        rows = tuple(r for r in rows if r[:2] not in self._seen)
        if not rows:
            return None
        if len(self._seen) > self.bound:
            self._seen.clear()
        self._seen.update(r[:2] for r in rows)
        return (ITEM, rows)


def alias_item(aliases: Any, new_id: str, version: int, when: float) -> tuple:
    """The queued form of `aliases` ((old id, old version), ...) of the signature `new_id`
    of grouping `version`: (ITEM, rows); ValueError or TypeError naming the field."""
    if not isinstance(aliases, list | tuple):
        raise TypeError(f"aliases must be a list of (id, version), got {type(aliases).__name__}")
    rows = []
    for i, alias in enumerate(aliases):
        if not (isinstance(alias, list | tuple) and len(alias) == 2):
            raise TypeError(f"aliases[{i}] must be (id, version), got {alias!r}")
        old, old_version = alias
        if not isinstance(old, str) or type(old_version) is not int:
            raise TypeError(f"aliases[{i}] must be (id, version), got {alias!r}")
        if old_version < version and old != new_id:  # never a newer id, never itself
            rows.append((safe_name(old), safe_name(new_id), old_version, version, when))
    return (ITEM, tuple(rows))


def record(ex: Callable[..., Any], m: str, rows: Iterable[tuple], *, distinct: bool) -> int:
    """Record each alias row (old, new, old version, new version, time) once, folding the
    old signature into the new; `ex(sql, args)` runs a statement in the caller's
    transaction and returns its cursor, `m` is the dialect's parameter mark. `distinct`:
    the SQLite store's `signature_distinct` keeps the counts of the lists (else
    PostgreSQL's `signature_fields`). How many signatures the folds found regressed."""
    regressed = 0
    for old, new, old_version, new_version, when in rows:
        (new,) = ex(f"SELECT {CANONICAL.format(m)}", (new, new)).fetchone()
        if new == old:
            continue
        added = ex(
            "INSERT INTO signature_aliases (old_id, new_id, old_version, new_version, time)"
            f" VALUES ({m}, {m}, {m}, {m}, {m}) ON CONFLICT (old_id) DO NOTHING",
            (old, new, old_version, new_version, when),
        )
        if added.rowcount != 1:
            continue  # the first alias of an old id stands
        ex(f"UPDATE signature_aliases SET new_id = {m} WHERE new_id = {m}", (new, old))
        regressed += _fold(ex, m, old, new, distinct)
    return regressed


def _fold(ex: Callable[..., Any], m: str, old: str, new: str, distinct: bool) -> int:
    """The old signature's row, lists and resolve into the new one's; 1 when the new one
    is found regressed (a resolve of the old one, and a sighting of either after it)."""
    lock = "" if m == "?" else " FOR UPDATE"  # PostgreSQL: schedulers folding at once
    get = f"SELECT {_COLUMNS} FROM signatures WHERE id = {m}{lock}"
    o = ex(get, (old,)).fetchone()
    if o is not None:
        n = ex(get, (new,)).fetchone()
        row = o if n is None else _merged(n, o)
        ex(f"DELETE FROM signatures WHERE id = {m}", (old,))
        marks = ", ".join([m] * 13)
        ex(
            f"INSERT INTO signatures (id, {_COLUMNS}) VALUES ({marks}) ON CONFLICT (id) DO "
            "UPDATE SET count = excluded.count, first_seen = excluded.first_seen, last_seen"
            " = excluded.last_seen, example = excluded.example, resolved_at = excluded."
            "resolved_at, resolved_by = excluded.resolved_by, resolve_note = excluded."
            "resolve_note, regressed_at = excluded.regressed_at, regressions = excluded."
            "regressions, first_environment = excluded.first_environment",
            (new, *row),
        )
    ex(
        "INSERT INTO signature_members (signature_id, field, value) SELECT "
        f"{m}, field, value FROM signature_members WHERE signature_id = {m} "
        "ON CONFLICT DO NOTHING",
        (new, old),
    )
    ex(f"DELETE FROM signature_members WHERE signature_id = {m}", (old,))
    _recount(ex, m, old, new, distinct)
    return 0 if o is None else _regressed(ex, m, old, new)


def _merged(n: tuple, o: tuple) -> tuple:
    """The new row `n` with the old row `o` in it (columns in `_COLUMNS` order)."""
    title, version, count, first, last, example, r_at, r_by, note, g_at, g_n, env = n
    if o[6] > r_at:  # the later resolve stands
        r_at, r_by, note = o[6], o[7], o[8]
    if o[11] and (not env or o[3] < first):  # the environment of the earlier first death
        env = o[11]
    return (
        title, version, count + o[2], min(first, o[3]), max(last, o[4]), example or o[5],
        r_at, r_by, note, max(g_at, o[9]), g_n + o[10], env,
    )  # fmt: skip


def _recount(ex: Callable[..., Any], m: str, old: str, new: str, distinct: bool) -> None:
    """The lists' counts of the new signature after the fold; the old one's go."""
    table = "signature_distinct" if distinct else "signature_fields"
    before: dict[int, int] = {}
    for field, n in ex(
        f"SELECT field, n FROM {table} WHERE signature_id IN ({m}, {m})", (old, new)
    ).fetchall():
        before[field] = max(before.get(field, 0), n)
    ex(f"DELETE FROM {table} WHERE signature_id IN ({m}, {m})", (old, new))
    stored = ex(
        f"SELECT field, count(*) FROM signature_members WHERE signature_id = {m} GROUP BY field",
        (new,),
    ).fetchall()
    for field, n in stored:
        if distinct:  # values seen (a lower bound past the bound), values stored
            ex(
                f"INSERT INTO {table} (signature_id, field, n, stored) VALUES ({m}, {m}, {m}, {m})",
                (new, field, max(n, before.get(field, 0)), n),
            )
        else:
            ex(
                f"INSERT INTO {table} (signature_id, field, n) VALUES ({m}, {m}, {m})",
                (new, field, n),
            )


def _regressed(ex: Callable[..., Any], m: str, old: str, new: str) -> int:
    """After a fold: a resolve kept, and a sighting of the signature (under either id)
    after it, is a regression at that sighting's time."""
    r_at, g_at = ex(
        f"SELECT resolved_at, regressed_at FROM signatures WHERE id = {m}", (new,)
    ).fetchone()
    if not (r_at > 0 and g_at <= r_at):
        return 0
    ids = f"signature_id IN ({m}, {m}) AND time > {m}"
    (t,) = ex(
        f"SELECT min(t) FROM (SELECT min(time) AS t FROM deaths WHERE {ids} UNION ALL "
        f"SELECT min(time) FROM events WHERE {ids} AND death = '') AS s",
        (old, new, r_at, old, new, r_at),
    ).fetchone()
    if t is None:
        return 0
    ex(
        f"UPDATE signatures SET regressed_at = {m}, regressions = regressions + 1 WHERE id = {m}",
        (t, new),
    )
    return 1
