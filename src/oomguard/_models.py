"""Plain records: failure events, signature rows, pipeline statuses, what the failure
policy counts of a run and of a failed shard, and its verdict that a run must stop.

They know nothing of I/O or Dask. Each serialises to a JSON-able dict (`to_dict`) and back
(`from_dict`), so the CLI's `--json`, the store and the Python API agree on one shape. Each
repr is one short line with local clock times (`oomguard._display` says how long values are
cut); the fields hold everything.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ._display import clock, shorten
from ._exceptions import PipelineAborted

T = TypeVar("T", bound="_Record")


# Evidence is a dict of plain values from a nanny's report or the store; these read one
# value as what it must be, or not at all (a bool is not an int, NaN not a number).


def evidence_int(value: Any) -> int | None:
    return value if type(value) is int else None


def evidence_number(value: Any) -> int | float | None:
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return value
    return None


def evidence_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class _Record:
    _list_fields: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs = {k: v for k, v in d.items() if k in names}
        for name in cls._list_fields:
            if name in kwargs and kwargs[name] is not None:
                kwargs[name] = list(kwargs[name])
        return cls(**kwargs)


@dataclass(frozen=True, repr=False)
class FailureEvent(_Record):
    """One failure of one shard: a worker death blamed on it, or an exception it raised.

    kind      "infra" | "user"
    cause     see `oomguard.Cause`
    shard     the task key, as `str(key)`
    pipeline  the span or annotation that names the pipeline (see docs/configuration.md)
    signature_id / signature_title   the deduplicated crash signature
    evidence  plain data naming its sources, e.g. {"oom_kill_delta": 1, "source": ...}
    attempt   1 for the shard's first failure, 2 for its second, ...
    time      seconds since the epoch, when the failure happened
    killer    who ended the worker, see `oomguard.Killer` ("" for a task's exception)
    killer_how         how that is known, see `oomguard.Known`
    killer_confidence  "confirmed" (evidence names it) or "likely" (inferred)
    killer_summary     one sentence, e.g. "SIGTERM from earlyoom (pid 812) at
                       MemAvailable 4.1 %"; its facts are in `evidence`
    cluster   the name of the cluster that saw it (oomguard.scheduler.cluster-name); ""
              for events stored before clusters had names
    death     the id of the worker death it is part of (`Failures.deaths`); "" for a
              task's exception, and for events stored before deaths had ids
    """

    kind: str
    cause: str
    shard: str
    pipeline: str
    worker: str
    host: str
    signature_id: str
    signature_title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    time: float = 0.0
    id: int | None = None  # assigned by the store
    killer: str = ""
    killer_how: str = ""
    killer_confidence: str = ""
    killer_summary: str = ""
    cluster: str = ""
    death: str = ""

    def __repr__(self) -> str:
        """<FailureEvent 2026-05-01 14:03:07 oom_kill killer=kernel shard=('load', 17)
        attempt=2 pipeline=etl worker=tcp://10.0.3.11:40211>, one line; the killer only for
        a death, attempt only past the first."""
        attempt = f" attempt={self.attempt}" if self.attempt != 1 else ""
        killer = f" killer={shorten(self.killer, 16)}" if self.killer else ""
        return (
            f"<FailureEvent {clock(self.time)} {shorten(self.cause, 20)}{killer} "
            f"shard={_short(self.shard, 48)}{attempt} pipeline={_short(self.pipeline, 24)} "
            f"worker={_short(self.worker, 32)}>"
        )


@dataclass(frozen=True, repr=False)
class SignatureRow(_Record):
    """One deduplicated signature across every host and every cluster of the history:
    `count` counts its events on all of them, `clusters` names the clusters that saw it.

    Where it lives (docs/reading-a-report.md): `first_environment`, the environment of its
    first death that had one ({} when none did), and `environment_suspects`, the label and
    environment values its deaths have much more often than the workers they died among,
    the most telling first: dicts of name, value, deaths, of_deaths, workers, of_workers and
    p (e.g. NODE_POOL=spot on 4 of 4 deaths, 2 of 5 workers).

    Its state (docs/reading-a-report.md, "Signature states"):

    state         "new", "ongoing", "escalating", "regressed" or "resolved" ("" from an
                  oomguard that had no states)
    resolved_at   when a person resolved it (`Failures.resolve`), 0.0 never;
    resolved_by   who, as their client said; resolve_note: why
    regressed_at  its first sighting after that resolve, 0.0 none; regressions: how many
                  times it came back after a resolve
    last_hour     its sightings in the last hour; hourly: its hourly average in the 24 h
                  before (or since first seen)
    aliases       the ids older grouping versions gave it: they find it too
    """

    _list_fields: ClassVar[tuple[str, ...]] = (
        "hosts",
        "workers",
        "shards",
        "pipelines",
        "causes",
        "clusters",
        "environment_suspects",
        "aliases",
        "related",
    )

    id: str
    title: str
    grouping_version: int
    count: int
    first_seen: float
    last_seen: float
    hosts: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    pipelines: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    example: str = ""  # a normalised trace, paths scrubbed
    clusters: list[str] = field(default_factory=list)
    first_environment: dict[str, Any] = field(default_factory=dict)
    environment_suspects: list[dict[str, Any]] = field(default_factory=list)
    state: str = ""
    resolved_at: float = 0.0
    resolved_by: str = ""
    resolve_note: str = ""
    regressed_at: float = 0.0
    regressions: int = 0
    last_hour: int = 0
    hourly: float = 0.0
    aliases: list[str] = field(default_factory=list)
    # Signatures related to it, each {"id", "title", "why"}: why is "same crash site"
    # (the same error in the same function, reached from another caller), "same incident"
    # (a death of one incident with a death of this one), or both; at most RELATED_MAX.
    related: list[dict[str, str]] = field(default_factory=list)

    def __repr__(self) -> str:
        """<SignatureRow 6d4c109d5cf8c83f 'oom_kill in load_shard' regressed count=3
        hosts=2 causes=oom_kill last 2026-05-01 14:03:07 suspect NODE_POOL=spot>; the id is
        never cut, the most telling suspect said where there is one."""
        causes = shorten(",".join(self.causes), 40) or "''"
        state = f" {shorten(self.state, 12)}" if self.state else ""
        suspect = ""
        if self.environment_suspects and isinstance(self.environment_suspects[0], dict):
            s = self.environment_suspects[0]
            value = f"{s.get('name')}={s.get('value')}"
            suspect = f" suspect {shorten(value, 40)}"
        return (
            f"<SignatureRow {self.id} {shorten(self.title, 60)!r}{state} count={self.count} "
            f"hosts={len(self.hosts)} causes={causes} last {clock(self.last_seen)}{suspect}>"
        )


#: Related signatures a SignatureRow keeps at most (the store keeps no more per signature).
RELATED_MAX = 20


@dataclass(frozen=True, repr=False)
class Incident(_Record):
    """Worker deaths that one cause explains: several workers of one place ended at once by
    one killer (a container kill, a node's OOM sweep, a SLURM job ending), or one death
    alone (docs/reading-a-report.md, "Incidents").

    id        the id of its first death; each of its deaths names it (`Death.incident`)
    start     the time of its earliest death, seconds since the epoch
    end       the time of its latest death
    deaths    how many worker deaths it has; each still counts once in its signature, its
              shard's failures and oomguard_worker_deaths_total
    hosts     the hosts of its deaths (at most 20)
    cause, killer   what ended its first death (see `oomguard.Cause`, `oomguard.Killer`)
    summary   one line, e.g. "host node-1: 3 workers within 0.4 s, sigkill; SIGKILL from ..."
    cluster   the cluster that saw it
    place     where one cause ended them: "host node-1", "SLURM job 12", "node pool-a-3"
    signatures  the signatures of its deaths (at most 20)
    """

    _list_fields: ClassVar[tuple[str, ...]] = ("hosts", "signatures")

    id: str
    start: float
    end: float
    deaths: int
    hosts: list[str]
    cause: str
    killer: str
    summary: str
    cluster: str = ""
    place: str = ""
    signatures: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        """<Incident 2026-05-01 14:03:07 sigkill killer=unknown deaths=3 host node-1>"""
        return (
            f"<Incident {clock(self.start)} {shorten(self.cause, 20)} "
            f"killer={shorten(self.killer, 16)} deaths={self.deaths} "
            f"{_short(self.place, 40)}>"
        )


@dataclass(frozen=True, repr=False)
class PipelineStatus(_Record):
    """Where a pipeline stands.

    status  "running" | "succeeded" | "succeeded_after_infra_failures" | "failed" | "aborted"
    summary one plain sentence naming the layer that failed
    started when this run of the pipeline began, seconds since the epoch; with the name and
            the cluster it tells runs apart (0.0: not known, as for runs stored before
            oomguard had runs)
    cluster the name of the cluster that ran it ("" for runs stored before clusters had
            names)
    """

    name: str
    status: str
    shards_done: int
    shards_failed: int
    shards_aborted: int
    infra_failures: int
    user_failures: int
    summary: str
    abort_reason: str = ""
    started: float = 0.0
    cluster: str = ""

    def __repr__(self) -> str:
        """<PipelineStatus etl aborted started 2026-05-01 14:02:07 done=12 failed=0
        aborted=3 infra=2 user=0>"""
        return (
            f"<PipelineStatus {_short(self.name, 40)} {shorten(self.status, 32)} started "
            f"{clock(self.started)} done={self.shards_done} failed={self.shards_failed} "
            f"aborted={self.shards_aborted} infra={self.infra_failures} "
            f"user={self.user_failures}>"
        )


def _short(value: str, width: int) -> str:
    """A name for a repr: shortened, and '' when empty so that it is seen to be empty."""
    return shorten(value, width) or "''"


# --- what the failure policy (oomguard._decide.policy) keeps, and its verdict


@dataclass(slots=True)
class ShardFailure:
    """One infra failure of a shard, as its record keeps it."""

    cause: str
    worker: str
    host: str
    signature_id: str
    conclusive: bool = True  # False: a memory kill shared with other tasks, no evidence
    shard_cause: bool = False  # points at the shard itself (_causes.shard_death)


@dataclass(slots=True)
class ShardRecord:
    """What the policy keeps of a shard that failed at least once."""

    pipeline: str
    infra: int = 0
    shared: int = 0  # infra failures that were memory kills shared with other tasks
    user: int = 0
    failures: list[ShardFailure] = field(default_factory=list)  # infra only, capped
    causes: Counter[str] = field(default_factory=Counter)  # infra causes
    last_kind: str = ""
    last_user: str = ""  # the exception's name, for "raised ValueError past its retries"
    last_words: str = ""  # describe_cause of the last infra failure, with its evidence
    ended: str = ""  # "" | "done" | "erred" | "aborted" | "forgotten"


@dataclass(slots=True)
class PipelineCounts:
    """A pipeline run's counters (the policy keeps one per run)."""

    name: str = ""  # the pipeline's name; the policy's own key is the run's label
    started: float = 0.0
    submitted: int = 0
    done: int = 0
    erred: int = 0
    aborted: int = 0
    forgotten: int = 0
    displaced: int = 0  # shards moved off workers that died or stopped, never counted
    displaced_executing: int = 0  # of them, known to have been executing there
    displaced_queued: int = 0  # known to have been only queued there
    crash_displaced: int = 0  # of displaced: executing beside the task whose thread crashed
    # pipeline name -> this run's executing shards whose work another pipeline's death took
    lost_to: Counter[str] = field(default_factory=Counter)
    isolated: int = 0  # shards retried alone after a memory kill of a worker running several
    infra: int = 0
    user: int = 0
    memory_errors: int = 0
    memory_waits: int = 0  # tasks that waited for host memory (admission) before running
    memory_waited: float = 0.0  # seconds, all those waits together
    deaths: Counter[str] = field(default_factory=Counter)  # by cause, one per worker death
    killers: Counter[str] = field(default_factory=Counter)  # by killer, one per worker death
    # worker -> time of its last death: one death that took several shards counts once.
    last_death: dict[str, float] = field(default_factory=dict)
    failed: dict[str, None] = field(default_factory=dict)  # ordered set of failed shards
    erred_shards: list[str] = field(default_factory=list)  # first few: the culprit
    decision: AbortDecision | None = None

    def unfinished(self) -> int:
        return max(0, self.submitted - self.done - self.erred - self.aborted - self.forgotten)


@dataclass(frozen=True)
class AbortDecision:
    """The policy's verdict that a pipeline must stop: one of its shards will never finish.

    The plugin errs every unfinished task of `pipeline` with `exception()`.

    >>> d = AbortDecision("etl", "('load', 7)", "oom_kill", 3, "3f2a", "MemoryError in load",
    ...                   {}, ("tcp://a:1",), ("node-a",), "oomguard aborted ...")
    >>> d.exception().shard
    "('load', 7)"
    """

    pipeline: str
    shard: str
    cause: str
    count: int
    signature_id: str
    signature_title: str
    evidence: dict
    workers: tuple[str, ...]
    hosts: tuple[str, ...]
    message: str

    def exception(self, task: Any = None, allowed_failures: int = 0) -> PipelineAborted:
        """The exception every unfinished task of the pipeline errs with: a KilledWorker of
        `task` (the shard's key) on its last worker, Dask's `allowed_failures` given."""
        return PipelineAborted(
            self.message,
            pipeline=self.pipeline,
            shard=self.shard,
            cause=self.cause,
            count=self.count,
            signature=self.signature_id,
            evidence=self.evidence,
            task=task,
            last_worker=self.workers[-1] if self.workers else "",
            allowed_failures=allowed_failures,
        )
