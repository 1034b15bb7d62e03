"""What one failure says, as the `Record`s it writes (pure). A worker death: its cause and
evidence, whether it was a memory kill shared by several tasks (and which one likely caused
it), the one signature and trace of all its events; a late report's too. A task's
exception: its cause, signature and traceback. The decision core decides what to do about
a failure; this module only reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._causes import Cause, Confidence, Killer, Kind, Known, kind_of, memory_death
from .._death.killer import Attribution, for_cause
from .._models import FailureEvent
from .._signature import Signature, scrub
from .._words import (
    NO_REPORT_SOURCE,
    UNASKED_EXIT_SOURCE,
    UNASKED_EXIT_SUMMARY,
    evidence_summary,
    suspects_line,
)
from .blame import FLIGHT_RECORD, Blame, Culprit, blamed, culprit
from .bounds import cap_evidence
from .deaths import Death
from .decisions import Record
from .runs import ShardKey
from .signatures import (
    death_signature,
    exception_class,
    suspects_signature,
    task_signature,
    trace_example,
)

__all__ = ["DeathEvidence", "death_cause", "nanny_stop_record", "task_record"]

#: Suspects (and their pipelines) a death's evidence lists; `suspects_total` counts them all.
SUSPECTS_KEPT = 20


def death_cause(death: Death) -> Cause:
    """Its report's cause; without one `exit` (ended unasked with status 0), else
    `worker_lost`."""
    if death.report is not None:
        return Cause(death.report["cause"])
    return Cause.EXIT if death.exited else Cause.WORKER_LOST


def death_killer(death: Death, cause: Cause) -> Attribution:
    """Who ended the worker: the nanny's attribution in its report, else what the cause
    alone implies (a report from an older nanny, or none: a worker lost with its nanny)."""
    k = death.report.get("killer") if death.report is not None else None
    if k:
        return Attribution(k["name"], k["how"], k["confidence"], k["summary"], memory=k["memory"])
    return for_cause(cause.value)


@dataclass(frozen=True)
class DeathEvidence:
    """What one death says: read once, shared by every event it records.

    `shared`: a memory kill of a worker executing several blamed tasks, which proves no
    single one too big; `likely` the one that grew most, when the samples say so. `first`
    is the shard whose stack signs the death (`signature`, `example`). `suspects`: a death
    without a report that names no shard (`Blame.suspected`), its tasks in key order; it
    is one event (`suspects_event`), and `first` is "".
    """

    death: Death
    cause: Cause
    evidence: dict
    shared: bool
    likely: Culprit | None
    first: ShardKey
    signature: Signature
    example: str
    when: float
    host: str
    killer: Attribution
    suspects: tuple[ShardKey, ...] = ()

    @classmethod
    def of(
        cls, death: Death, cause: Cause, b: Blame, keys: Mapping[ShardKey, Any]
    ) -> DeathEvidence:
        """A death decided now: `keys` is {str: key} of what `b` blames (None: unknown)."""
        report, removal = death.report, death.removal
        killer = death_killer(death, cause)
        suspects = tuple(sorted(keys)) if b.suspected else ()
        evidence = _evidence(death, cause, b.source, 0 if suspects else len(keys), killer)
        if b.ignored:
            evidence["executing_ignored"] = b.ignored  # named by the report, not blamed
        if suspects:
            nthreads = removal.nthreads if removal is not None else 1
            evidence.update(
                suspects=list(suspects[:SUSPECTS_KEPT]),
                suspects_total=len(suspects),
                nthreads=nthreads,
            )
            line = suspects_line(suspects, len(suspects), nthreads)
            evidence["summary"] = f"{evidence['summary']}; {line}"
        # A memory death (not a task's MemoryError) can be shared: several tasks growing
        # together on one worker.
        shared = (
            memory_death(cause, evidence)
            and b.certain
            and sum(k is not None for k in keys.values()) > 1
        )
        likely = culprit([e for e in report["executing"] if e["key"] in keys]) if shared else None
        if likely is not None:
            evidence.update(
                likely_culprit=likely.shard,
                likely_culprit_grew=likely.grew,
                likely_culprit_share=round(likely.share, 2),
            )
            evidence["summary"] = f"{evidence.get('summary') or cause.value}; {likely.describe()}"
        when = report["time"] if report is not None else removal.time
        host = report["host"] if report is not None else removal.host
        entries = {e["key"]: e for e in report["executing"]} if report is not None else {}
        # One death, one crash, one signature for all its events: from the likely
        # culprit's stack when one is named, else from the first executing task's.
        if suspects:
            first, sig, example = "", suspects_signature(cause, suspects), ""
        else:
            first = likely.shard if likely is not None else next(iter(keys), "")
            sig = death_signature(cause, report, entries.get(first), first)
            example = trace_example(report, entries.get(first), first)
        cap_evidence(evidence)  # measured once per death, shared by its events
        return cls(
            death,
            cause,
            evidence,
            shared,
            likely,
            first,
            sig,
            example,
            when,
            host,
            killer,
            suspects,
        )

    @classmethod
    def late(cls, death: Death) -> DeathEvidence:
        """A report that came after its death was decided (`worker_lost`): what it says."""
        report = death.report
        cause = Cause(report["cause"])
        killer = death_killer(death, cause)
        ran, ignored = blamed(death)
        evidence = _evidence(death, cause, FLIGHT_RECORD, len(ran), killer)
        evidence["late_report"] = True
        if ignored:
            evidence["executing_ignored"] = ignored
        cap_evidence(evidence)
        entry = (ran or [None])[0]
        first = entry["key"] if entry else ""
        sig = death_signature(cause, report, entry, first)
        example = trace_example(report, entry, first)
        return cls(
            death,
            cause,
            evidence,
            False,
            None,
            first,
            sig,
            example,
            report["time"],
            report["host"],
            killer,
        )

    def event(self, shard: ShardKey, pipeline: str, attempt: int) -> FailureEvent:
        """The event of `shard`, one of the tasks blamed ("" when none is known)."""
        return FailureEvent(
            kind=Kind.INFRA.value,
            cause=self.cause.value,
            shard=shard,
            pipeline=pipeline,
            worker=self.death.worker,
            host=self.host,
            signature_id=self.signature.id,
            signature_title=self.signature.title,
            evidence=self.evidence,
            attempt=attempt,
            time=self.when,
            **self._killer_fields(),
        )

    def suspects_event(self, pipelines: list[str]) -> FailureEvent:
        """The one event of a death that names no shard: `pipelines` are its suspects'
        (distinct, in order). It carries the pipeline they share; of several, none, and the
        evidence lists them."""
        evidence = self.evidence
        if len(pipelines) > 1:
            evidence = {**evidence, "suspect_pipelines": pipelines[:SUSPECTS_KEPT]}
        return FailureEvent(
            kind=Kind.INFRA.value,
            cause=self.cause.value,
            shard="",
            pipeline=pipelines[0] if len(pipelines) == 1 else "",
            worker=self.death.worker,
            host=self.host,
            signature_id=self.signature.id,
            signature_title=self.signature.title,
            evidence=evidence,
            time=self.when,
            **self._killer_fields(),
        )

    def _killer_fields(self) -> dict[str, str]:
        k = self.killer
        return {
            "killer": k.killer,
            "killer_how": k.how,
            "killer_confidence": k.confidence,
            "killer_summary": k.summary,
        }

    def unblamed_event(self, shard: ShardKey, pipeline: str) -> FailureEvent:
        """The event of a task charged without blame (no report said what ran): unsigned,
        never recorded, only what an abort over Dask's bound is decided from."""
        return FailureEvent(
            Kind.INFRA.value,
            self.cause.value,
            shard,
            pipeline,
            self.death.worker,
            self.host,
            "",
            "",
            self.evidence,
            time=self.when,
            **self._killer_fields(),
        )

    def record(self, event: FailureEvent) -> Record:
        """`event` to store: a late report's amends the `worker_lost` events it replaces."""
        if self.death.late:
            return Record(
                event,
                self.signature.grouping_version,
                self.example,
                amends=self.death.lost_at or 0.0,
            )
        return Record(
            event, self.signature.grouping_version, self.example, death=event.shard == self.first
        )


def task_record(
    shard: ShardKey,
    pipeline: str,
    worker: str,
    host: str,
    attempt: int,
    time: float,
    exception_text: str,
    traceback_text: str,
    retries: int,
) -> Record:
    """A task's exception: a MemoryError is `memory_error` (INFRA), anything else
    `exception` (USER); signed by its traceback, which is kept with it."""
    memory_error = exception_text.startswith("MemoryError")
    cause = Cause.MEMORY_ERROR if memory_error else Cause.EXCEPTION
    sig = task_signature(exception_class(exception_text), traceback_text, exception_text)
    event = FailureEvent(
        kind=kind_of(cause).value,
        cause=cause.value,
        shard=shard,
        pipeline=pipeline,
        worker=worker,
        host=host,
        signature_id=sig.id,
        signature_title=sig.title,
        evidence={"exception": exception_text[:500], "retries_left": retries},
        attempt=attempt,
        time=time,
    )
    return Record(event, sig.grouping_version, scrub(f"{traceback_text}\n{exception_text}"))


def nanny_stop_record(
    worker: str, host: str, shard: ShardKey, pipeline: str, when: float
) -> Record:
    """The event of a task whose worker's nanny was stopped by SIGTERM (its own signal: an
    eviction, a container stop): external, never a death counted nor blamed (Dask moves
    the task elsewhere, as for any requested stop). Who sent it is not known (Dask's handler
    gets no siginfo); the pod lookup may name the kubelet."""
    sig = death_signature(Cause.SIGTERM, None, None, shard)
    event = FailureEvent(
        kind=Kind.INFRA.value,
        cause=Cause.SIGTERM.value,
        shard=shard,
        pipeline=pipeline,
        worker=worker,
        host=host,
        signature_id=sig.id,
        signature_title=sig.title,
        evidence={
            "source": "the nanny: `dask worker` closed on SIGTERM (Nanny.close reason)",
            "nanny_stopped": True,
            "external": True,
            "blame": "none: a requested stop, the task moved without a count",
            "summary": "the nanny itself got SIGTERM while its worker ran this task",
        },
        time=when,
        killer=Killer.UNKNOWN.value,
        killer_how=Known.INFERRED.value,
        killer_confidence=Confidence.LIKELY.value,
        killer_summary=(
            "SIGTERM to the nanny itself, its sender not seen (Dask's handler gets none): "
            "in a container, from its runtime or the kubelet"
        ),
    )
    return Record(event, sig.grouping_version, "")


def _evidence(death: Death, cause: Cause, source: str, n: int, killer: Attribution) -> dict:
    report = death.report
    if report is not None:
        evidence = dict(report["evidence"])
    elif death.exited:
        evidence = {"source": UNASKED_EXIT_SOURCE, "exitcode": 0, "summary": UNASKED_EXIT_SUMMARY}
    else:
        evidence = {"source": NO_REPORT_SOURCE}
    evidence["blame"] = source
    if killer.memory:
        evidence["killer_memory"] = True  # a userspace OOM kill of the host's largest
    evidence.setdefault("killer_summary", killer.summary)
    if n > 1:
        evidence["executing_tasks"] = n
    evidence.setdefault("summary", evidence_summary(evidence, str(cause)))
    return evidence
