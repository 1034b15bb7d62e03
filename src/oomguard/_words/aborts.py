"""Why a shard stopped its pipeline: the abort messages, one paragraph each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from distributed import KilledWorker

from .._causes import Cause, memory_death
from .._exceptions import LastWorker
from .._units import format_bytes
from .causes import describe_cause, listing, plural, shard_name, shell_arg, subject, times
from .environments import suspects_sentence

if TYPE_CHECKING:
    from .._models import FailureEvent, PipelineCounts, ShardRecord


# --------------------------------------------------------------------------- abort messages


def abort_message(
    event: FailureEvent,
    cause: Cause,
    shard: ShardRecord,
    pipeline: PipelineCounts,
    *,
    reason: str,
    max_failures: int,
    repeat_worker: str,
    workers: Sequence[str],
    hosts: Sequence[str],
    crashed: int,
    suspects: Sequence[Mapping[str, Any]] = (),
) -> str:
    """Why the policy aborted `event.pipeline`: `shard` (its record) reached `max_failures`
    (`reason` "count"), or died with one signature on `repeat_worker` and on `event.worker`
    (`reason` "repeat"); what to do next. `crashed`: the pipeline's shards that crashed;
    `suspects`: the values its signature's deaths have far more than the workers."""
    evidence = event.evidence or {}
    if len(shard.causes) == 1:
        what = f"{subject(cause)} {_describe(event, cause)}"
        if shard.infra > 1:
            what += " each time"
    else:
        what = "; ".join(
            f"{times(n)} {subject(c)} {_describe(event, c) if c == cause else describe_cause(c)}"
            for c, n in shard.causes.most_common()
        )
    summary = evidence.get("summary")
    if isinstance(summary, str) and summary:
        what += f" (last time: {summary})"
    what += _killed_by(event, what)

    if reason == "count":
        why = (
            f"it failed {times(shard.infra)}, reaching max-shard-infra-failures "
            f"({max_failures}), so another retry would most likely "
            "fail the same way"
        )
    else:
        why = (
            f"it died with the same signature on two different workers "
            f"({repeat_worker} and {event.worker}), so neither one bad node nor "
            "preemption explains it"
        )

    p = pipeline
    tally = f"{plural(p.done, 'shard')} done, {crashed} crashed at least once"
    if p.erred:
        tally += f", {p.erred} erred"
    tally += f", {p.unfinished()} unfinished now being aborted"

    if memory_death(cause, evidence):
        todo = (
            "give this shard more memory (a larger worker memory limit, or split its "
            "input so the shard is smaller), then resubmit"
        )
    elif cause is Cause.NATIVE_CRASH:
        todo = (
            "fix the native crash at the signature's stack (often a C extension, or a "
            "bad input reaching one), then resubmit"
        )
    else:
        todo = _external_todo(event)
    sig = event.signature_title or "unknown"
    if event.signature_id:
        sig += f" (id {event.signature_id})"
    return (
        f"oomguard aborted pipeline {event.pipeline!r} because shard "
        f"{shard_name(event.shard)} failed "
        f"{times(shard.infra)}: {what}. "
        f"Crash signature: {sig}. "
        f"Workers: {listing(workers) or 'unknown'}; hosts: {listing(hosts) or 'unknown'}. "
        f"{suspects_sentence(suspects)}"
        f"oomguard treats the shard as a deterministic crasher because {why}. "
        f"Pipeline tally: {tally}. "
        f"Next: {todo}; `oomguard report --shard {shell_arg(event.shard)}` shows every "
        "failure of this shard with its evidence."
    )


def _killed_by(event: FailureEvent, said: str) -> str:
    """ "; killed by earlyoom (signal sender, confirmed)", unless nothing names a killer."""
    killer = getattr(event, "killer", "")
    if not killer or killer == "unknown" and not event.killer_summary:
        return ""
    if event.cause in ("oom_kill", "memory_terminate", "native_crash", "exit"):
        return ""  # the cause's words already say who: the kernel, the nanny, the task
    how = ", ".join(x for x in (event.killer_how, event.killer_confidence) if x)
    out = f"; killed by {killer}" + (f" ({how})" if how else "")
    summary = event.killer_summary
    if summary and summary not in said:
        out += f": {summary}"
    return out


def _external_todo(event: FailureEvent) -> str:
    """What to do when something outside the shard keeps killing its workers."""
    killer = getattr(event, "killer", "")
    if killer in ("earlyoom", "systemd-oomd"):
        return (
            f"{killer} killed the workers while other processes held most of the host's "
            "memory: give the workers' hosts more memory or fewer other tenants, or tune "
            f"{killer}'s thresholds (see docs/runbook.md), then resubmit"
        )
    if killer == "process":
        return (
            "stop the process named above from signalling the workers (it is outside Dask "
            "and the shard is not at fault), then resubmit"
        )
    if killer == "slurm":
        return (
            "check the SLURM job's time limit, preemption and scancel history (scontrol "
            "show job), since the shard is not at fault, then resubmit"
        )
    if killer == "kubelet":
        return (
            "the kubelet evicted the pods under node memory pressure: give the node more "
            "memory or the pods a memory request that matches their use, then resubmit"
        )
    return (
        "find out what keeps killing the workers (preemption, an outside OOM killer "
        "such as earlyoom or systemd-oomd, pod limits), since the shard may not be at "
        "fault, then resubmit"
    )


def no_larger_message(limit: int) -> str:
    """The reason to abort when no worker is larger than `limit` bytes.

    >>> no_larger_message(4 * 2**30)
    'no worker has more than 4 GiB; the shard needed more'
    """
    return f"no worker has more than {format_bytes(limit)}; the shard needed more"


def _describe(event: FailureEvent, cause: Cause | str) -> str:
    """`describe_cause` of `event`: its evidence and its killer."""
    return describe_cause(cause, event.evidence, event.killer, event.killer_confidence)


def _what(event: FailureEvent) -> str:
    evidence = event.evidence or {}
    what = f"{subject(event.cause)} {_describe(event, event.cause)}"
    summary = evidence.get("summary")
    if isinstance(summary, str) and summary:
        what += f" ({summary})"
    return what


def no_larger_abort_message(event: FailureEvent, limit: int) -> str:
    """Why a shard that ran out of memory alone under `limit` bytes stopped its pipeline."""
    return (
        f"oomguard aborted pipeline {event.pipeline!r} at once because shard "
        f"{shard_name(event.shard)} ran out of memory on {event.worker or 'a worker'} (memory "
        f"limit {format_bytes(limit)}), running alone there: {_what(event)}. oomguard "
        f"retries such a shard only on a worker with a larger memory limit, but "
        f"{no_larger_message(limit)}; retrying it on a worker of the same size would only "
        "kill another worker. Next: add workers with a larger memory limit, or split the "
        "shard's input so it needs less, then resubmit; `oomguard report --shard "
        f"{shell_arg(event.shard)}` shows the evidence."
    )


def over_budget_message(event: FailureEvent, key: Any, deaths: int, allowed: int) -> str:
    """Why task `key`, on more dead workers than Dask's allowed-failures, was stopped: what
    Dask's own KilledWorker says (word for word, from the installed Dask), then oomguard's
    account of the deaths."""
    dask_says = str(KilledWorker(key, LastWorker(event.worker or "an unknown worker"), allowed))
    where = f"pipeline {event.pipeline!r}" if event.pipeline else "its task"
    return (
        f"{dask_says} oomguard stopped {where}: shard {shard_name(event.shard)} was on "
        f"{deaths} workers that died, more than Dask's allowed-failures ({allowed}) permits; "
        f"the last one, {event.worker or 'a worker'}: {_what(event)}. Next: `oomguard report "
        f"--shard {shell_arg(event.shard)}` shows each death with its evidence."
    )
