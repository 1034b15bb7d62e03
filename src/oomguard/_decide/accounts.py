"""What one failure writes, as the `Record` it stores (pure). A worker death: the `Death`
as decided (its cause, its evidence, each task's role and pipeline, its one signature, its
id) and the events of the tasks it is blamed on, each naming it; a late report's too. A
task's exception: its event, signed by its traceback. The decision core decides what to do
about a failure; this module only writes it down.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from .._causes import Cause, Confidence, Killer, Kind, Known, kind_of
from .._death.killer import for_cause
from .._death.record import LIST_MAX, Attribution, Death, Environment, Role, Task
from .._models import FailureEvent
from .._signature import crash_sites, scrub
from .._words import (
    NO_REPORT_SOURCE,
    UNASKED_EXIT_SOURCE,
    UNASKED_EXIT_SUMMARY,
    evidence_summary,
    suspects_line,
)
from .blame import Blame, blamed
from .bounds import cap_evidence
from .decisions import Record
from .pairing import Case
from .runs import ShardKey
from .signatures import death_signature, exception_class, signed, task_signature

__all__ = ["Account", "decided", "late", "nanny_stop_record", "task_record"]

#: Suspects (and their pipelines) a death's evidence lists; `suspects_total` counts them all.
SUSPECTS_KEPT = 20


def death_id(worker: str, when: float) -> str:
    """The id of the death of `worker` at `when` (its removal's time, else its report's):
    the same for the death and for a late report that amends it.

    >>> len(death_id("tcp://10.0.0.5:40001", 1760000000.0))
    16
    """
    return hashlib.blake2b(f"{worker}|{when!r}".encode(), digest_size=8).hexdigest()


@dataclasses.dataclass(frozen=True)
class Account:
    """One death written down: its `record` (the decided Death, the events of the tasks it
    is blamed on)."""

    record: Record

    def unblamed(self, shard: ShardKey, pipeline: str) -> FailureEvent:
        """The event of a task charged without blame (no report said what ran, or it ran
        beside the culprit): unsigned, never recorded, only what an abort over Dask's bound
        is decided from."""
        return _event(self.record.death, shard, pipeline, 1, signed=False)


def _event(
    d: Death, shard: ShardKey, pipeline: str, attempt: int, *, signed: bool = True
) -> FailureEvent:
    """The event of `shard`, a task the death `d` is blamed on ("" when none is named)."""
    k = d.killer or for_cause(d.cause)
    return FailureEvent(
        kind=Kind.INFRA.value,
        cause=d.cause,
        shard=shard,
        pipeline=pipeline,
        worker=d.worker,
        host=d.host,
        signature_id=d.signature_id if signed else "",
        signature_title=d.signature_title if signed else "",
        evidence=d.evidence,
        attempt=attempt,
        time=d.time,
        killer=k.name,
        killer_how=k.how,
        killer_confidence=k.confidence,
        killer_summary=k.summary,
        death=d.id,
    )


def _events(
    d: Death, shards: list[ShardKey], name_of: Callable[[ShardKey], str], attempts: Mapping
) -> list[FailureEvent]:
    """One event per blamed shard ("" for a death that names none)."""
    return [_event(d, s, name_of(s) if s else "", attempts.get(s, 1)) for s in shards]


def _suspects_event(d: Death, pipelines: list[str]) -> FailureEvent:
    """The one event of a death that names no shard: `pipelines` are its suspects'
    (distinct, in order). It carries the pipeline they share; of several, none, and the
    evidence lists them."""
    event = _event(d, "", pipelines[0] if len(pipelines) == 1 else "", 1)
    if len(pipelines) > 1:
        evidence = {**event.evidence, "suspect_pipelines": pipelines[:SUSPECTS_KEPT]}
        event = dataclasses.replace(event, evidence=evidence)
    return event


def decided(
    case: Case,
    b: Blame,
    keys: Mapping[ShardKey, Any],
    name_of: Callable[[ShardKey], str],
    attempts: Mapping[ShardKey, int],
    alone: str = "",
    environment: Environment | None = None,
) -> Account:
    """The death of `case`, decided now, and its events: `keys` is {str: key} of what `b`
    blames (None: unknown); `name_of` names a task's pipeline; `attempts` the number each
    blamed shard's failure gets; `alone`, why a suspect placed to run alone did not;
    `environment`, what its worker said at its start (for a death no report described)."""
    report, removal, cause = case.report, case.removal, case.cause
    killer = case.report.killer if report is not None and report.killer else for_cause(cause)
    suspects = tuple(sorted(keys)) if b.suspected else ()
    n = 0 if suspects else len(keys) + len(b.beside)
    evidence = _evidence(case, cause, b.source, n, killer)
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
    likely = b.likely
    if likely is not None:
        evidence.update(
            likely_culprit=likely.shard,
            likely_culprit_grew=likely.grew,
            likely_culprit_share=round(likely.share, 2),
        )
        evidence["summary"] = f"{evidence.get('summary') or cause.value}; {likely.describe()}"
    if alone:
        evidence["run_alone"] = alone
        evidence["summary"] = f"{evidence.get('summary') or ''}; {alone}".lstrip("; ")
    entries = {t.key: t for t in report.tasks} if report is not None else {}
    # One death, one crash, one signature: from the culprit's stack when there is one,
    # else from the first suspect's; several suspects with no report, their functions.
    first = "" if suspects else next(iter(keys), "")
    sig, example = signed(cause, report, entries.get(first), first, suspects)
    cap_evidence(evidence)  # measured once per death, shared by its events
    when = removal.time if removal is not None else report.time
    base = report if report is not None else _unreported(case, cause, removal, environment)
    death = dataclasses.replace(
        base,
        worker=case.worker,
        cause=cause.value,
        evidence=evidence,
        killer=killer,
        tasks=_tasks(b.roles, entries, name_of, removal.processing if removal else {}),
        more=_more(b.roles),
        id=death_id(case.worker, when),
        signature_id=sig.id,
        signature_title=sig.title,
        sites=crash_sites(sig),
    )
    if suspects:
        pipelines = list(dict.fromkeys(p for s in keys if (p := name_of(s))))
        events = [_suspects_event(death, pipelines)]
    else:
        events = _events(death, list(keys) or [""], name_of, attempts)
    return Account(
        Record(tuple(events), death, sig.grouping_version, example, aliases=sig.previous_ids)
    )


def late(
    case: Case, name_of: Callable[[ShardKey], str], attempts: Mapping[ShardKey, int]
) -> Account:
    """A report that came after its death was decided (`worker_lost`): what it says, as
    the death of the same id, with the events of the tasks it blames; the record amends
    the one it replaces."""
    report = case.report
    assert report is not None
    cause = Cause(report.cause)
    killer = report.killer or for_cause(cause)
    ran, ignored = blamed(case)
    evidence = _evidence(case, cause, "flight record", len(ran), killer)
    evidence["late_report"] = True
    if ignored:
        evidence["executing_ignored"] = ignored
    cap_evidence(evidence)
    entry = (ran or [None])[0]
    first = entry.key if entry else ""
    sig, example = signed(cause, report, entry, first)
    roles = {t.key: Role.CULPRIT if len(ran) == 1 else Role.SUSPECT for t in ran}
    death = dataclasses.replace(
        report,
        worker=case.worker,
        evidence=evidence,
        killer=killer,
        tasks=_tasks(roles, {t.key: t for t in report.tasks}, name_of, {}),
        id=death_id(case.worker, case.lost_at or 0.0),
        signature_id=sig.id,
        signature_title=sig.title,
        sites=crash_sites(sig),
    )
    events = _events(death, [t.key for t in ran] or [""], name_of, attempts)
    record = Record(
        tuple(events),
        death,
        sig.grouping_version,
        example,
        case.lost_at or 0.0,
        aliases=sig.previous_ids,
    )
    return Account(record)


def _unreported(case: Case, cause: Cause, removal: Any, environment: Environment | None) -> Death:
    """The death no report described: what the scheduler knew of the worker."""
    return Death(
        worker=case.worker,
        nanny=removal.nanny or "" if removal is not None else "",
        host=removal.host if removal is not None else "",
        pid=removal.pid if removal is not None else None,
        exitcode=0 if case.exited else None,
        cause=cause.value,
        time=removal.time if removal is not None else 0.0,
        memory_limit=removal.memory_limit if removal is not None else None,
        environment=environment,
    )


_ORDER = {Role.CULPRIT: 0, Role.SUSPECT: 1, Role.DISPLACED: 2, Role.QUEUED: 3}


def _tasks(
    roles: Mapping[ShardKey, Role],
    entries: Mapping[str, Task],
    pipeline_of: Callable[[ShardKey], str],
    processing: Mapping[ShardKey, Any],
) -> tuple[Task, ...]:
    """Every task the death touched, each with its role and pipeline: the blamed first,
    the report's entries as it sent them; at most `LIST_MAX` (`_more` counts the rest)."""
    out = []
    for s in sorted(roles, key=lambda s: _ORDER[roles[s]])[:LIST_MAX]:
        task = entries.get(s) or Task(key=s, prefix=_prefix(processing.get(s), s))
        out.append(dataclasses.replace(task, role=roles[s], pipeline=pipeline_of(s)))
    return tuple(out)


def _more(roles: Mapping[ShardKey, Role]) -> dict[str, int]:
    """How many tasks of each role `_tasks` left out."""
    if len(roles) <= LIST_MAX:
        return {}
    kept = sorted(roles, key=lambda s: _ORDER[roles[s]])[:LIST_MAX]
    out: dict[str, int] = {}
    for s in roles.keys() - set(kept):
        out[roles[s].value] = out.get(roles[s].value, 0) + 1
    return out


def _prefix(key: Any, shard: str) -> str:
    from dask.utils import key_split

    try:
        return key_split(key if key is not None else shard)
    except Exception:
        return ""


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
    example = scrub(f"{traceback_text}\n{exception_text}")
    return Record((event,), None, sig.grouping_version, example, aliases=sig.previous_ids)


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
    return Record((event,), None, sig.grouping_version, "", aliases=sig.previous_ids)


def _evidence(case: Case, cause: Cause, source: str, n: int, killer: Attribution) -> dict:
    report = case.report
    if report is not None:
        evidence = dict(report.evidence)
    elif case.exited:
        evidence = {"source": UNASKED_EXIT_SOURCE, "exitcode": 0, "summary": UNASKED_EXIT_SUMMARY}
    else:
        evidence = {"source": NO_REPORT_SOURCE}
    evidence["blame"] = source
    if killer.memory:
        evidence["killer_memory"] = True  # a userspace OOM kill of the host's largest
    if n > 1:
        evidence["executing_tasks"] = n
    evidence.setdefault("summary", evidence_summary(evidence, str(cause), killer.summary))
    return evidence
