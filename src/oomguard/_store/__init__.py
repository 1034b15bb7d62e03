"""The failure history: every worker death (one row each, with its tasks and their roles),
every failure event, one deduplicated row per signature, and the last status of every
pipeline run, in one SQLite file (stdlib `sqlite3`). Knows nothing of Dask.

`FailureStore` holds a writer (`writer.Writer`: the queue and its thread) and a reader
(`reads.Reader`: the read connections), each owning its own state.

Writes never touch the disk on the caller's thread: `add()`, `record()` and
`upsert_pipeline()` append to a bounded in-memory queue (O(1), no I/O, never blocks;
bounded in items, `queue_size`, and in encoded bytes, `queue_bytes`; a full queue refuses
the newest, returns False and counts it in `overflow`, with one WARNING per time it fills).
One writer thread commits the queue in batches, one transaction each, every
`batch_interval` seconds or every `BATCH_EVENTS` items. Reads run on the
caller's thread with that thread's own connection; the file is in WAL mode, so a read never
waits for the writer. Exactly one `FailureStore` may write a given file at a time.

Durability: WAL with `synchronous=NORMAL`. A commit is written to the WAL file (the OS page
cache) before `flush()` returns True, so it survives the process being SIGKILLed; it is
not fsynced, so a power loss or kernel crash may lose the last commits (never corrupt the
file). A failure history is diagnostics, not a ledger: we trade that for write speed.

Deaths: `record(death, events)` stores one decided `Death` (its JSON without crash text or
stacks) and the events of the tasks it is blamed on, each naming it (`FailureEvent.death`),
in one transaction; one row per (cluster, id). `record(..., amend=True)` replaces the death
of that (cluster, id) and its events (a late report, a pod's or SLURM's verdict), in the
same batch or a later one; a repeat without `amend` is dropped. `deaths()` reads them back
(leniently: a row of an older or newer oomguard reads). Deaths stored before this schema
(version 6) are events only: no row, `death` '' (not backfilled).

Deduplication: `signatures` holds one row per signature id across every host: count (each
death that carries it once, however many of its events name it, and each event that has no
death: a task's exception, an event stored before deaths had rows), first/last seen,
title and grouping version (from the latest write), and the example trace (the first
non-empty one given). The distinct hosts, workers, shards, pipelines, causes and clusters
of a signature (from its events) live in `signature_members` (empty strings are not
recorded), at most `member_rows` of each: the first to arrive (within one batch, the
smallest), so a signature hit by millions of shards stays small. A returned SignatureRow
lists at most `member_cap` of those, sorted; the `cause` and `pipeline` filters of
`signatures()` see only them. `distinct_counts()` counts on past them: exact until a value
goes unstored, a lower bound after (see there). Rows already stored past the bound (by an
older oomguard, or a larger `member_rows`) are kept.

Incidents and related signatures (issue 40): each death names its incident, the id of its
first death; `incidents()` reads incidents from their deaths (`incidents.py`), so they are
the same after a restart and go whole with retention. The crash sites of the signatures of
stored deaths, and the links of signatures that share a site or an incident, both ways and
at most `RELATED_MAX` per signature, are kept per batch (`links.py`); a SignatureRow lists
them in `related`.

A pipeline is stored per run, keyed by (name, `started`, cluster): a second run of "etl",
or the name reused by a new scheduler or another cluster, does not overwrite the first.

Clusters: every event and run carries the name of the cluster that stored it (`cluster`,
'' for rows stored before clusters had names); one file may hold the history of many
clusters, one after another. Reads take `cluster=` to narrow to one; a signature's counts
span every cluster, and its `clusters` member list names them.

A full disk: a batch that does not fit is committed in halves, down to single items, so
what fits is written; the rest stays at the head of the queue (bounded by it), is retried
every `full_retry` seconds one item first, and written once there is room (one WARNING
each way, `disk_full` counts the times). At close with the disk still full it is lost,
counted in `write_errors`.

Retention, in the writer's commits: past `max_events` the oldest events (in insertion
order) are deleted, and past `max_events` deaths the oldest deaths, signatures not, so
counts survive; past `max_signatures` the least
recently seen signatures (with their members; their events stay); past `max_pipelines`
runs the least recently updated finished ones, never a running one.

Schema: `PRAGMA user_version` is the number of migrations applied; `MIGRATIONS[i]` takes
version i to i+1 in one transaction. `PRAGMA application_id` marks the file as ours. A
file from a newer oomguard, from another application, or that is not SQLite is refused
with `StoreError` naming the path (its `kind` says why), and left byte-for-byte untouched.
`recover.open_store` is what a scheduler uses: such a file is moved aside, or left alone,
and a fresh store opened, so a diagnostics file never stops a cluster.
"""

from __future__ import annotations

from .schema import APPLICATION_ID, MEMBER_FIELDS, MIGRATIONS, check_file
from .store import FailureStore
from .writer import BATCH_EVENTS, WAL_CHECKPOINT_PAGES, WRITER_CACHE_KIB

__all__ = [
    "APPLICATION_ID",
    "BATCH_EVENTS",
    "MEMBER_FIELDS",
    "MIGRATIONS",
    "WAL_CHECKPOINT_PAGES",
    "WRITER_CACHE_KIB",
    "FailureStore",
    "check_file",
]
