"""The PostgreSQL history's schema: every table in the schema `oomguard` of the database
(another application's tables are never touched), versioned in `oomguard.schema_version`,
migrated by one scheduler at a time under an advisory lock."""

from __future__ import annotations

from typing import Any

from ..._exceptions import StoreError
from ..._urls import error_line, redact
from ..schema import refusal

NAMESPACE = "oomguard"
#: pg_advisory_xact_lock's key while migrating: "OOMG".
LOCK_KEY = 0x4F4F4D47

#: The tables that hold a cluster's rows, each under row-level security (migrations 2, 3): a
#: role listed in `cluster_roles` reads only its clusters' rows and writes only those it
#: `writes`; the tables' owner, and a role not listed, are not restricted.
CLUSTER_TABLES = ("events", "pipelines", "set_aside", "deaths", "worker_environments")
# Uncorrelated subqueries: PostgreSQL runs each once per statement, not once per row.
_LISTED = "NOT EXISTS (SELECT 1 FROM cluster_roles WHERE role = current_user)"
_CLUSTERS = "ARRAY(SELECT cluster FROM cluster_roles WHERE role = current_user)"
_WRITES = "ARRAY(SELECT cluster FROM cluster_roles WHERE role = current_user AND writes)"


def _own_rows(table: str) -> tuple[str, str]:
    """Row-level security on `table`: a listed role reaches its own clusters' rows only."""
    return (
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
        f"CREATE POLICY clusters ON {table} USING ({_LISTED} OR cluster = ANY "
        f"({_CLUSTERS})) WITH CHECK ({_LISTED} OR cluster = ANY ({_WRITES}))",
    )


#: MIGRATIONS[i] takes the schema from version i to i + 1. Append; never edit a released one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE events (
            id bigserial PRIMARY KEY,
            origin text NOT NULL,      -- the spool that sent it (one per scheduler's file)
            local_id bigint NOT NULL,  -- its id there: (origin, local_id) arrives once
            cluster text NOT NULL,
            time double precision NOT NULL,
            kind text NOT NULL,
            cause text NOT NULL,
            shard text NOT NULL,
            pipeline text NOT NULL,
            worker text NOT NULL,
            host text NOT NULL,
            signature_id text NOT NULL,
            signature_title text NOT NULL,
            evidence text NOT NULL,  -- JSON object, as the SQLite store keeps it
            attempt integer NOT NULL,
            grouping_version integer NOT NULL,
            killer text NOT NULL,
            killer_how text NOT NULL,
            killer_confidence text NOT NULL,
            killer_summary text NOT NULL,
            UNIQUE (origin, local_id)
        )""",
        "CREATE INDEX events_time ON events(time)",
        "CREATE INDEX events_shard ON events(shard, time)",
        "CREATE INDEX events_signature ON events(signature_id, time)",
        "CREATE INDEX events_pipeline ON events(pipeline, time)",
        "CREATE INDEX events_cause ON events(cause, time)",
        "CREATE INDEX events_killer ON events(killer, time)",
        "CREATE INDEX events_cluster ON events(cluster, time)",
        """CREATE TABLE signatures (
            id text PRIMARY KEY,
            title text NOT NULL,
            grouping_version integer NOT NULL,
            count bigint NOT NULL,
            first_seen double precision NOT NULL,
            last_seen double precision NOT NULL,
            example text NOT NULL
        )""",
        "CREATE INDEX signatures_rank ON signatures(count DESC, last_seen DESC)",
        "CREATE INDEX signatures_seen ON signatures(last_seen)",
        # field: the index in MEMBER_FIELDS (hosts, workers, shards, pipelines, causes,
        # clusters); at most about member_rows values per field.
        """CREATE TABLE signature_members (
            signature_id text NOT NULL,
            field smallint NOT NULL,
            value text NOT NULL,
            PRIMARY KEY (signature_id, field, value)
        )""",
        # How many values signature_members holds per list: what bounds a list, read in
        # one step per (signature, field) instead of counting its rows at every batch.
        """CREATE TABLE signature_fields (
            signature_id text NOT NULL,
            field smallint NOT NULL,
            n integer NOT NULL,
            PRIMARY KEY (signature_id, field)
        )""",
        """CREATE TABLE pipelines (
            cluster text NOT NULL,
            name text NOT NULL,
            started double precision NOT NULL,
            status text NOT NULL,
            shards_done integer NOT NULL,
            shards_failed integer NOT NULL,
            shards_aborted integer NOT NULL,
            infra_failures integer NOT NULL,
            user_failures integer NOT NULL,
            summary text NOT NULL,
            abort_reason text NOT NULL,
            updated double precision NOT NULL,
            PRIMARY KEY (cluster, name, started)
        )""",
        "CREATE INDEX pipelines_updated ON pipelines(updated)",
        "CREATE INDEX pipelines_cluster ON pipelines(cluster, updated)",
    ),
    (
        # Rows the history refused, set aside by the shipper that sent them (issue 39):
        # what `oomguard doctor --store` shows. `item`: the spool's event id, the run
        # ("name@started"), the signature id; `reason`: PostgreSQL's word, one line.
        """CREATE TABLE set_aside (
            origin text NOT NULL,
            cluster text NOT NULL,
            kind text NOT NULL,
            item text NOT NULL,
            reason text NOT NULL,
            time double precision NOT NULL,
            PRIMARY KEY (origin, kind, item)
        )""",
        "CREATE INDEX set_aside_cluster ON set_aside(cluster, time)",
        # Which role reads (and writes, `writes`) which cluster's rows: `oomguard history
        # grant` (roles.py). A role not listed keeps what its privileges give it.
        """CREATE TABLE cluster_roles (
            role name NOT NULL,
            cluster text NOT NULL,
            writes boolean NOT NULL,
            PRIMARY KEY (role, cluster)
        )""",
        "ALTER TABLE cluster_roles ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY own ON cluster_roles USING (role = current_user)",
        # Every role's queries read it (the policies below): each sees its own rows only.
        "GRANT SELECT ON cluster_roles TO PUBLIC",
        *(s for table in ("events", "pipelines", "set_aside") for s in _own_rows(table)),
    ),
    (
        # One account per worker death (issue 38), as the SQLite store keeps it: each
        # event names its death, and the death is one row per (cluster, id), replaced by
        # an amend (`deaths.UPSERT_DEATHS`). Deaths sent before are events only (not
        # backfilled): their signatures counted each of their events.
        "ALTER TABLE events ADD COLUMN death text NOT NULL DEFAULT ''",
        """CREATE TABLE deaths (
            seq bigserial PRIMARY KEY,
            origin text NOT NULL,       -- the spool that sent it last
            local_seq bigint NOT NULL,  -- its seq there
            id text NOT NULL,
            cluster text NOT NULL,
            time double precision NOT NULL,
            worker text NOT NULL,
            host text NOT NULL,
            cause text NOT NULL,
            killer text NOT NULL,
            signature_id text NOT NULL,
            signature_title text NOT NULL,
            grouping_version integer NOT NULL,
            record text NOT NULL,  -- JSON, as the SQLite store keeps it
            tasks jsonb NOT NULL,  -- its tasks (key, pipeline, role): the shard and pipeline filters
            UNIQUE (cluster, id)
        )""",
        "CREATE INDEX deaths_time ON deaths(time)",
        "CREATE INDEX deaths_cluster ON deaths(cluster, time)",
        "CREATE INDEX deaths_signature ON deaths(signature_id, time)",
        "CREATE INDEX deaths_worker ON deaths(worker, time)",
        "CREATE INDEX deaths_tasks ON deaths USING gin (tasks jsonb_path_ops)",
        *_own_rows("deaths"),
    ),
    (
        # Where a crash lives (issue 40, `environments.py`): each cluster's workers with the
        # environment their latest start said (a slot: a worker's nanny), under row-level
        # security as a cluster's rows; each signature's first environment. The roles
        # granted already may read (and the writers write) the workers as their clusters'
        # other rows: granted here, as `oomguard history grant` grants a new role.
        """CREATE TABLE worker_environments (
            cluster text NOT NULL,
            slot text NOT NULL,
            time double precision NOT NULL,
            environment text NOT NULL,  -- JSON, as the SQLite store keeps it
            PRIMARY KEY (cluster, slot)
        )""",
        "CREATE INDEX worker_environments_time ON worker_environments(cluster, time)",
        "ALTER TABLE signatures ADD COLUMN first_environment text NOT NULL DEFAULT ''",
        *_own_rows("worker_environments"),
        """DO $$ DECLARE r record; BEGIN
            FOR r IN SELECT c.role, bool_or(c.writes) AS writes FROM cluster_roles c
                     JOIN pg_roles p ON p.rolname = c.role GROUP BY c.role LOOP
                EXECUTE format('GRANT SELECT ON worker_environments TO %I', r.role);
                IF r.writes THEN
                    EXECUTE format(
                        'GRANT INSERT, UPDATE, DELETE ON worker_environments TO %I', r.role);
                END IF;
            END LOOP;
        END $$""",
    ),
    (
        # Signature states and versions (issue 40), as the SQLite store keeps them: the
        # fleet's resolve of a shared signature, its regressions, and the old ids of
        # signatures (`aliases.py`). The new table is shared like the signatures: the roles
        # granted before read it, and the writers add to it.
        "ALTER TABLE signatures ADD COLUMN resolved_at double precision NOT NULL DEFAULT 0",
        "ALTER TABLE signatures ADD COLUMN resolved_by text NOT NULL DEFAULT ''",
        "ALTER TABLE signatures ADD COLUMN resolve_note text NOT NULL DEFAULT ''",
        "ALTER TABLE signatures ADD COLUMN regressed_at double precision NOT NULL DEFAULT 0",
        "ALTER TABLE signatures ADD COLUMN regressions integer NOT NULL DEFAULT 0",
        """CREATE TABLE signature_aliases (
            old_id text PRIMARY KEY,
            new_id text NOT NULL,
            old_version integer NOT NULL,
            new_version integer NOT NULL,
            time double precision NOT NULL
        )""",
        "CREATE INDEX signature_aliases_new ON signature_aliases(new_id)",
        # A signature's rate: its events that have no death (task exceptions), by index.
        "CREATE INDEX events_no_death ON events(signature_id, time) WHERE death = ''",
        """DO $$
        DECLARE r record;
        BEGIN
            FOR r IN SELECT c.role, bool_or(c.writes) AS writes FROM cluster_roles c
                     JOIN pg_roles p ON p.rolname = c.role GROUP BY c.role LOOP
                EXECUTE format('GRANT SELECT ON signature_aliases TO %I', r.role);
                IF r.writes THEN
                    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON signature_aliases TO %I',
                                   r.role);
                END IF;
            END LOOP;
        END $$""",
    ),
    (
        # Incidents and related signatures (issue 40), as the SQLite store keeps them: each
        # death names its incident (those sent before are each their own); the crash sites
        # of the signatures of the deaths sent, and the signatures related by a site (across
        # clusters) or an incident, each link both ways (`deaths.link`). Signatures are
        # every cluster's, so their sites and links are not under row-level security.
        "ALTER TABLE deaths ADD COLUMN incident text NOT NULL DEFAULT ''",
        "UPDATE deaths SET incident = id",
        "CREATE INDEX deaths_incident ON deaths(cluster, incident)",
        "CREATE INDEX deaths_incidents ON deaths(time) WHERE id = incident",
        "CREATE INDEX deaths_cluster_incidents ON deaths(cluster, time) WHERE id = incident",
        """CREATE TABLE signature_sites (
            site text NOT NULL,
            signature_id text NOT NULL,
            PRIMARY KEY (site, signature_id)
        )""",
        "CREATE INDEX signature_sites_signature ON signature_sites(signature_id)",
        """CREATE TABLE signature_links (
            signature_id text NOT NULL,
            related_id text NOT NULL,
            site integer NOT NULL,
            incident integer NOT NULL,
            PRIMARY KEY (signature_id, related_id)
        )""",
        "CREATE INDEX signature_links_related ON signature_links(related_id)",
        # Roles granted before (`oomguard history grant`) get on the new tables what they
        # have on `signatures`: a cluster's writer keeps sending its deaths.
        """DO $$ DECLARE g record; BEGIN
            FOR g IN SELECT DISTINCT grantee, privilege_type FROM information_schema.table_privileges
                     WHERE table_schema = current_schema() AND table_name = 'signatures'
                       AND grantee <> current_user LOOP
                EXECUTE format('GRANT %s ON signature_sites, signature_links TO %I',
                               g.privilege_type, g.grantee);
            END LOOP;
        END $$""",
    ),
)


def _version(cur: Any) -> int | None:
    """The schema version, or None when there is no oomguard schema yet."""
    cur.execute(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = %s"
        " AND table_name = 'schema_version'",
        (NAMESPACE,),
    )
    if cur.fetchone() is None:
        return None
    cur.execute(f"SELECT version FROM {NAMESPACE}.schema_version")
    row = cur.fetchone()
    return 0 if row is None else int(row[0])


def check_version(conn: Any, url: str, known: int) -> int:
    """The database's schema version; StoreError ("newer_schema") naming both versions when
    a newer oomguard made it. Writes nothing."""
    with conn.cursor() as cur:
        version = _version(cur) or 0
    conn.rollback()
    if version > known:
        raise refusal(
            "newer_schema",
            f"The PostgreSQL history {redact(url)} has schema version {version}, but this "
            f"oomguard knows versions up to {known}: it was written by a newer oomguard. "
            "Upgrade oomguard; nothing was written to it.",
        )
    return version


def migrate(conn: Any, url: str, migrations: tuple[tuple[str, ...], ...] = MIGRATIONS) -> int:
    """Bring the schema to len(migrations), each step in one transaction under the advisory
    lock, so that many schedulers starting at once migrate it once. The version after."""
    known = len(migrations)
    if check_version(conn, url, known) == known:
        return known
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {NAMESPACE}")
            version = _version(cur)
            if version is None:
                cur.execute(f"CREATE TABLE {NAMESPACE}.schema_version (version integer NOT NULL)")
                cur.execute(f"INSERT INTO {NAMESPACE}.schema_version VALUES (0)")
                version = 0
            if version > known:  # a newer oomguard got the lock first
                raise refusal(
                    "newer_schema",
                    f"The PostgreSQL history {redact(url)} has schema version {version}, but "
                    f"this oomguard knows versions up to {known}. Upgrade oomguard.",
                )
            cur.execute(f"SET LOCAL search_path = {NAMESPACE}")
            for target in range(version + 1, known + 1):
                for statement in migrations[target - 1]:
                    cur.execute(statement)
            cur.execute("UPDATE schema_version SET version = %s", (known,))
    except StoreError:
        raise
    except Exception as e:
        raise refusal(
            "unwritable",
            f"Migrating the PostgreSQL history {redact(url)} to schema version {known} "
            f"failed ({type(e).__name__}: {error_line(e, url)}); it was rolled back.",
        ) from None
    return known
