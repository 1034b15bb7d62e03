"""Related signatures in the store, for both backends: the crash sites of the signatures of
stored deaths (`signature_sites`), and the links between two signatures that share a site
or an incident (`signature_links`), kept both ways.

Each write batch that stores deaths links their signatures: a signature new at one of its
crash sites (`Death.sites`) to the others seen there (at most `FAN` looked at), and each to
the signatures of the other deaths of its incident. A signature that recurs costs a few key
lookups. A signature keeps at most
`RELATED_MAX` related ones, the first found: a link is made only when both of its ends
have room, so every link holds both ways. A pair linked before only gains a reason.

The candidates come from SQL (each backend's statement); which of them become links is
decided here, once for both (`choose`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .._models import RELATED_MAX

#: Signatures at one crash site looked at when a new one arrives there.
FAN = 64
SITE, INCIDENT = "same crash site", "same incident"


def _linked(a: str, b: str) -> str:
    return f"SELECT 1 FROM signature_links AS l WHERE l.signature_id = {a} AND l.related_id = {b}"


def _links(a: str) -> str:
    return f"(SELECT count(*) FROM signature_links AS l WHERE l.signature_id = {a})"


def worth(a: str, b: str, why: str) -> str:
    """SQL (either backend) that holds when linking the signatures `a` and `b` (columns) for
    `why` ("site", "incident") adds something: they are not linked for it yet, and either
    linked already (for the other reason) or both with room. A signature that recurs at a
    known site, or whose ends are full, then costs a few key lookups, not a link written."""
    return (
        f"NOT EXISTS ({_linked(a, b)} AND l.{why} = 1) AND (EXISTS ({_linked(a, b)})"
        f" OR ({_links(a)} < {RELATED_MAX} AND {_links(b)} < {RELATED_MAX}))"
    )


def facts(a: str, b: str) -> str:
    """SQL select items of what `choose` needs of a candidate pair, as the batch began:
    whether it is linked, and how many links each end has."""
    return f"EXISTS ({_linked(a, b)}), {_links(a)}, {_links(b)}"


# -- SQLite: the deaths of this batch are those with seq > :dlast ---------------------------

# NOT INDEXED: the batch's deaths by a rowid range (seq), never a scan of an index. The
# CROSS JOINs keep the batch's rows outside, each looking its partners up by key.
_SITED = """SELECT DISTINCT s.value AS site, d.signature_id FROM deaths AS d NOT INDEXED,
    json_each(d.record, '$.sites') AS s
    WHERE d.seq > :dlast AND d.signature_id <> '' AND s.type = 'text'"""
SQLITE_SITES = f"INSERT OR IGNORE INTO signature_sites (site, signature_id) {_SITED}"
# (signature, another, by site, by incident, what `choose` needs): the batch's deaths'
# signatures with those of the other deaths of their incidents; and each signature new at a
# crash site (not there before this batch: one that recurs there was linked when it came)
# with those there before it (the first FAN) and those new there with it.
_FRESH = f"""SELECT n.site, n.signature_id FROM ({_SITED}) AS n
    WHERE NOT EXISTS (SELECT 1 FROM signature_sites AS s
                      WHERE s.site = n.site AND s.signature_id = n.signature_id)"""
SQLITE_CANDIDATES = f"""WITH batch AS (
    SELECT DISTINCT cluster, incident, signature_id FROM deaths NOT INDEXED
    WHERE seq > :dlast AND signature_id <> ''
), members AS (
    SELECT DISTINCT d.cluster, d.incident, d.signature_id
    FROM (SELECT DISTINCT cluster, incident FROM batch) AS t CROSS JOIN deaths AS d
      ON d.cluster = t.cluster AND d.incident = t.incident
    WHERE d.signature_id <> ''
), fresh AS MATERIALIZED ({_FRESH})
SELECT b.signature_id, m.signature_id, 0, 1, {facts("b.signature_id", "m.signature_id")}
    FROM batch AS b JOIN members AS m
    ON m.cluster = b.cluster AND m.incident = b.incident AND m.signature_id <> b.signature_id
    WHERE {worth("b.signature_id", "m.signature_id", "incident")}
UNION ALL
SELECT n.signature_id, o.signature_id, 1, 0, {facts("n.signature_id", "o.signature_id")}
    FROM fresh AS n CROSS JOIN signature_sites AS o ON o.site = n.site
    AND o.signature_id IN (SELECT signature_id FROM signature_sites WHERE site = n.site
                           LIMIT {FAN})
    WHERE {worth("n.signature_id", "o.signature_id", "site")}
UNION ALL
SELECT n.signature_id, o.signature_id, 1, 0, {facts("n.signature_id", "o.signature_id")}
    FROM fresh AS n JOIN fresh AS o ON o.site = n.site AND o.signature_id <> n.signature_id
    WHERE {worth("n.signature_id", "o.signature_id", "site")}"""
SQLITE_UPSERT = """INSERT INTO signature_links (signature_id, related_id, site, incident)
    VALUES (?, ?, ?, ?) ON CONFLICT (signature_id, related_id) DO UPDATE SET
    site = max(site, excluded.site), incident = max(incident, excluded.incident)"""
# The related signatures of `s` (a row of `signatures`) as one JSON array of
# [id, title, site, incident]: a column of reads._SELECT_SIGNATURE.
SQLITE_RELATED = f"""(SELECT json_group_array(json_array(l.related_id,
        coalesce(r.title, ''), l.site, l.incident))
    FROM (SELECT related_id, site, incident FROM signature_links WHERE signature_id = s.id
          ORDER BY related_id LIMIT {RELATED_MAX}) AS l
    LEFT JOIN signatures AS r ON r.id = l.related_id)"""
#: Retention: a signature that goes takes its sites and its links (both ways).
SQLITE_FORGET = (
    "DELETE FROM signature_sites WHERE signature_id = ?",
    "DELETE FROM signature_links WHERE signature_id = ?",
    "DELETE FROM signature_links WHERE related_id = ?",
)


def link_sqlite(conn: Any, dlast: int) -> int:
    """Keep the sites of the deaths stored in this batch (seq above `dlast`) and link
    their signatures; the links made or widened."""
    at = {"dlast": dlast}
    rows = choose(conn.execute(SQLITE_CANDIDATES, at).fetchall())  # before the sites
    conn.execute(SQLITE_SITES, at)
    conn.executemany(SQLITE_UPSERT, rows)
    return len(rows)


def choose(
    candidates: Iterable[tuple[str, str, int, int, Any, int, int]], cap: int = RELATED_MAX
) -> list[tuple[str, str, int, int]]:
    """The link rows to upsert, both ways, sorted (writers that lock them in one order never
    deadlock), of the `candidates` (signature, other, by site, by incident, linked already,
    the links of each): a pair linked already gains its reasons; a new pair is linked while
    both of its ends have fewer than `cap` links, counting those this batch makes.

    >>> choose([("a", "b", 1, 0, 0, 0, 0), ("b", "a", 0, 1, 0, 0, 0),
    ...         ("a", "c", 1, 0, 0, 0, 0)], cap=1)
    [('a', 'b', 1, 1), ('b', 'a', 1, 1)]
    """
    pairs: dict[tuple[str, str], list[int]] = {}
    linked = set()
    count: dict[str, int] = {}
    for a, b, site, incident, was, na, nb in candidates:
        if a == b or not a or not b:
            continue
        key = (a, b) if a < b else (b, a)
        flags = pairs.setdefault(key, [0, 0])
        flags[0] |= int(bool(site))
        flags[1] |= int(bool(incident))
        if was:
            linked.add(key)
        count.setdefault(a, na)
        count.setdefault(b, nb)
    rows = []
    for (a, b), (site, incident) in sorted(pairs.items()):
        if (a, b) not in linked:
            if count[a] >= cap or count[b] >= cap:
                continue
            count[a] += 1
            count[b] += 1
        rows += [(a, b, site, incident), (b, a, site, incident)]
    return sorted(rows)


def related_list(text: Any) -> list[dict[str, str]]:
    """A SignatureRow's `related` from the JSON array the read selected.

    >>> related_list('[["9f1c", "SIGSEGV in b", 1, 0]]')
    [{'id': '9f1c', 'title': 'SIGSEGV in b', 'why': 'same crash site'}]
    """
    try:
        rows = json.loads(text) if isinstance(text, str) else []
    except ValueError:
        rows = []
    out = []
    for row in rows if isinstance(rows, list) else ():
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)):
            continue
        why = [w for w, on in ((SITE, row[2]), (INCIDENT, row[3])) if on]
        title = row[1] if isinstance(row[1], str) else ""
        out.append({"id": row[0], "title": title, "why": ", ".join(why)})
    return out
