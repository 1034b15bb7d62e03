"""Where a crash lives, in the PostgreSQL history (`..environments` says what is kept): the
part of the shipper that sends a spool's workers' environments, the statement that keeps
each signature's first environment as deaths arrive, and the reads of the suspects.

A worker's environment is one row per (cluster, slot) there too, upserted: a row sent twice
changes nothing, an older start arriving late is ignored. So the shipper's mark (the last
spool seq sent) lives in memory only: a new shipper sends its spool's rows once more (at
most `WORKERS_KEPT`, its cluster's), exactly once in effect by construction.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..environments import WORKERS_KEPT, Sql

logger = logging.getLogger("oomguard.store")

#: Seconds before rows the history refused are offered again (a role granted before schema
#: version 4 may not write them until `oomguard history grant` runs again).
REFUSED_RETRY = 60.0

_SPOOL = (
    "SELECT seq, cluster, slot, time, environment FROM worker_environments"
    " WHERE seq > ? ORDER BY seq LIMIT ?"
)
_UPSERT = """INSERT INTO worker_environments (cluster, slot, time, environment)
    VALUES (%s, %s, %s, %s)
    ON CONFLICT (cluster, slot) DO UPDATE SET time = excluded.time,
        environment = excluded.environment
    WHERE excluded.time >= worker_environments.time"""
_PRUNE = """DELETE FROM worker_environments WHERE cluster = %s AND slot IN (
    SELECT slot FROM worker_environments WHERE cluster = %s
    ORDER BY time DESC, slot OFFSET %s)"""

#: After `deaths.UPSERT_DEATHS`, in its transaction: the first environment of each signature
#: that had none, from its earliest staged death with one.
FIRST_ENVIRONMENTS = """
UPDATE signatures s SET first_environment = f.environment
FROM (SELECT DISTINCT ON (signature_id) signature_id,
             (record::jsonb -> 'environment')::text AS environment
      FROM stage_deaths
      WHERE jsonb_typeof(record::jsonb -> 'environment') = 'object'
      ORDER BY signature_id, time) AS f
WHERE s.id = f.signature_id AND s.first_environment = ''
"""

POSTGRES = Sql(
    firsts=lambda n: (
        f"SELECT id, first_environment FROM signatures WHERE id IN ({', '.join(['%s'] * n)})"
    ),
    deaths="SELECT cluster, coalesce(record::jsonb ->> 'nanny', ''), worker,"
    " (record::jsonb -> 'environment')::text FROM deaths WHERE signature_id = %s"
    " ORDER BY time DESC LIMIT %s",
    workers="SELECT slot, environment FROM worker_environments WHERE cluster = %s",
)


class EnvironmentShipper:
    """The workers' environments part of a `Shipper` (`shown`: the history's URL as a
    message may show it): its mark, and what the history refused."""

    def __init__(self, shown: str, batch: int = WORKERS_KEPT) -> None:
        self.shown = shown
        self.batch = batch
        self.cursor = 0  # the last spool seq sent
        self.sent = 0
        self.refused = ""  # why the history refused the last rows offered ("" : it took them)
        self._retry_at = 0.0

    def round(self, local: Any, pg: Any) -> None:
        """Send the spool's rows above the mark. A refusal other than a lost connection
        (which the shipper handles) is said once and offered again `REFUSED_RETRY` later;
        the rest of the shipping goes on."""
        if time.monotonic() < self._retry_at:
            return
        rows = local.execute(_SPOOL, (self.cursor, self.batch)).fetchall()
        if not rows:
            return
        import psycopg

        try:
            with pg.transaction(), pg.cursor() as cur:
                cur.executemany(_UPSERT, [row[1:] for row in rows])
                for cluster in sorted({row[1] for row in rows}):
                    cur.execute(_PRUNE, (cluster, cluster, WORKERS_KEPT))
        except psycopg.OperationalError:
            raise
        except psycopg.Error as e:
            if not self.refused:
                logger.warning(
                    "oomguard: the history %s refused the workers' environments (%s); "
                    "suspects of signatures there go without this cluster's workers until it "
                    "takes them (a role granted before schema version 4: run `oomguard "
                    "history grant` for it again)",
                    self.shown,
                    " ".join(str(e).split())[:300],
                )
            self.refused = " ".join(str(e).split())[:300]
            self._retry_at = time.monotonic() + REFUSED_RETRY
            return
        self.refused = ""
        self.cursor = rows[-1][0]
        self.sent += len(rows)
