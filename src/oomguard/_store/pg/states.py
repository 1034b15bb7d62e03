"""Signature states in the PostgreSQL history (issue 40): the fleet's signatures are shared,
so is their state.

- A resolve is the fleet's: it is kept on the signature's one row, by any role that may
  change the shared signatures (a cluster's writer, the owner); a `--read-only` role is
  refused with a PermissionError that says so, and nothing changes.
- A regression is the fleet's: a death (or a task's exception) of any cluster after the
  resolve regresses the signature, decided by the shipper that sends it, in the same
  transaction, once (the row is locked: two schedulers sending at once find it regressed
  once); that scheduler's `oomguard_signature_regressions_total` counts it.
- Old ids (`..aliases`) are sent by each spool's shipper and folded here as in the spool.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..._urls import redact
from .. import aliases as _aliases
from ..aliases import CANONICAL
from ..states import resolve as _resolve

logger = logging.getLogger("oomguard.store")

# The staged rows of this transaction (`stage`: events, those with no death; or
# `stage_deaths`), each counted in the signature its id is now; of each signature resolved
# and not regressed since, the first sighting after its resolve.
_REGRESS = """
WITH s AS (
    SELECT {canonical} AS id, x.time FROM {stage} AS x {where}
), r AS (
    SELECT s.id, min(s.time) AS t FROM s JOIN signatures g ON g.id = s.id
    WHERE g.resolved_at > 0 AND g.regressed_at <= g.resolved_at AND s.time > g.resolved_at
    GROUP BY s.id
)
UPDATE signatures g SET regressed_at = r.t, regressions = g.regressions + 1
FROM r WHERE g.id = r.id AND g.resolved_at > 0 AND g.regressed_at <= g.resolved_at
    AND r.t > g.resolved_at
"""


def regress(cur: Any, stage: str) -> int:
    """Mark regressed the signatures the staged rows (`stage`) saw after their resolve, in
    the caller's transaction; how many."""
    where = "WHERE x.death = ''" if stage == "stage" else ""
    canonical = CANONICAL.format("x.signature_id")
    cur.execute(_REGRESS.format(canonical=canonical, stage=stage, where=where))
    return max(cur.rowcount, 0)


def resolve(conn: Any, url: str, signature_id: str, note: str, by: str, at: float | None):
    """Resolve a signature of the history (`states.resolve`) on `conn`, in a transaction of
    its own: (its id, whether anything changed). PermissionError when the role may not
    change the shared signatures (a `--read-only` role)."""
    import psycopg

    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT current_user, has_table_privilege('signatures', 'UPDATE')")
        role, may = cur.fetchone()
        if not may:
            raise PermissionError(_refused(role, url))
        try:
            return _resolve(
                cur.execute, "%s", signature_id, note, by, time.time() if at is None else at
            )
        except psycopg.errors.InsufficientPrivilege:
            raise PermissionError(_refused(role, url)) from None


def _refused(role: str, url: str) -> str:
    return (
        f"role {role} may not resolve signatures in the history {redact(url)}: it reads "
        "only (oomguard history grant --read-only). A resolve is the fleet's: resolve "
        "with a cluster's writer role, or the history's owner."
    )


# -- a spool's old ids, sent ----------------------------------------------------------------

SPOOL_ALIASES = (
    "SELECT seq, old_id, new_id, old_version, new_version, time FROM signature_aliases "
    "WHERE seq > ? ORDER BY seq LIMIT ?"
)


class AliasShipper:
    """The old ids of a spool's signatures, sent to the history and folded there: every
    alias after the last sent (kept in memory: a new shipper sends them all again once,
    and the history keeps the first of each). `regressions`: found by the folds."""

    def __init__(self, batch: int = 1000) -> None:
        self.batch = batch
        self.cursor = 0
        self.regressions = 0

    def round(self, local: Any, pg: Any) -> None:
        rows = local.execute(SPOOL_ALIASES, (self.cursor, self.batch)).fetchall()
        if not rows:
            return
        import psycopg

        try:
            with pg.transaction(), pg.cursor() as cur:
                found = _aliases.record(cur.execute, "%s", [r[1:] for r in rows], distinct=False)
        except (psycopg.DataError, psycopg.IntegrityError) as e:  # never stops the rest
            found = 0
            logger.error("oomguard: the history refused %d old signature ids: %s", len(rows), e)
        self.cursor = rows[-1][0]
        self.regressions += found
