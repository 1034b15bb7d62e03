"""The dashboard page's data: worker deaths (each once, as `Failures.deaths()` has them)
and task exceptions binned by cause, the incident, signature and pipeline tables as column
dicts, one signature's drill-down text (with its related signatures), and the store reads
behind them. Pure: no Bokeh, no Dask (the
page in `_dashboard.py` shows what these return).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .._causes import Cause
from .._words import environment_line, suspects_phrase

if TYPE_CHECKING:
    from .._models import FailureEvent, Incident, PipelineStatus, SignatureRow

logger = logging.getLogger("oomguard.scheduler")

#: The plot covers this much history, from at most this many deaths and as many events
#: (newest first).
WINDOW_S = 24 * 3600.0
MAX_EVENTS = 5000
MAX_SIGNATURES = 200
MAX_PIPELINES = 200
MAX_INCIDENTS = 200
#: Bin widths for the plot, seconds; the smallest giving at most MAX_BINS bins is used.
BIN_STEPS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400)
MAX_BINS = 60
OTHER = "other"
CAUSES = tuple(c.value for c in Cause) + (OTHER,)
#: The causes of a task's own failure (an exception it raised): no worker died.
TASK_CAUSES = frozenset({Cause.EXCEPTION.value, Cause.MEMORY_ERROR.value})


class DeathAt(NamedTuple):
    """One worker death, as the plot needs it (`FailureStore.death_times`)."""

    time: float
    cause: str


def failure_columns(failures: Iterable[DeathAt | FailureEvent], now: float) -> dict[str, list]:
    """Counts per time bin and cause, as ColumnDataSource columns: `time` (bin centre, ms
    since the epoch), `width` (ms) and one column per cause in CAUSES. Each of `failures`
    counts once: a worker death (whatever the number of its tasks) or a task's exception
    (`Snapshot.failures`); anything with a `time` and a `cause`.

    >>> deaths = [DeathAt(*d) for d in store.death_times(since=time.time() - 3600)]
    >>> sum(failure_columns(deaths, time.time())["oom_kill"])
    3
    """
    events = list(failures)
    columns: dict[str, list] = {"time": [], "width": [], **{c: [] for c in CAUSES}}
    if not events:
        return columns
    oldest = min(e.time for e in events)
    span = max(now - oldest, 60.0)
    width = next((w for w in BIN_STEPS if span / w <= MAX_BINS), BIN_STEPS[-1])
    start = math.floor(oldest / width) * width
    n = min(int((now - start) // width) + 1, MAX_BINS + 1)
    counts = {c: [0] * n for c in CAUSES}
    for e in events:
        # A clock ahead of ours (another host) lands in the newest bin, not off the plot.
        i = min(max(int((e.time - start) // width), 0), n - 1)
        counts[e.cause if e.cause in counts else OTHER][i] += 1
    columns["time"] = [(start + (i + 0.5) * width) * 1000 for i in range(n)]
    columns["width"] = [width * 1000 * 0.9] * n
    columns.update(counts)
    return columns


def signature_columns(rows: Sequence[SignatureRow], cluster: str = "") -> dict[str, list]:
    """The signature table's columns; times in ms since the epoch; `other_clusters`: how
    many clusters besides `cluster` (this one) saw each signature.

    >>> signature_columns(store.signatures(limit=20), "etl")["other_clusters"]
    [2]
    """
    return {
        "id": [r.id for r in rows],
        "state": [r.state for r in rows],
        "count": [r.count for r in rows],
        "hosts": [len(r.hosts) for r in rows],
        "first_seen": [r.first_seen * 1000 for r in rows],
        "last_seen": [r.last_seen * 1000 for r in rows],
        "title": [r.title for r in rows],
        "causes": [", ".join(r.causes) for r in rows],
        "other_clusters": [len(set(r.clusters) - {cluster}) for r in rows],
    }


def incident_columns(rows: Sequence[Incident]) -> dict[str, list]:
    """The incident table's columns (newest first); times in ms since the epoch.

    >>> incident_columns(store.incidents(limit=20))["deaths"]
    [3, 1]
    """
    return {
        "id": [r.id for r in rows],
        "start": [r.start * 1000 for r in rows],
        "deaths": [r.deaths for r in rows],
        "place": [r.place for r in rows],
        "cause": [r.cause for r in rows],
        "killer": [r.killer for r in rows],
        "summary": [r.summary for r in rows],
    }


def pipeline_columns(
    live: Sequence[PipelineStatus], stored: Sequence[PipelineStatus]
) -> dict[str, list]:
    """Live pipelines (from the policy) first, then finished ones from the store.

    >>> pipeline_columns([policy.status("nightly")], store.pipelines())["name"]
    ['nightly', 'backfill']
    """
    names = {p.name for p in live}
    rows = [(p, "live") for p in live] + [(p, "stored") for p in stored if p.name not in names]
    return {
        "name": [p.name for p, _ in rows],
        "status": [p.status for p, _ in rows],
        "source": [s for _, s in rows],
        "shards_done": [p.shards_done for p, _ in rows],
        "shards_failed": [p.shards_failed for p, _ in rows],
        "shards_aborted": [p.shards_aborted for p, _ in rows],
        "infra_failures": [p.infra_failures for p, _ in rows],
        "user_failures": [p.user_failures for p, _ in rows],
        "summary": [p.summary for p, _ in rows],
    }


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="seconds")


def _members(values: Sequence[str], shown: int = 20) -> str:
    if not values:
        return "-"
    more = f" ... and {len(values) - shown} more" if len(values) > shown else ""
    return ", ".join(values[:shown]) + more


def _related(row: SignatureRow) -> list[str]:
    """The related signatures of `row`, one line each (why, id, title)."""
    lines = [f"{r.get('id')} ({r.get('why')}): {r.get('title') or '-'}" for r in row.related]
    return [f"{'related' if i == 0 else '':<10} {line}" for i, line in enumerate(lines or "-")]


def signature_detail(row: SignatureRow | None, events: Sequence[FailureEvent]) -> str:
    """Plain text (never HTML) for one signature: who, where, the example trace, and the
    evidence of its latest failures.

    >>> print(signature_detail(store.signature("3f2a9c"), store.events(signature="3f2a9c")))
    MemoryError in parse_block
    ...
    """
    if row is None:
        return "This signature is no longer in the store."
    lines = [
        row.title,
        "",
        f"signature  {row.id} (grouping version {row.grouping_version})",
        *([f"old ids    {_members(row.aliases)}"] if row.aliases else []),
        f"state      {_state(row)}",
        f"count      {row.count}, first seen {_when(row.first_seen)}, "
        f"last seen {_when(row.last_seen)}",
        f"causes     {_members(row.causes)}",
        f"hosts      {_members(row.hosts)}",
        f"workers    {_members(row.workers)}",
        f"shards     {_members(row.shards)}",
        f"pipelines  {_members(row.pipelines)}",
        f"clusters   {_members(row.clusters)}",
        *_related(row),
        "",
        "Where it lives",
        "--------------",
        f"first environment  {environment_line(row.first_environment) or 'not known'}",
        "suspects           "
        + (suspects_phrase(row.environment_suspects) or "none stands out against the workers"),
        "",
        "Example trace",
        "-------------",
        row.example.rstrip() or "(no trace was recorded for this signature)",
        "",
        "Latest failures, newest first",
        "-----------------------------",
    ]
    for e in events:
        lines.append(
            f"{_when(e.time)}  {e.cause}  shard {e.shard}  attempt {e.attempt}  "
            f"worker {e.worker or '-'}  host {e.host or '-'}"
        )
        if e.killer:
            lines.append(
                f"  killed by {e.killer} ({e.killer_how}, {e.killer_confidence}): "
                f"{e.killer_summary or '-'}"
            )
        lines.append("  evidence " + json.dumps(e.evidence, sort_keys=True, default=str))
    if not events:
        lines.append("(none kept: retention dropped them)")
    return "\n".join(lines)


def _state(row: SignatureRow) -> str:
    """The state and what it rests on, in one line."""
    said = [row.state or "-", f"{row.last_hour} in the last hour, {row.hourly:g} an hour before"]
    if row.resolved_at:
        said.append(f"resolved {_when(row.resolved_at)} by {row.resolved_by or '?'}")
        if row.resolve_note:
            said.append(f"note: {row.resolve_note}")
    if row.regressions:
        said.append(f"regressed {_when(row.regressed_at)} ({row.regressions} times)")
    return "; ".join(said)


@dataclass
class Snapshot:
    """What one refresh read from the store (in a thread): the window's worker deaths (one
    each), task exceptions (and MemoryErrors: failures no worker died of) and incidents,
    the signatures and the pipeline runs."""

    deaths: list[DeathAt] = field(default_factory=list)
    exceptions: list[FailureEvent] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    signatures: list[SignatureRow] = field(default_factory=list)
    pipelines: list[PipelineStatus] = field(default_factory=list)
    written: int = -1

    def failures(self) -> list[DeathAt | FailureEvent]:
        """What the plot counts: each worker death once, each task exception once."""
        return [*self.deaths, *self.exceptions]


def read_store(store: Any, now: float, cluster: str | None = None) -> Snapshot:
    """Blocking: run it in a thread. `cluster`: this cluster's events and runs, and the
    signatures it saw (None: the whole history)."""
    written = store.written
    # The table shows no suspects: its rows are read without them (a signature's detail has
    # them).
    signatures = store.signatures(limit=MAX_SIGNATURES, cluster=cluster, environment=False)
    history = getattr(store, "history", None)
    if history is not None and history.shipper.up and signatures:
        # The PostgreSQL history knows every cluster that saw them, and their whole count
        # (one bounded query; with the history away, this scheduler's own view).
        try:
            signatures = history.reader.signatures(
                limit=MAX_SIGNATURES, cluster=cluster, environment=False
            )
        except Exception as e:  # away since: the next refresh tries again
            logger.info("oomguard dashboard: the history is away (%s)", type(e).__name__)
    window = {"since": now - WINDOW_S, "limit": MAX_EVENTS, "cluster": cluster}
    exceptions = [e for c in sorted(TASK_CAUSES) for e in store.events(cause=c, **window)]
    return Snapshot(
        deaths=[DeathAt(*d) for d in store.death_times(**window)],
        exceptions=[e for e in exceptions if not e.death],
        incidents=store.incidents(since=now - WINDOW_S, limit=MAX_INCIDENTS, cluster=cluster),
        signatures=signatures,
        pipelines=store.pipelines(limit=MAX_PIPELINES, cluster=cluster),
        written=written,
    )


def read_detail(store: Any, signature_id: str) -> str:
    """Blocking: run it in a thread."""
    return signature_detail(
        store.signature(signature_id), store.events(signature=signature_id, limit=5)
    )
