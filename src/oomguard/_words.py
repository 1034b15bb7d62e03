"""Every sentence a person reads on the scheduler side, as pure functions of plain values.

What killed a worker (`describe_cause`), why a pipeline was aborted, a run's one-sentence
summary, the evidence of a death no report described, the log line of each death. The
deciding code (`oomguard._decide`, the scheduler plugin's actions) counts and decides, and
calls these for its words.
"""

from __future__ import annotations

import shlex
import signal
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._causes import MEMORY_CAUSES, Cause, Kind, kind_of
from ._units import format_bytes

if TYPE_CHECKING:
    from ._decide.policy import PipelineCounts, ShardRecord
    from ._models import FailureEvent

__all__ = [
    "NO_REPORT_SOURCE",
    "UNASKED_EXIT_SOURCE",
    "UNASKED_EXIT_SUMMARY",
    "abort_message",
    "culprit_line",
    "death_line",
    "describe_cause",
    "exception_name",
    "no_larger_abort_message",
    "no_larger_message",
    "over_budget_message",
    "pipeline_summary",
    "sampled_stack",
    "shard_name",
    "subject",
]

# Lists of workers and hosts in messages stop here ("and 3 more").
_LIST_CAP = 5


# --------------------------------------------------------------------------- small words


def _signal_name(evidence: dict[str, Any]) -> str:
    sig = evidence.get("signal")
    if isinstance(sig, str) and sig:
        return sig if sig.upper().startswith("SIG") else f"SIG{sig.upper()}"
    code = sig if isinstance(sig, int) else None
    if code is None:
        for k in ("exitcode", "exit_code"):
            v = evidence.get(k)
            # A negative exit status is the signal number (subprocess's convention).
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                code = v
                break
    if code is None:
        return ""
    try:
        return signal.Signals(abs(code)).name
    except ValueError:
        return f"signal {abs(code)}"


def _exit_status(evidence: dict[str, Any]) -> int | None:
    for k in ("exitcode", "exit_code"):
        v = evidence.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def describe_cause(cause: Cause | str, evidence: dict[str, Any] | None = None) -> str:
    """What happened, in the words people use, as a predicate for "the worker ...".

    `memory_error` and `exception` read with the shard as subject ("it raised MemoryError").

    >>> describe_cause("oom_kill")
    'was OOM-killed by the kernel'
    >>> describe_cause("native_crash", {"signal": "SIGABRT"})
    'crashed (SIGABRT)'
    """
    ev = evidence or {}
    c = Cause(cause)
    if c is Cause.OOM_KILL:
        return "was OOM-killed by the kernel"
    if c is Cause.MEMORY_TERMINATE:
        return "was killed by the nanny for exceeding its memory limit"
    if c is Cause.NATIVE_CRASH:
        name = _signal_name(ev)
        return f"crashed ({name})" if name else "crashed in native code"
    if c is Cause.SIGTERM:
        return "was stopped by a SIGTERM from outside the nanny"
    if c is Cause.SIGKILL:
        return "was killed by SIGKILL with no kernel OOM evidence"
    if c is Cause.EXIT:
        status = _exit_status(ev)
        return "exited with an error status" if status is None else f"exited with status {status}"
    if c is Cause.WORKER_LOST:
        return "was lost without a death report (its host or pod went away)"
    if c is Cause.MEMORY_ERROR:
        return "raised MemoryError"
    return "raised an exception"


def subject(cause: str) -> str:
    """Who `describe_cause` speaks of: the shard ("it") or its worker.

    >>> subject("memory_error"), subject("oom_kill")
    ('it', 'its worker')
    """
    return "it" if kind_of(cause) is Kind.USER or cause == Cause.MEMORY_ERROR else "its worker"


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _was(n: int) -> str:
    return "was" if n == 1 else "were"


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 10 else f"{t:.0f} s"


def shard_name(shard: str) -> str:
    """A shard as a sentence names it.

    >>> shard_name("('load', 7)"), shard_name("load-7")
    ("('load', 7)", "'load-7'")
    """
    # Tuple keys already read as themselves; bare names get quotes so they stand out.
    return shard if shard.startswith(("(", "[")) else repr(shard)


def _shell_arg(s: str) -> str:
    # Double quotes keep a tuple key readable; shlex.quote only where they would not be safe.
    if shlex.quote(s) == s:
        return s
    if not any(ch in s for ch in '"$`\\!'):
        return f'"{s}"'
    return shlex.quote(s)


def _listing(items: Iterable[str]) -> str:
    items = list(items)
    if len(items) <= _LIST_CAP:
        return ", ".join(items)
    return ", ".join(items[:_LIST_CAP]) + f" and {len(items) - _LIST_CAP} more"


def _breakdown(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {cause}" for cause, n in counts.most_common())


def exception_name(evidence: dict[str, Any], title: str) -> str:
    """The exception a shard raised, for "raised ValueError past its retries".

    >>> exception_name({"exception_type": "builtins.ValueError"}, "")
    'ValueError'
    """
    for k in ("exception_type", "exception"):
        v = evidence.get(k)
        if isinstance(v, str) and v:
            return v.rsplit(".", 1)[-1]
    head = title.split(":", 1)[0].split(" ", 1)[0].strip()
    if head.isidentifier() and head[:1].isupper():
        return head
    return f"an exception ({title})" if title else "an exception"


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
) -> str:
    """Why the policy aborted `event.pipeline`: `shard` (its record) reached `max_failures`
    (`reason` "count"), or died with one signature on `repeat_worker` and on `event.worker`
    (`reason` "repeat"); what to do next. `crashed`: the pipeline's shards that crashed."""
    evidence = event.evidence or {}
    if len(shard.causes) == 1:
        what = f"{subject(cause)} {describe_cause(cause, evidence)}"
        if shard.infra > 1:
            what += " each time"
    else:
        what = "; ".join(
            f"{_times(n)} {subject(c)} "
            f"{describe_cause(c, evidence if c == cause else None)}"
            for c, n in shard.causes.most_common()
        )
    summary = evidence.get("summary")
    if isinstance(summary, str) and summary:
        what += f" (last time: {summary})"

    if reason == "count":
        why = (
            f"it failed {_times(shard.infra)}, reaching max-shard-infra-failures "
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
    tally = f"{_plural(p.done, 'shard')} done, {crashed} crashed at least once"
    if p.erred:
        tally += f", {p.erred} erred"
    tally += f", {p.unfinished()} unfinished now being aborted"

    if cause in MEMORY_CAUSES:
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
        todo = (
            "find out what keeps killing the workers (preemption, an outside OOM killer "
            "such as earlyoom or systemd-oomd, pod limits), since the shard may not be at "
            "fault, then resubmit"
        )
    sig = event.signature_title or "unknown"
    if event.signature_id:
        sig += f" (id {event.signature_id})"
    return (
        f"oomguard aborted pipeline {event.pipeline!r} because shard "
        f"{shard_name(event.shard)} failed "
        f"{_times(shard.infra)}: {what}. "
        f"Crash signature: {sig}. "
        f"Workers: {_listing(workers) or 'unknown'}; hosts: {_listing(hosts) or 'unknown'}. "
        f"oomguard treats the shard as a deterministic crasher because {why}. "
        f"Pipeline tally: {tally}. "
        f"Next: {todo}; `oomguard report --shard {_shell_arg(event.shard)}` shows every "
        "failure of this shard with its evidence."
    )


def no_larger_message(limit: int) -> str:
    """The reason to abort when no worker is larger than `limit` bytes.

    >>> no_larger_message(4 * 2**30)
    'no worker has more than 4 GiB; the shard needed more'
    """
    return f"no worker has more than {format_bytes(limit)}; the shard needed more"


def _what(event: FailureEvent) -> str:
    evidence = event.evidence or {}
    what = f"{subject(event.cause)} {describe_cause(event.cause, evidence)}"
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
        f"{_shell_arg(event.shard)}` shows the evidence."
    )


def over_budget_message(event: FailureEvent, deaths: int, allowed: int) -> str:
    """Why a task on more dead workers than Dask's allowed-failures was stopped."""
    where = f"pipeline {event.pipeline!r}" if event.pipeline else "its task"
    return (
        f"oomguard stopped {where} because shard {shard_name(event.shard)} was on {deaths} "
        f"workers that died, more than Dask's allowed-failures ({allowed}) permits; the "
        f"last one, {event.worker or 'a worker'}: {_what(event)}. Dask alone would raise "
        "KilledWorker here. Next: `oomguard report --shard "
        f"{_shell_arg(event.shard)}` shows each death with its evidence."
    )


# --------------------------------------------------------------------------- summaries


def _infra_clause(p: PipelineCounts, retried: str) -> str:
    parts = []
    n_deaths = sum(p.deaths.values())
    if n_deaths:
        parts.append(
            f"{_plural(n_deaths, 'worker death')} ({_breakdown(p.deaths)}) {retried}"
        )
    if p.memory_errors:
        parts.append(f"{_plural(p.memory_errors, 'MemoryError')} in task code")
    return ", and ".join(parts)


def _shard_story(shard: str, rec: ShardRecord) -> str:
    name = shard_name(shard)
    if len(rec.causes) == 1:
        (cause,) = rec.causes
        if cause == Cause.MEMORY_ERROR:
            return f"shard {name} raised MemoryError {_times(rec.infra)}"
        return f"a worker {rec.last_words} at shard {name} {_times(rec.infra)}"
    return f"shard {name} failed {_times(rec.infra)} ({_breakdown(rec.causes)})"


def pipeline_summary(
    status: str, p: PipelineCounts, shard: str = "", rec: ShardRecord | None = None
) -> str:
    """Where a run stands in one sentence, naming the layer that failed. `shard` and its
    record `rec`: the shard the story is about (the one that decided an abort, or the
    culprit of a failed run; `rec` None when it has none)."""
    text = _story(status, p, shard, rec)
    if p.memory_waits:
        text = (f"{text.rstrip('.')}; {_plural(p.memory_waits, 'task')} waited "
                f"{_seconds(p.memory_waited)} in total for memory.")
    return text


def _story(status: str, p: PipelineCounts, shard: str, rec: ShardRecord | None) -> str:
    finished = f"{_plural(p.done, 'shard')} finished"
    if status == "aborted":
        d = p.decision
        assert d is not None
        if rec is not None and rec.infra:
            story = _shard_story(shard, rec)
        else:
            story = f"shard {shard_name(d.shard)} failed {_times(d.count)}"
        tally = [f"{_plural(p.done, 'shard')} had finished"]
        if p.erred:
            tally.append(f"{p.erred} erred")
        left = p.unfinished()
        if p.aborted or not left:
            tally.append(f"{p.aborted} {_was(p.aborted)} aborted")
        if left:
            still = "still " if p.aborted else ""
            tally.append(f"{left} {'is' if left == 1 else 'are'} {still}being aborted")
        return f"{story}; the pipeline was aborted; {', '.join(tally)}."

    if status == "running":
        s = f"{p.done} of {_plural(p.submitted, 'shard')} finished so far"
        if p.erred:
            s += f", {p.erred} erred"
        infra = _infra_clause(p, "that oomguard retried")
        if infra:
            s += f", after {infra}"
        if p.isolated:
            s += f"; {_plural(p.isolated, 'shard')} retried alone after a shared memory kill"
        return s + "."

    if status == "failed":
        if rec is not None:
            if rec.last_kind == Kind.USER:
                story = (
                    f"shard {shard_name(shard)} raised {rec.last_user or 'an exception'}"
                    " past its retries"
                )
            else:
                story = f"{_shard_story(shard, rec)} until Dask gave up on it"
        else:
            story = f"shard {shard_name(shard)} erred"
        others = p.erred - 1
        tail = f"; {finished}"
        if others > 0:
            tail += f", {others} more erred"
        return f"{story}{tail}."

    # Succeeded, possibly after failures: never read as plain success when shards died.
    if p.submitted == 0 and p.done == 0:
        s = "no shards were submitted"
    elif p.forgotten:
        s = (
            f"{p.done} of {_plural(p.submitted, 'shard')} finished and {p.forgotten} "
            f"{_was(p.forgotten)} released or cancelled without a result"
        )
    else:
        s = "the 1 shard finished" if p.done == 1 else f"all {p.done} shards finished"
    infra = _infra_clause(p, "that oomguard retried without using task retries")
    if infra:
        s += f", after {infra}"
    if p.user:
        s += f"; task retries absorbed {_plural(p.user, 'exception')}"
    if p.isolated:
        s += (
            f"; {_plural(p.isolated, 'shard')} {_was(p.isolated)} retried alone after a "
            "memory kill of a worker running several"
        )
    if p.displaced:
        s += (
            f"; {_plural(p.displaced, 'queued shard')} {_was(p.displaced)} moved off dead "
            "workers without counting against them"
        )
    return s + "."


# --------------------------------------------------------------------------- deaths

#: The evidence of a death no report described: an exit the nanny saw but nobody asked
#: for, or nothing at all within the grace timeout.
UNASKED_EXIT_SOURCE = "the nanny's notice: exit status 0, not requested"
UNASKED_EXIT_SUMMARY = ("exit status 0, not requested: the worker process ended itself "
                        "(os._exit or sys.exit in a task?)")
NO_REPORT_SOURCE = "no death report within the grace timeout"


def culprit_line(certainty: str, shard: str, grew: int, total: int) -> str:
    """The task that most likely ran a worker out of memory, as a death's summary names it.

    >>> culprit_line("likely", "big-1", 1900 * 2**20, 2000 * 2**20)
    "likely 'big-1': 1.86 GiB of the 1.95 GiB the executing tasks grew (95%, sampled)"
    """
    return (
        f"{certainty} {shard!r}: {format_bytes(grew)} of the "
        f"{format_bytes(total)} the executing tasks grew ({grew / total:.0%}, sampled)"
    )


def sampled_stack(shard: str, frames: Iterable[Sequence[Any]], age: float | None) -> str:
    """The last stack sampled from a shard that was running at a death, `age` seconds
    before it, as a traceback reads (most recent call last).

    >>> print(sampled_stack("f-1", [("/app/etl.py", 8, "lookup")], 1.5))
    Last sampled stack of shard f-1, 1.5 s before the death (most recent call last):
      File "/app/etl.py", line 8, in lookup
    """
    when = f", {age:.1f} s before the death" if age is not None else ""
    lines = [f"Last sampled stack of shard {shard}{when} (most recent call last):"]
    lines += [f'  File "{f}", line {n}, in {fn}' for f, n, fn in frames]
    return "\n".join(lines)


def death_line(event: FailureEvent) -> str:
    """One log line per classified death: cause, worker, shard, pipeline, signature.

    >>> from oomguard._models import FailureEvent
    >>> print(death_line(FailureEvent("infra", "oom_kill", "('load', 3)", "etl", "tcp://w:1",
    ...     "w", "3f2a9c01d2e4", "oom_kill in load", {"summary": "kernel oom_kill counted",
    ...     "executing_tasks": 2})))
    worker tcp://w:1 on w died: oom_kill (kernel oom_kill counted); executing shard ('load', 3) and 1 more of pipeline 'etl'; signature 3f2a9c01d2e4
    """
    evidence = event.evidence or {}
    summary = evidence.get("summary")
    line = f"worker {event.worker or '?'} on {event.host or '?'} died: {event.cause}"
    if summary:
        line += f" ({summary})"
    if event.shard:
        more = (evidence.get("executing_tasks") or 1) - 1
        line += f"; executing shard {event.shard}" + (f" and {more} more" if more > 0 else "")
        line += f" of pipeline {event.pipeline!r}" if event.pipeline else " (no pipeline)"
    else:
        line += "; no task was executing"
    if event.signature_id:
        line += f"; signature {event.signature_id}"
    return line
