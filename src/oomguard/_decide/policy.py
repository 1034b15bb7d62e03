"""Shard-failure accounting: when a shard is a deterministic crasher, and how a pipeline stands.

Pure: no Dask, no I/O. The decision core maps task keys to pipeline runs and drives one
`FailurePolicy` with what it sees (submissions, the end of each shard, failure events); the
policy answers with an `AbortDecision` at most once per pipeline, and with a
`PipelineStatus` whose summary is one plain sentence (its words: `oomguard._words`).

Memory stays O(pipelines + failed shards): a pipeline is a handful of counters, and only a
shard that failed at least once gets a record (both in `counts`). The plugin therefore owns
the contract that keeps counters right: each shard is submitted once, and ends once (done,
erred or forgotten) unless `shard_reopened` says its result was lost and it runs again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .._causes import DEATH_CAUSES, Cause, Killer, Kind, kind_of, shard_death
from .._models import (
    AbortDecision,
    FailureEvent,
    PipelineCounts,
    PipelineStatus,
    ShardFailure,
    ShardRecord,
)
from .._words import (
    abort_message,
    describe_cause,
    exception_name,
    no_larger_abort_message,
    over_budget_message,
    pipeline_summary,
    suspects_sentence,
)
from .runs import RunLabel, ShardKey

__all__ = ["AbortDecision", "FailurePolicy"]

# Past this many infra failures of one shard only the counters grow, so a shard that keeps
# dying cannot grow the policy without bound.
_HISTORY_CAP = 64
# Erred shards kept per pipeline: the first names the culprit of a failed run.
_ERRED_KEPT = 5


# --------------------------------------------------------------------------- policy


class FailurePolicy:
    """Counts shard failures per pipeline and decides when a shard is a deterministic crasher.

    A shard is one when its infra failures reach `max_shard_infra_failures`, or (with
    `abort_on_repeat_signature`) when it died with the same signature on two different
    workers for a cause that points at the shard (oom_kill, memory_terminate, native_crash,
    memory_error). User exceptions are counted but never abort: task retries handle them.

    >>> p = FailurePolicy(max_shard_infra_failures=3)
    >>> p.pipeline_submitted("etl", ["a", "b"])
    >>> ev = lambda w: FailureEvent("infra", "oom_kill", "a", "etl", w, "h", "sig1", "MemoryError")
    >>> p.record(ev("tcp://w1")) is None
    True
    >>> p.record(ev("tcp://w2")).count
    2
    """

    def __init__(
        self, *, max_shard_infra_failures: int = 3, abort_on_repeat_signature: bool = True
    ) -> None:
        self.configure(
            max_shard_infra_failures=max_shard_infra_failures,
            abort_on_repeat_signature=abort_on_repeat_signature,
        )
        self._pipelines: dict[RunLabel, PipelineCounts] = {}
        self._shards: dict[ShardKey, ShardRecord] = {}
        self.dirty: set[RunLabel] = set()  # pipelines changed since `take_dirty`
        # A signature's suspects (`_death.environment`), which an abort names: the core's.
        self.suspects: Callable[[str], list[dict]] = lambda signature_id: []

    def configure(self, *, max_shard_infra_failures: int, abort_on_repeat_signature: bool) -> None:
        """Set when a shard is a deterministic crasher (also while running: decisions
        already taken stand)."""
        if (
            isinstance(max_shard_infra_failures, bool)
            or not isinstance(max_shard_infra_failures, int)
            or max_shard_infra_failures < 1
        ):
            raise ValueError(
                f"max_shard_infra_failures is {max_shard_infra_failures!r}; "
                "expected an integer of at least 1."
            )
        self.max_shard_infra_failures = max_shard_infra_failures
        self.abort_on_repeat_signature = bool(abort_on_repeat_signature)

    # ---- lifecycle of shards

    def _pipeline(self, name: RunLabel) -> PipelineCounts:
        self.dirty.add(name)  # every change goes through here
        p = self._pipelines.get(name)
        if p is None:
            p = self._pipelines[name] = PipelineCounts()
        return p

    def _end(self, pipeline: RunLabel, shard: Any, how: str) -> PipelineCounts | None:
        p = self._pipeline(pipeline)
        # A task key may come in place of its str: only a shard that failed has a record.
        rec = self._shards.get(str(shard)) if self._shards else None
        if rec is not None and rec.pipeline == pipeline:
            if rec.ended:  # ended already: a repeated call must not count twice
                return None
            rec.ended = how
        return p

    def pipeline_submitted(
        self, pipeline: RunLabel, shards: Iterable[Any], *, name: str = "", started: float = 0.0
    ) -> None:
        """Add shards (task keys new to the scheduler) to `pipeline`; call once per graph.

        `pipeline` identifies one run; `name` (default: `pipeline`) is what people read and
        `started` when the run began.

        >>> p = FailurePolicy(); p.pipeline_submitted("etl", ["a", "b"]); p.status("etl").status
        'running'
        """
        if isinstance(shards, (str, bytes)):
            raise TypeError(f"shards is the string {shards!r}; expected an iterable of task keys.")
        p = self._pipeline(pipeline)
        if not p.name:
            p.name, p.started = name or pipeline, started
        n = 0
        for shard in shards:
            n += 1
            # Submitted again in its run (a later compute of the same job): its next end
            # counts, its failures so far still do.
            if self._shards and (rec := self._shards.get(str(shard))) is not None:
                if rec.pipeline == pipeline:
                    rec.ended = ""
        p.submitted += n

    def shard_done(self, pipeline: RunLabel, shard: ShardKey) -> None:
        """The shard's task reached memory."""
        p = self._end(pipeline, shard, "done")
        if p is not None:
            p.done += 1

    def shard_erred(self, pipeline: RunLabel, shard: ShardKey, *, aborted: bool) -> None:
        """The shard's task erred for good: by our abort (`aborted=True`), or otherwise (a user
        error past its retries, KilledWorker, a failed dependency)."""
        p = self._end(pipeline, shard, "aborted" if aborted else "erred")
        if p is None:
            return
        if aborted:
            p.aborted += 1
        else:
            p.erred += 1
            if len(p.erred_shards) < _ERRED_KEPT:
                p.erred_shards.append(str(shard))

    def shard_forgotten(self, pipeline: RunLabel, shard: ShardKey) -> None:
        """The shard's task was released or cancelled without a result."""
        p = self._end(pipeline, shard, "forgotten")
        if p is not None:
            p.forgotten += 1

    def shard_reopened(self, pipeline: RunLabel, shard: ShardKey) -> None:
        """A finished shard's result was lost (its worker died holding it); it runs again."""
        p = self._pipeline(pipeline)
        rec = self._shards.get(shard)
        if rec is not None and rec.pipeline == pipeline:
            if rec.ended != "done":
                return
            rec.ended = ""
        if p.done > 0:
            p.done -= 1

    def displaced(
        self,
        pipeline: RunLabel,
        shard: ShardKey,
        executing: bool | None = None,
        *,
        by_crash: bool = False,
        lost_to: str = "",
    ) -> None:
        """The shard was on a worker that died (only queued there) or was stopped (a
        requested stop), or (`by_crash`) executed beside the task whose thread crashed it;
        it was rescheduled uncounted. `executing`: whether it was running there, None when
        nothing said. `lost_to`: the pipeline of the death's culprit, when another's: the
        shard lost its work to that pipeline's death."""
        p = self._pipeline(pipeline)
        p.displaced += 1
        if lost_to and executing is not False:
            p.lost_to[lost_to] += 1
        if by_crash:
            p.crash_displaced += 1
        elif executing is True:
            p.displaced_executing += 1
        elif executing is False:
            p.displaced_queued += 1

    def death_suspected(self, pipeline: RunLabel, event: FailureEvent) -> None:
        """A worker died under `pipeline` with no report, while several tasks were there
        (some of this run's): one infra failure of the run, one death, and no shard's own
        (`event` is the death's one event, of no shard)."""
        p = self._pipeline(pipeline)
        p.infra += 1
        self._count_death(p, Cause(event.cause), event)

    def isolated(self, pipeline: RunLabel) -> None:
        """A shard of `pipeline` is retried alone after a memory kill of a worker that was
        executing several tasks (which proves no single shard too big)."""
        self._pipeline(pipeline).isolated += 1

    def memory_waited(self, pipeline: RunLabel, seconds: float) -> None:
        """A task of `pipeline` waited `seconds` for host memory before it ran."""
        p = self._pipeline(pipeline)
        p.memory_waits += 1
        p.memory_waited += seconds

    def no_larger(self, run: RunLabel | None, event: FailureEvent, limit: int) -> AbortDecision:
        """The shard of `event` ran out of memory alone under `limit` bytes, and no worker
        is larger (or none came back in time): its run stops (`run` None: a task of no run
        stops alone)."""
        return self._stop(run, event, no_larger_abort_message(event, limit))

    def over_budget(
        self, run: RunLabel | None, event: FailureEvent, key: Any, deaths: int, allowed: int
    ) -> AbortDecision:
        """Task `key` (of `event`) was on `deaths` dead workers, more than Dask's
        `allowed-failures` permits, whatever the evidence said: its run stops (`run` None:
        a task of no run stops alone)."""
        return self._stop(run, event, over_budget_message(event, key, deaths, allowed))

    def _stop(self, run: RunLabel | None, event: FailureEvent, message: str) -> AbortDecision:
        """A verdict taken outside the shard counters: the run reads "aborted" and decides
        nothing more."""
        d = AbortDecision(
            pipeline=event.pipeline,
            shard=event.shard,
            cause=str(event.cause),
            count=self.attempt(event.shard) - 1,
            signature_id=event.signature_id,
            signature_title=event.signature_title,
            evidence=dict(event.evidence or {}),
            workers=(event.worker,) if event.worker else (),
            hosts=(event.host,) if event.host else (),
            message=f"{message} {suspects_sentence(self.suspects(event.signature_id))}".rstrip(),
        )
        if run is not None:
            p = self._pipeline(run)
            if p.decision is None:
                p.decision = d
        return d

    # ---- failures

    def attempt(self, shard: ShardKey) -> int:
        """The number the next failure of `shard` gets (1 for its first failure).

        >>> FailurePolicy().attempt("never-failed")
        1
        """
        rec = self._shards.get(shard)
        return 1 if rec is None else rec.infra + rec.user + 1

    def record(
        self, event: FailureEvent, *, run: RunLabel | None = None, may_decide: bool = True
    ) -> AbortDecision | None:
        """Count one failure; return an `AbortDecision` the first time it makes its shard a
        deterministic crasher, at most once per pipeline run (`run`, default the event's
        pipeline). `may_decide=False` counts without deciding: the failure does not point
        at this shard alone (a memory kill of a worker running several tasks).

        Raises ValueError naming the field for an unknown cause or a kind that contradicts it;
        nothing is counted then.
        """
        try:
            cause = Cause(event.cause)
        except ValueError:
            raise ValueError(
                f"FailureEvent.cause is {event.cause!r}; expected one of "
                f"{', '.join(c.value for c in Cause)}."
            ) from None
        kind = kind_of(cause)
        if event.kind != kind:
            raise ValueError(
                f"FailureEvent.kind is {event.kind!r} but cause {cause.value!r} is {kind.value!r}."
            )
        if not isinstance(event.shard, str) or not event.shard:
            raise ValueError(f"FailureEvent.shard is {event.shard!r}; expected a task key as str.")

        run = run or event.pipeline
        p = self._pipeline(run)
        rec = self._shards.get(event.shard)
        if rec is None or rec.pipeline != run:
            # A key reused by another pipeline starts over there.
            if rec is not None:
                old = self._pipelines.get(rec.pipeline)
                if old is not None:
                    old.failed.pop(event.shard, None)
            rec = self._shards[event.shard] = ShardRecord(pipeline=run)
        p.failed[event.shard] = None
        rec.last_kind = kind.value

        if kind is Kind.USER:
            rec.user += 1
            p.user += 1
            rec.last_user = exception_name(event.evidence or {}, event.signature_title)
            return None

        rec.infra += 1
        rec.shared += not may_decide
        rec.causes[cause.value] += 1
        rec.last_words = describe_cause(
            cause, event.evidence, event.killer, event.killer_confidence
        )
        p.infra += 1
        if cause is Cause.MEMORY_ERROR:
            p.memory_errors += 1
        else:
            self._count_death(p, cause, event)
        new = ShardFailure(
            cause.value,
            event.worker,
            event.host,
            event.signature_id,
            may_decide,
            shard_death(cause, event.evidence),
        )
        repeat = self._repeat_on_other_worker(rec, new)
        if len(rec.failures) < _HISTORY_CAP:
            rec.failures.append(new)

        if p.decision is not None or rec.ended == "done" or not may_decide:
            return None
        if rec.infra - rec.shared >= self.max_shard_infra_failures:
            reason = "count"
        elif repeat is not None:
            reason = "repeat"
        else:
            return None
        p.decision = self._decide(event, cause, rec, p, reason, repeat)
        return p.decision

    @staticmethod
    def _count_death(p: PipelineCounts, cause: Cause, event: FailureEvent) -> None:
        """A death counts once per run, however many of its shards it took."""
        if cause not in DEATH_CAUSES:
            return
        # Events of one death carry the same worker and time; time 0 means "unknown".
        if not (event.time and p.last_death.get(event.worker) == event.time):
            p.deaths[cause.value] += 1
            p.killers[event.killer or Killer.UNKNOWN.value] += 1
        p.last_death[event.worker] = event.time

    def _repeat_on_other_worker(self, rec: ShardRecord, new: ShardFailure) -> ShardFailure | None:
        if not self.abort_on_repeat_signature or not new.shard_cause:
            return None
        if not new.signature_id:  # an unknown signature matches nothing
            return None
        for f in rec.failures:
            if (
                f.conclusive
                and f.shard_cause
                and f.signature_id == new.signature_id
                and f.worker != new.worker
            ):
                return f
        return None

    def _decide(
        self,
        event: FailureEvent,
        cause: Cause,
        rec: ShardRecord,
        p: PipelineCounts,
        reason: str,
        repeat: ShardFailure | None,
    ) -> AbortDecision:
        workers = tuple(dict.fromkeys(f.worker for f in rec.failures if f.worker))
        hosts = tuple(dict.fromkeys(f.host for f in rec.failures if f.host))
        evidence = dict(event.evidence or {})
        assert reason == "count" or repeat is not None
        crashed = sum(
            1 for s in p.failed if (r := self._shards.get(s)) is not None and r.infra > 0
        )
        message = abort_message(
            event,
            cause,
            rec,
            p,
            reason=reason,
            max_failures=self.max_shard_infra_failures,
            repeat_worker=repeat.worker if repeat is not None else "",
            workers=workers,
            hosts=hosts,
            crashed=crashed,
            suspects=self.suspects(event.signature_id),
        )
        return AbortDecision(
            pipeline=event.pipeline,
            shard=event.shard,
            cause=cause.value,
            count=rec.infra,
            signature_id=event.signature_id,
            signature_title=event.signature_title,
            evidence=evidence,
            workers=workers,
            hosts=hosts,
            message=message,
        )

    # ---- reading

    def pipelines(self) -> list[RunLabel]:
        """Names of the pipelines the policy holds, oldest first."""
        return list(self._pipelines)

    def has(self, pipeline: RunLabel) -> bool:
        return pipeline in self._pipelines

    def take_dirty(self) -> list[RunLabel]:
        """Pipelines changed since the last call (to persist only what changed)."""
        dirty, self.dirty = self.dirty, set()
        return [name for name in dirty if name in self._pipelines]

    def tracked_shards(self) -> int:
        """How many shards have a failure record (the policy's only per-shard state)."""
        return len(self._shards)

    def forget_pipeline(self, pipeline: RunLabel) -> None:
        """Drop a pipeline and its shards' records (after the plugin persisted its status)."""
        p = self._pipelines.pop(pipeline, None)
        if p is None:
            return
        for shard in p.failed:
            rec = self._shards.get(shard)
            if rec is not None and rec.pipeline == pipeline:
                del self._shards[shard]

    def status(self, pipeline: RunLabel) -> PipelineStatus:
        """Where `pipeline` stands, with a one-sentence summary naming the layer that failed.

        >>> p = FailurePolicy(); p.pipeline_submitted("etl", ["a"]); p.shard_done("etl", "a")
        >>> p.status("etl").summary
        'the 1 shard finished.'
        """
        p = self._pipelines.get(pipeline)
        if p is None:
            raise KeyError(
                f"unknown pipeline {pipeline!r}; the policy holds {len(self._pipelines)} "
                "pipeline(s), see FailurePolicy.pipelines()."
            )
        if p.decision is not None:
            status = "aborted"
        elif p.unfinished() > 0:
            status = "running"
        elif p.erred > 0:
            status = "failed"
        elif p.infra > 0:
            status = "succeeded_after_infra_failures"
        else:
            status = "succeeded"
        return PipelineStatus(
            name=p.name or pipeline,
            status=status,
            shards_done=p.done,
            shards_failed=p.erred,
            shards_aborted=p.aborted,
            infra_failures=p.infra,
            user_failures=p.user,
            summary=self._summary(status, p),
            abort_reason=p.decision.message if p.decision is not None else "",
            started=p.started,
        )

    # ---- summaries

    def _summary(self, status: str, p: PipelineCounts) -> str:
        """The run's summary, about the shard that decided its abort or made it fail."""
        if status == "aborted":
            d = p.decision
            assert d is not None
            return pipeline_summary(status, p, d.shard, self._shards.get(d.shard))
        if status == "failed":
            # The culprit is the first shard that failed and then erred for good; a shard
            # whose failures were retried into success is not it.
            culprit = next(
                (s for s in p.failed if (r := self._shards.get(s)) and r.ended == "erred"),
                None,
            )
            if culprit is not None:
                return pipeline_summary(status, p, culprit, self._shards[culprit])
            first = p.erred_shards[0] if p.erred_shards else "?"
            return pipeline_summary(status, p, first, None)
        return pipeline_summary(status, p)
