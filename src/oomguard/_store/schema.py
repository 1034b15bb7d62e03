"""The store's file format, and opening a file: the schema (APPLICATION_ID, MIGRATIONS,
MEMBER_FIELDS), refusing a file we must not touch (`check_file`), SQLite's JSON functions,
and migrating a file to the schema this oomguard knows."""

from __future__ import annotations

import pathlib
import sqlite3

from .._exceptions import StoreError

#: "OOMG": marks a SQLite file as an oomguard store.
APPLICATION_ID = 0x4F4F4D47

#: MIGRATIONS[i] takes the schema from version i to i + 1. Append; never edit a released one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"PRAGMA application_id = {APPLICATION_ID}",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after retention
            time REAL NOT NULL,
            kind TEXT NOT NULL,
            cause TEXT NOT NULL,
            shard TEXT NOT NULL,
            pipeline TEXT NOT NULL,
            worker TEXT NOT NULL,
            host TEXT NOT NULL,
            signature_id TEXT NOT NULL,
            signature_title TEXT NOT NULL,
            evidence TEXT NOT NULL,  -- JSON object
            attempt INTEGER NOT NULL,
            grouping_version INTEGER NOT NULL
        )""",
        "CREATE INDEX events_time ON events(time)",
        "CREATE INDEX events_shard ON events(shard, time)",
        "CREATE INDEX events_signature ON events(signature_id, time)",
        "CREATE INDEX events_pipeline ON events(pipeline, time)",
        "CREATE INDEX events_cause ON events(cause, time)",
        """CREATE TABLE signatures (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            grouping_version INTEGER NOT NULL,
            count INTEGER NOT NULL,
            first_seen REAL NOT NULL,
            last_seen REAL NOT NULL,
            example TEXT NOT NULL
        )""",
        "CREATE INDEX signatures_rank ON signatures(count DESC, last_seen DESC)",
        # field: the index of the SignatureRow list in MEMBER_FIELDS.
        """CREATE TABLE signature_members (
            signature_id TEXT NOT NULL,
            field INTEGER NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (signature_id, field, value)
        ) WITHOUT ROWID""",
        """CREATE TABLE signature_distinct (
            signature_id TEXT NOT NULL,
            field INTEGER NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (signature_id, field)
        ) WITHOUT ROWID""",
        # Fires only for members really inserted (INSERT OR IGNORE skips duplicates).
        """CREATE TRIGGER signature_members_count AFTER INSERT ON signature_members BEGIN
            INSERT INTO signature_distinct (signature_id, field, n)
            VALUES (NEW.signature_id, NEW.field, 1)
            ON CONFLICT (signature_id, field) DO UPDATE SET n = n + 1;
        END""",
        """CREATE TABLE pipelines (
            name TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            shards_done INTEGER NOT NULL,
            shards_failed INTEGER NOT NULL,
            shards_aborted INTEGER NOT NULL,
            infra_failures INTEGER NOT NULL,
            user_failures INTEGER NOT NULL,
            summary TEXT NOT NULL,
            abort_reason TEXT NOT NULL,
            updated REAL NOT NULL
        )""",
        "CREATE INDEX pipelines_updated ON pipelines(updated)",
    ),
    (
        # Runs, not names: a pipeline's second run (or a name reused after a restart) gets
        # a row of its own. Rows stored before runs existed become the run started at 0.0.
        """CREATE TABLE pipeline_runs (
            name TEXT NOT NULL,
            started REAL NOT NULL,  -- when the run began; 0.0 when not known
            status TEXT NOT NULL,
            shards_done INTEGER NOT NULL,
            shards_failed INTEGER NOT NULL,
            shards_aborted INTEGER NOT NULL,
            infra_failures INTEGER NOT NULL,
            user_failures INTEGER NOT NULL,
            summary TEXT NOT NULL,
            abort_reason TEXT NOT NULL,
            updated REAL NOT NULL,
            PRIMARY KEY (name, started)
        )""",
        # In rowid order: pipelines() breaks ties of `updated` by rowid.
        """INSERT INTO pipeline_runs SELECT name, 0.0, status, shards_done, shards_failed,
            shards_aborted, infra_failures, user_failures, summary, abort_reason, updated
            FROM pipelines ORDER BY rowid""",
        "DROP TABLE pipelines",  # and its index
        "ALTER TABLE pipeline_runs RENAME TO pipelines",
        "CREATE INDEX pipelines_updated ON pipelines(updated)",
        # Bounded members: `stored` counts a field's rows in signature_members (at most the
        # writer's member_rows), `n` its distinct values (see FailureStore.distinct_counts).
        # Until now every member was stored, so stored = n; the writer now counts per batch.
        "ALTER TABLE signature_distinct ADD COLUMN stored INTEGER NOT NULL DEFAULT 0",
        "UPDATE signature_distinct SET stored = n",
        "DROP TRIGGER signature_members_count",
    ),
    (
        # Who ended the worker (issue 26): '' for a task's exception (no death). Deaths
        # stored before are 'unknown', inferred.
        "ALTER TABLE events ADD COLUMN killer TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE events ADD COLUMN killer_how TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE events ADD COLUMN killer_confidence TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE events ADD COLUMN killer_summary TEXT NOT NULL DEFAULT ''",
        """UPDATE events SET killer = 'unknown', killer_how = 'inferred',
            killer_confidence = 'likely' WHERE cause NOT IN ('exception', 'memory_error')""",
        "CREATE INDEX events_killer ON events(killer, time)",
    ),
    (
        # Clusters have names (issue 29): one history for many clusters. Rows stored
        # before are of cluster ''. A run is keyed by its cluster too, so two clusters'
        # runs of one name never overwrite each other: the table is rebuilt (SQLite cannot
        # change a primary key), its rows in rowid order as migration 2 keeps them.
        "ALTER TABLE events ADD COLUMN cluster TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX events_cluster ON events(cluster, time)",
        """CREATE TABLE pipeline_runs (
            name TEXT NOT NULL,
            started REAL NOT NULL,
            status TEXT NOT NULL,
            shards_done INTEGER NOT NULL,
            shards_failed INTEGER NOT NULL,
            shards_aborted INTEGER NOT NULL,
            infra_failures INTEGER NOT NULL,
            user_failures INTEGER NOT NULL,
            summary TEXT NOT NULL,
            abort_reason TEXT NOT NULL,
            updated REAL NOT NULL,
            cluster TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (name, started, cluster)
        )""",
        """INSERT INTO pipeline_runs SELECT name, started, status, shards_done,
            shards_failed, shards_aborted, infra_failures, user_failures, summary,
            abort_reason, updated, '' FROM pipelines ORDER BY rowid""",
        "DROP TABLE pipelines",  # and its index
        "ALTER TABLE pipeline_runs RENAME TO pipelines",
        "CREATE INDEX pipelines_updated ON pipelines(updated)",
        "CREATE INDEX pipelines_cluster ON pipelines(cluster, updated)",
    ),
    (
        # A spool for a PostgreSQL history (issue 29): its origin id and the last event id
        # sent (`ship_state`), the events an amend deleted after they may have been sent
        # (`ship_deletes`), and the pipeline runs changed since last sent (`shipped` 0).
        "CREATE TABLE ship_state (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
        "CREATE TABLE ship_deletes (seq INTEGER PRIMARY KEY, event_id INTEGER NOT NULL)",
        "ALTER TABLE pipelines ADD COLUMN shipped INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX pipelines_unshipped ON pipelines(shipped) WHERE shipped = 0",
    ),
    (
        # One account per worker death (issue 38): the decided death (one row, its JSON
        # without crash text or stacks: the trace stays with its signature), its tasks
        # with their roles (for the shard and pipeline filters), and on each event the id
        # of the death it is part of. Deaths stored before are events only: their `death`
        # is '' and they have no row here (not backfilled), so a signature counted each of
        # their events, as it still counts every event that has no death.
        "ALTER TABLE events ADD COLUMN death TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX events_death ON events(cluster, death) WHERE death <> ''",
        """CREATE TABLE deaths (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- insertion order, never reused
            id TEXT NOT NULL,
            cluster TEXT NOT NULL,
            time REAL NOT NULL,
            worker TEXT NOT NULL,
            host TEXT NOT NULL,
            cause TEXT NOT NULL,
            killer TEXT NOT NULL,
            signature_id TEXT NOT NULL,
            signature_title TEXT NOT NULL,
            grouping_version INTEGER NOT NULL,
            record TEXT NOT NULL,  -- JSON: Death.to_dict()
            UNIQUE (cluster, id)
        )""",
        "CREATE INDEX deaths_time ON deaths(time)",
        "CREATE INDEX deaths_cluster ON deaths(cluster, time)",
        "CREATE INDEX deaths_signature ON deaths(signature_id, time)",
        "CREATE INDEX deaths_worker ON deaths(worker, time)",
        """CREATE TABLE death_tasks (
            death INTEGER NOT NULL,  -- deaths.seq
            shard TEXT NOT NULL,
            pipeline TEXT NOT NULL,
            role TEXT NOT NULL,
            PRIMARY KEY (death, shard)
        ) WITHOUT ROWID""",
        "CREATE INDEX death_tasks_shard ON death_tasks(shard)",
        "CREATE INDEX death_tasks_pipeline ON death_tasks(pipeline)",
    ),
    (
        # Where a crash lives (issue 40, `environments.py`): each cluster's workers with
        # the environment their latest start said (a slot: a worker's nanny), and each
        # signature's first environment ('' until a death with one).
        """CREATE TABLE worker_environments (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- new with each update, never reused
            cluster TEXT NOT NULL,
            slot TEXT NOT NULL,
            time REAL NOT NULL,
            environment TEXT NOT NULL,  -- JSON: Environment
            UNIQUE (cluster, slot)
        )""",
        "CREATE INDEX worker_environments_cluster ON worker_environments(cluster, time)",
        "ALTER TABLE signatures ADD COLUMN first_environment TEXT NOT NULL DEFAULT ''",
    ),
    (
        # Signature states and versions (issue 40): a person's resolve (when, by whom, why;
        # 0 / '' never), the writer's regressions (the first sighting after the resolve; 0
        # none since), and the ids older grouping versions gave a signature, each pointing
        # at the signature it is now (`aliases.py`; `seq`: the order a spool ships them).
        "ALTER TABLE signatures ADD COLUMN resolved_at REAL NOT NULL DEFAULT 0",
        "ALTER TABLE signatures ADD COLUMN resolved_by TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE signatures ADD COLUMN resolve_note TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE signatures ADD COLUMN regressed_at REAL NOT NULL DEFAULT 0",
        "ALTER TABLE signatures ADD COLUMN regressions INTEGER NOT NULL DEFAULT 0",
        """CREATE TABLE signature_aliases (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            old_id TEXT NOT NULL UNIQUE,
            new_id TEXT NOT NULL,
            old_version INTEGER NOT NULL,
            new_version INTEGER NOT NULL,
            time REAL NOT NULL  -- when the old id was first seen to be the new one
        )""",
        "CREATE INDEX signature_aliases_new ON signature_aliases(new_id)",
        # A signature's rate counts its deaths (deaths_signature) and its events that have
        # no death (task exceptions): this index counts those without reading a row.
        "CREATE INDEX events_no_death ON events(signature_id, time) WHERE death = ''",
    ),
    (
        # Incidents and related signatures (issue 40). Each death names its incident (the
        # id of the incident's first death): those stored before are each their own. An
        # incident is read from its deaths, found by its first (`id = incident`) and
        # gathered by (cluster, incident) (`incidents.py`). The crash sites of the
        # signatures of stored deaths, and the signatures related by a site or an incident,
        # each link stored both ways (`links.py`).
        "ALTER TABLE deaths ADD COLUMN incident TEXT NOT NULL DEFAULT ''",
        "UPDATE deaths SET incident = id",
        "CREATE INDEX deaths_incident ON deaths(cluster, incident)",
        "CREATE INDEX deaths_incidents ON deaths(time) WHERE id = incident",
        "CREATE INDEX deaths_cluster_incidents ON deaths(cluster, time) WHERE id = incident",
        """CREATE TABLE signature_sites (
            site TEXT NOT NULL,
            signature_id TEXT NOT NULL,
            PRIMARY KEY (site, signature_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX signature_sites_signature ON signature_sites(signature_id)",
        """CREATE TABLE signature_links (
            signature_id TEXT NOT NULL,
            related_id TEXT NOT NULL,
            site INTEGER NOT NULL,  -- 1: they share a crash site
            incident INTEGER NOT NULL,  -- 1: deaths of one incident carry them
            PRIMARY KEY (signature_id, related_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX signature_links_related ON signature_links(related_id)",
    ),
)

#: The SignatureRow lists kept in signature_members; the position is the stored code.
MEMBER_FIELDS = ("hosts", "workers", "shards", "pipelines", "causes", "clusters")

# In PipelineStatus's field order.
PIPELINE_COLUMNS = (
    "name, status, shards_done, shards_failed, shards_aborted, "
    "infra_failures, user_failures, summary, abort_reason, started, cluster"
)


def refusal(kind: str, message: str) -> StoreError:
    """A StoreError whose `kind` says why (one of `STORE_PROBLEMS`): the plugin's recovery
    (`oomguard._store.recover`) moves a "corrupt" or "newer_schema" file aside and leaves a
    "foreign" or "unwritable" one where it is."""
    err = StoreError(message)
    err.kind = kind  # type: ignore[attr-defined]
    return err


#: Why a store file could not be opened; see `refusal`.
STORE_PROBLEMS = ("corrupt", "newer_schema", "foreign", "unwritable")


def connect(file: str) -> sqlite3.Connection:
    # Autocommit mode: transactions are explicit. check_same_thread off so close() can close
    # every connection; each is still used by one thread only.
    conn = sqlite3.connect(file, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


def check_file(file: str, known: int) -> None:
    """Refuse, before writing a byte, a file we must not touch: StoreError naming `file` and
    the fix when it is not SQLite, is another application's, or has a schema version above
    `known`. Opens the file read-only."""
    try:
        with open(file, "rb") as f:
            magic = f.read(16)
    except OSError as e:
        raise refusal("unwritable", f"Cannot read the failure store {file}: {e}.") from e
    if magic != b"SQLite format 3\x00":
        # SQLite would take a file shorter than its header for an empty database and
        # write over it; whatever it is, it is not ours.
        raise refusal(
            "corrupt",
            f"The failure store {file} is not a SQLite database (it does not start with the "
            "SQLite header). oomguard left it untouched: move it aside, or point "
            "oomguard.scheduler.store at another path.",
        )
    uri = pathlib.Path(file).as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as e:
        raise refusal("unwritable", f"Cannot open the failure store {file}: {e}.") from e
    try:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.OperationalError as e:  # e.g. a read-only directory: no -shm for WAL
        raise refusal("unwritable", f"Cannot open the failure store {file}: {e}.") from e
    except sqlite3.DatabaseError as e:
        raise refusal(
            "corrupt",
            f"The failure store {file} is not a usable SQLite database ({e}). oomguard left "
            "it untouched: move it aside, or point oomguard.scheduler.store at another path.",
        ) from e
    finally:
        conn.close()
    if app not in (0, APPLICATION_ID) or (app == 0 and tables):
        raise refusal(
            "foreign",
            f"{file} is a SQLite database of another application (application_id {app}, "
            f"{tables} schema objects), not an oomguard failure store. oomguard left it "
            "untouched: point oomguard.scheduler.store at another path.",
        )
    if version > known:
        raise refusal(
            "newer_schema",
            f"The failure store {file} has schema version {version}, but this oomguard "
            f"knows versions up to {known}: it was written by a newer oomguard. Upgrade "
            "oomguard, or point oomguard.scheduler.store at another path. The file was left "
            "untouched.",
        )


def require_json(conn: sqlite3.Connection, file: str) -> None:
    try:
        conn.execute("SELECT json_group_array(1)").fetchone()
    except sqlite3.OperationalError as e:
        raise StoreError(
            f"The failure store {file} needs SQLite's JSON functions, which this Python's "
            f"SQLite {sqlite3.sqlite_version} lacks ({e}). Use a Python built with SQLite "
            ">= 3.38, or with the JSON1 extension."
        ) from e


def migrate(conn: sqlite3.Connection, file: str, migrations: tuple[tuple[str, ...], ...]) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for target in range(version + 1, len(migrations) + 1):
        try:
            conn.execute("BEGIN IMMEDIATE")
            for statement in migrations[target - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")  # in the same transaction
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            kind = "unwritable" if isinstance(e, sqlite3.OperationalError) else "corrupt"
            raise refusal(
                kind,
                f"Migrating the failure store {file} from schema version {target - 1} to "
                f"{target} failed ({e}); it was rolled back and the file is at version "
                f"{target - 1}.",
            ) from e
