"""The deaths of a spool, sent to the PostgreSQL history: the part of the shipper that
sends them, and its statements.

A death is one row per (cluster, id) in the history too. The spool's deaths above the last
seq sent (`ship_state.deaths_sent`) are upserted by (cluster, id), each in its own
transaction apart from the events': sent twice (a mark lost), a death replaces itself and
counts nothing more; amended in the spool (a new row there, the old one gone), it replaces
the one sent and moves its count from the old signature to the new one. So the mark need not
move with the transaction: exactly once by construction, not by bookkeeping.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..aliases import CANONICAL
from ..batch import ShipMark
from ..items import DEATH_COLUMNS as _COLUMNS
from ..links import FAN, choose, facts, worth
from .environments import FIRST_ENVIRONMENTS
from .states import regress

logger = logging.getLogger("oomguard.store")

SPOOL_DEATHS = f"SELECT seq, {_COLUMNS} FROM deaths WHERE seq > ? ORDER BY seq LIMIT ?"
CREATE_STAGE = """CREATE TEMP TABLE IF NOT EXISTS stage_deaths (
    local_seq bigint, id text, cluster text, time double precision, worker text, host text,
    cause text, killer text, signature_id text, signature_title text, grouping_version integer,
    record text, incident text
) ON COMMIT DELETE ROWS"""
COPY_STAGE = f"COPY stage_deaths (local_seq, {_COLUMNS}) FROM STDIN"
# One statement: the staged deaths upserted by (cluster, id), and their signatures' counts
# moved: +1 for each death's signature now, -1 for the one it had (a death sent again
# counts nothing more; an amended one moves its count); an old id counts in the signature
# it is an alias of. Signatures are locked in key order (schedulers sending at once wait
# for each other, never deadlock).
UPSERT_DEATHS = f"""
WITH old AS (
    SELECT d.signature_id FROM deaths d
    JOIN stage_deaths s ON s.cluster = d.cluster AND s.id = d.id
), up AS (
    INSERT INTO deaths (origin, local_seq, {_COLUMNS}, tasks)
    SELECT %(origin)s, local_seq, {_COLUMNS},
           coalesce(record::jsonb -> 'tasks', '[]'::jsonb)
    FROM stage_deaths ORDER BY cluster, id
    ON CONFLICT (cluster, id) DO UPDATE SET
        origin = excluded.origin, local_seq = excluded.local_seq, time = excluded.time,
        worker = excluded.worker, host = excluded.host, cause = excluded.cause,
        killer = excluded.killer, signature_id = excluded.signature_id,
        signature_title = excluded.signature_title,
        grouping_version = excluded.grouping_version, record = excluded.record,
        tasks = excluded.tasks, incident = excluded.incident
    RETURNING signature_id, signature_title, grouping_version, time
), delta AS (
    SELECT signature_id, 1 AS n, signature_title AS title, grouping_version AS gv, time
    FROM up
    UNION ALL SELECT signature_id, -1, NULL, NULL, NULL FROM old
), agg AS (
    SELECT {CANONICAL.format("delta.signature_id")} AS signature_id, sum(n) AS n,
           max(title) AS title,
           max(gv) AS gv, min(time) AS t0, max(time) AS t1
    FROM delta GROUP BY 1
)
INSERT INTO signatures (id, title, grouping_version, count, first_seen, last_seen, example)
SELECT a.signature_id, coalesce(a.title, ''), coalesce(a.gv, 1), a.n,
       coalesce(a.t0, 'Infinity'), coalesce(a.t1, '-Infinity'), ''
FROM agg a
WHERE a.n > 0 OR EXISTS (SELECT 1 FROM signatures s WHERE s.id = a.signature_id)
ORDER BY a.signature_id
ON CONFLICT (id) DO UPDATE SET
    count = signatures.count + excluded.count,
    first_seen = least(signatures.first_seen, excluded.first_seen),
    last_seen = greatest(signatures.last_seen, excluded.last_seen),
    title = CASE WHEN excluded.title <> ''
                      AND excluded.grouping_version >= signatures.grouping_version
                 THEN excluded.title ELSE signatures.title END,
    grouping_version = CASE WHEN excluded.title <> ''
                       THEN greatest(excluded.grouping_version, signatures.grouping_version)
                       ELSE signatures.grouping_version END
"""
# The crash sites of the staged deaths' signatures, and the candidates to link (as
# `links.SQLITE_CANDIDATES`: the signatures of their incidents, and across clusters those at
# the sites where a signature is new), in key order (schedulers sending at once never
# deadlock).
_SITED = """SELECT DISTINCT s.site, d.signature_id FROM stage_deaths AS d
    CROSS JOIN LATERAL jsonb_array_elements_text(CASE
        WHEN jsonb_typeof(d.record::jsonb -> 'sites') = 'array' THEN d.record::jsonb -> 'sites'
        ELSE '[]'::jsonb END) AS s(site)
    WHERE d.signature_id <> ''"""
SITES = f"""INSERT INTO signature_sites (site, signature_id) {_SITED} ORDER BY 1, 2
    ON CONFLICT DO NOTHING"""
CANDIDATES = f"""WITH batch AS (
    SELECT DISTINCT cluster, incident, signature_id FROM stage_deaths WHERE signature_id <> ''
), members AS (
    SELECT DISTINCT d.cluster, d.incident, d.signature_id FROM deaths AS d
    JOIN (SELECT DISTINCT cluster, incident FROM batch) AS t
      ON d.cluster = t.cluster AND d.incident = t.incident
    WHERE d.signature_id <> ''
), fresh AS MATERIALIZED (
    SELECT n.site, n.signature_id FROM ({_SITED}) AS n
    WHERE NOT EXISTS (SELECT 1 FROM signature_sites AS s
                      WHERE s.site = n.site AND s.signature_id = n.signature_id)
)
SELECT b.signature_id, m.signature_id, 0, 1, {facts("b.signature_id", "m.signature_id")}
    FROM batch AS b JOIN members AS m
    ON m.cluster = b.cluster AND m.incident = b.incident AND m.signature_id <> b.signature_id
    WHERE {worth("b.signature_id", "m.signature_id", "incident")}
UNION ALL
SELECT n.signature_id, o.signature_id, 1, 0, {facts("n.signature_id", "o.signature_id")}
    FROM fresh AS n
CROSS JOIN LATERAL (SELECT signature_id FROM signature_sites WHERE site = n.site
    ORDER BY signature_id LIMIT {FAN}) AS o
    WHERE {worth("n.signature_id", "o.signature_id", "site")}
UNION ALL
SELECT n.signature_id, o.signature_id, 1, 0, {facts("n.signature_id", "o.signature_id")}
    FROM fresh AS n JOIN fresh AS o ON o.site = n.site AND o.signature_id <> n.signature_id
    WHERE {worth("n.signature_id", "o.signature_id", "site")}"""
UPSERT_LINKS = """INSERT INTO signature_links (signature_id, related_id, site, incident)
    VALUES (%s, %s, %s, %s) ON CONFLICT (signature_id, related_id) DO UPDATE SET
    site = greatest(signature_links.site, excluded.site),
    incident = greatest(signature_links.incident, excluded.incident)"""
# Retention, as for events: this cluster's deaths past max-events (oldest first, with the
# other deaths of their incidents: an incident goes whole), every cluster's past max-age.
# Signatures keep their counts.
CLUSTER_DEATHS = "SELECT count(*) FROM deaths WHERE cluster = %s"
DROP_CLUSTER_DEATHS = (
    "DELETE FROM deaths WHERE cluster = %s AND incident IN (SELECT incident FROM deaths"
    " WHERE cluster = %s ORDER BY time, seq LIMIT %s)"
)
DROP_OLD_DEATHS = "DELETE FROM deaths WHERE time < %s"


def among_tasks(field: str, value: str) -> str:
    """The `tasks @> %s::jsonb` parameter of a death among whose tasks is shard (`field`
    "shard") or pipeline `value`."""
    return json.dumps([{"key" if field == "shard" else "pipeline": value}])


class DeathShipper:
    """The deaths part of a `Shipper`: its own mark (the last seq sent), batch and counts.
    `shown`: the history's URL as a message may show it."""

    def __init__(self, shown: str, batch: int) -> None:
        self.shown = shown
        self.batch = batch
        self.cursor = 0  # the last seq sent
        self.sent = 0  # deaths upserted
        self.skipped = 0  # deaths the history refused as data (logged; in the spool only)
        self.full = False  # the last round read a whole batch: more may wait
        self.regressions = 0  # signatures these deaths found regressed (`states.regress`)

    def start(self, state: dict[str, str]) -> None:
        """Begin after the spool's mark (`ship_state` as a dict)."""
        self.cursor = int(state.get("deaths_sent", 0))

    def round(self, local: Any, pg: Any, origin: str, refused: tuple) -> ShipMark | None:
        """Send one batch of the spool's deaths; the mark to move past it (None: there was
        none to send; `full` says whether more may wait). A batch the history refuses as
        data (`refused`: those errors) is sent one by one, the refused deaths said and
        skipped."""
        rows = local.execute(SPOOL_DEATHS, (self.cursor, self.batch)).fetchall()
        self.full = len(rows) == self.batch
        if not rows:
            return None
        try:
            self._send(pg, rows, origin)
        except refused:
            pg.rollback()
            for row in rows:
                try:
                    self._send(pg, [row], origin)
                except refused as e:
                    pg.rollback()
                    self.skipped += 1
                    logger.error(
                        "oomguard: the history %s refused death %r of the spool (%s); it "
                        "stays in the spool only (%d refused so far)",
                        self.shown,
                        row[1],
                        " ".join(str(e).split()),
                        self.skipped,
                    )
        self.cursor = rows[-1][0]
        return ShipMark(0, [], [], self.cursor)

    def _send(self, pg: Any, rows: list, origin: str) -> None:
        with pg.transaction(), pg.cursor() as cur:
            with cur.copy(COPY_STAGE) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(UPSERT_DEATHS, {"origin": origin})
            cur.execute(FIRST_ENVIRONMENTS)
            found = regress(cur, "stage_deaths")
            link(cur)
        self.sent += len(rows)
        self.regressions += found


def link(cur: Any) -> None:
    """Keep the staged deaths' crash sites and link their signatures (`links.py`)."""
    # The temp stage has no statistics: the planner's estimate for the candidates passes
    # jit_above_cost, and compiling took ~1.5 s a batch on a few rows (~10 ms without).
    cur.execute("SET LOCAL jit = off")
    rows = choose(cur.execute(CANDIDATES).fetchall())  # before the sites: who is new there
    cur.execute(SITES)
    if rows:
        cur.executemany(UPSERT_LINKS, rows)


def retention(cur: Any, cluster: str, max_deaths: int, before: float | None) -> None:
    """This cluster's deaths past `max_deaths`; every cluster's before `before`."""
    cur.execute(CLUSTER_DEATHS, (cluster,))
    (n,) = cur.fetchone()
    if n > max_deaths:
        cur.execute(DROP_CLUSTER_DEATHS, (cluster, cluster, n - max_deaths))
    if before is not None:
        cur.execute(DROP_OLD_DEATHS, (before,))
