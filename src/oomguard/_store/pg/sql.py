"""The statements a shipper runs: on the local spool (SQLite, `?` parameters) and on the
PostgreSQL history (psycopg, `%s` and `%(name)s` parameters)."""

from __future__ import annotations

from ..aliases import CANONICAL
from ..items import ROW

# -- the spool (SQLite) -------------------------------------------------------------------

#: The columns sent of an event, in the spool's names; `cluster` is the row's own.
SPOOL_EVENT_COLUMNS = (
    "id, cluster, time, kind, cause, shard, pipeline, worker, host, signature_id, "
    "signature_title, evidence, attempt, grouping_version, killer, killer_how, "
    "killer_confidence, killer_summary, death"
)
SPOOL_EVENTS = f"SELECT {SPOOL_EVENT_COLUMNS} FROM events WHERE id > ? ORDER BY id LIMIT ?"
SPOOL_DELETES = "SELECT seq, event_id FROM ship_deletes ORDER BY seq LIMIT ?"
SPOOL_PIPELINES = (
    "SELECT cluster, name, started, status, shards_done, shards_failed, shards_aborted,"
    " infra_failures, user_failures, summary, abort_reason, updated FROM pipelines"
    " WHERE shipped = 0 LIMIT ?"
)
SPOOL_BACKLOG = "SELECT count(*) FROM events WHERE id > ?"

# -- the history (PostgreSQL) -------------------------------------------------------------

STAGE_COLUMNS = (
    "local_id, cluster, time, kind, cause, shard, pipeline, worker, host, signature_id, "
    "signature_title, evidence, attempt, grouping_version, killer, killer_how, "
    "killer_confidence, killer_summary, death"
)
assert STAGE_COLUMNS.count(",") + 1 == ROW + 1  # the events row (with its cluster), its id

CREATE_STAGE = """CREATE TEMP TABLE IF NOT EXISTS stage (
    local_id bigint, cluster text, time double precision, kind text, cause text, shard text,
    pipeline text, worker text, host text, signature_id text, signature_title text,
    evidence text, attempt integer, grouping_version integer, killer text, killer_how text,
    killer_confidence text, killer_summary text, death text
) ON COMMIT DELETE ROWS"""
COPY_STAGE = f"COPY stage ({STAGE_COLUMNS}) FROM STDIN"

# One statement: the staged events not sent before (an event arrives once: its origin and
# local id are unique), their signatures counted (an event that names a death counts
# nothing: its death does, `deaths.UPSERT_DEATHS`), their members kept (about `rows` values
# per field at most). Signatures and members are locked in key order: schedulers sending
# at once wait for each other, never deadlock. An old id counts in the signature it is an
# alias of (`aliases.py`).
INSERT_STAGED = f"""
WITH ins AS (
    INSERT INTO events (origin, {STAGE_COLUMNS})
    SELECT %(origin)s, {STAGE_COLUMNS} FROM stage ORDER BY local_id
    ON CONFLICT (origin, local_id) DO NOTHING
    RETURNING local_id, cluster, time, cause, shard, pipeline, worker, host, signature_id,
              signature_title, grouping_version, death
), new AS (
    SELECT local_id, cluster, time, cause, shard, pipeline, worker, host,
           {CANONICAL.format("ins.signature_id")} AS signature_id, signature_title,
           grouping_version, death FROM ins
), agg AS (
    SELECT signature_id, count(*) FILTER (WHERE death = '') AS n, min(time) AS t0,
           max(time) AS t1,
           max(local_id) AS latest
    FROM new GROUP BY signature_id
), sig AS (
    INSERT INTO signatures (id, title, grouping_version, count, first_seen, last_seen, example)
    SELECT a.signature_id, n.signature_title, n.grouping_version, a.n, a.t0, a.t1, ''
    FROM agg a JOIN new n ON n.local_id = a.latest
    ORDER BY a.signature_id
    ON CONFLICT (id) DO UPDATE SET
        count = signatures.count + excluded.count,
        first_seen = least(signatures.first_seen, excluded.first_seen),
        last_seen = greatest(signatures.last_seen, excluded.last_seen),
        title = CASE WHEN excluded.grouping_version >= signatures.grouping_version
                     THEN excluded.title ELSE signatures.title END,
        grouping_version = greatest(signatures.grouping_version, excluded.grouping_version)
    RETURNING (xmax = 0) AS inserted
), stored AS (
    SELECT f.signature_id, f.field, f.n FROM signature_fields f
    WHERE f.signature_id IN (SELECT signature_id FROM agg)
), fresh AS (
    SELECT c.signature_id, c.field, c.value,
           row_number() OVER (PARTITION BY c.signature_id, c.field ORDER BY c.value) AS k
    FROM (SELECT DISTINCT n.signature_id, m.f AS field, m.v AS value FROM new n
          CROSS JOIN LATERAL (VALUES (0::smallint, host), (1::smallint, worker),
              (2::smallint, shard), (3::smallint, pipeline), (4::smallint, cause),
              (5::smallint, cluster)) AS m(f, v)
          LEFT JOIN stored s ON s.signature_id = n.signature_id AND s.field = m.f
          WHERE m.v <> '' AND coalesce(s.n, 0) < %(rows)s) AS c  -- a full list takes none
    WHERE NOT EXISTS (SELECT 1 FROM signature_members m WHERE m.signature_id = c.signature_id
                      AND m.field = c.field AND m.value = c.value)
), mem AS (
    INSERT INTO signature_members (signature_id, field, value)
    SELECT f.signature_id, f.field, f.value FROM fresh f
    LEFT JOIN stored s ON s.signature_id = f.signature_id AND s.field = f.field
    WHERE f.k <= %(rows)s - coalesce(s.n, 0)
    ORDER BY 1, 2, 3
    ON CONFLICT DO NOTHING
    RETURNING signature_id, field
), counted AS (
    INSERT INTO signature_fields (signature_id, field, n)
    SELECT signature_id, field, count(*) FROM mem GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (signature_id, field) DO UPDATE SET n = signature_fields.n + excluded.n
)
SELECT (SELECT count(*) FROM new), (SELECT count(*) FROM sig WHERE inserted)
"""
SET_EXAMPLE = "UPDATE signatures SET example = %s WHERE id = %s AND example = ''"
#: A row the history refused, set aside (aside.py); once per (origin, kind, item).
SET_ASIDE = (
    "INSERT INTO set_aside (origin, cluster, kind, item, reason, time)"
    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
# An amend replaced these events of this origin: gone, and uncounted from their signatures
# (those that counted: without a death; a death's count moves with the death).
DELETE_SENT = """
WITH gone AS (
    DELETE FROM events WHERE origin = %s AND local_id = ANY(%s) RETURNING signature_id, death
)
UPDATE signatures s SET count = s.count - g.n
FROM (SELECT signature_id, count(*) AS n FROM gone WHERE death = '' GROUP BY 1) g
WHERE s.id = g.signature_id
"""
UPSERT_PIPELINE = """
INSERT INTO pipelines (cluster, name, started, status, shards_done, shards_failed,
    shards_aborted, infra_failures, user_failures, summary, abort_reason, updated)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (cluster, name, started) DO UPDATE SET
    status = excluded.status, shards_done = excluded.shards_done,
    shards_failed = excluded.shards_failed, shards_aborted = excluded.shards_aborted,
    infra_failures = excluded.infra_failures, user_failures = excluded.user_failures,
    summary = excluded.summary, abort_reason = excluded.abort_reason,
    updated = excluded.updated
WHERE pipelines.updated <= excluded.updated
"""

# -- retention (PostgreSQL) ----------------------------------------------------------------

CLUSTER_EVENTS = "SELECT count(*) FROM events WHERE cluster = %s"
DROP_CLUSTER_EVENTS = (
    "DELETE FROM events WHERE id IN"
    " (SELECT id FROM events WHERE cluster = %s ORDER BY time, id LIMIT %s)"
)
DROP_OLD_EVENTS = "DELETE FROM events WHERE time < %s"
DROP_SIGNATURES = """
WITH old AS (
    DELETE FROM signatures WHERE id IN
        (SELECT id FROM signatures ORDER BY last_seen, id LIMIT %s) RETURNING id
), members AS (
    DELETE FROM signature_members WHERE signature_id IN (SELECT id FROM old)
), aliases AS (
    DELETE FROM signature_aliases WHERE new_id IN (SELECT id FROM old)
), sites AS (
    DELETE FROM signature_sites WHERE signature_id IN (SELECT id FROM old)
), links AS (
    DELETE FROM signature_links
    WHERE signature_id IN (SELECT id FROM old) OR related_id IN (SELECT id FROM old)
)
DELETE FROM signature_fields WHERE signature_id IN (SELECT id FROM old)
"""
DROP_PIPELINES = """
DELETE FROM pipelines WHERE (cluster, name, started) IN (
    SELECT cluster, name, started FROM pipelines WHERE cluster = %s AND status <> 'running'
    ORDER BY updated LIMIT %s)
"""
