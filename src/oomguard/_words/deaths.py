"""One death for people: the evidence in one phrase, its culprit, its stack, its log line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._causes import Cause
from .._models import evidence_int as _int
from .._models import evidence_map as _map
from .._models import evidence_number as _num
from .._units import NO_LIMIT, format_bytes
from .causes import plural, shard_name

if TYPE_CHECKING:
    from .._models import FailureEvent


# --------------------------------------------------------------------------- deaths

#: The evidence of a death no report described: an exit the nanny saw but nobody asked
#: for, or nothing at all within the grace timeout.
UNASKED_EXIT_SOURCE = "the nanny's notice: exit status 0, not requested"
UNASKED_EXIT_SUMMARY = (
    "exit status 0, not requested: the worker process ended itself "
    "(os._exit or sys.exit in a task?)"
)
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


#: Suspects a death's summary names; the evidence keeps more (`_decide.accounts`).
SUSPECTS_SHOWN = 5


def suspects_line(shards: Sequence[str], total: int, nthreads: int) -> str:
    """Who may have been running when a worker died with several tasks there and nothing
    to say which ran: `shards` the first of them, `total` how many, `nthreads` its threads.

    >>> suspects_line(["nap-28", "nap-31"], 2, 1)
    "one of 'nap-28', 'nap-31' was running; 1 thread"
    >>> suspects_line(["a-1", "a-2"], 2, 2)
    "any of 'a-1', 'a-2' may have been running; 2 threads"
    >>> suspects_line([f"a-{i}" for i in range(5)], 9, 4)
    "up to 4 of 'a-0', 'a-1', 'a-2', 'a-3', 'a-4' and 4 more were running; 4 threads"
    """
    shown = list(shards[:SUSPECTS_SHOWN])
    names = ", ".join(shard_name(s) for s in shown)
    if total > len(shown):
        names += f" and {total - len(shown)} more"
    threads = plural(nthreads, "thread")
    if nthreads <= 1:
        return f"one of {names} was running; {threads}"
    if total <= nthreads:
        return f"any of {names} may have been running; {threads}"
    return f"up to {nthreads} of {names} were running; {threads}"


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
    >>> print(death_line(FailureEvent("infra", "worker_lost", "", "naps", "tcp://w:1", "w",
    ...     "", "", {"summary": "one of 'nap-1', 'nap-2' was running; 1 thread",
    ...     "suspects": ["nap-1", "nap-2"], "suspects_total": 2})))
    worker tcp://w:1 on w died: worker_lost (one of 'nap-1', 'nap-2' was running; 1 thread); 2 suspects of pipeline 'naps'
    """
    evidence = event.evidence or {}
    summary = evidence.get("summary")
    line = f"worker {event.worker or '?'} on {event.host or '?'} died: {event.cause}"
    if summary:
        line += f" ({summary})"
    suspects = evidence.get("suspects")
    if event.shard:
        more = (evidence.get("executing_tasks") or 1) - 1
        line += f"; executing shard {event.shard}" + (f" and {more} more" if more > 0 else "")
        line += f" of pipeline {event.pipeline!r}" if event.pipeline else " (no pipeline)"
    elif suspects and isinstance(suspects, list):
        # No report and several tasks there: the summary says which may have run.
        line += f"; {plural(_int(evidence.get('suspects_total')) or len(suspects), 'suspect')}"
        line += f" of pipeline {event.pipeline!r}" if event.pipeline else ""
    else:
        line += "; no task was executing"
    if event.signature_id:
        line += f"; signature {event.signature_id}"
    return line


# --------------------------------------------------------------------------- evidence


def _of_limit(ev: Mapping[str, Any]) -> str:
    for key in ("limit_bytes", "memory_limit_bytes"):
        limit = _int(ev.get(key))
        if limit and limit < NO_LIMIT:  # NO_LIMIT and up mean no limit
            return f" of a {format_bytes(limit)} limit"
    return ""


def _ago(seconds: Any) -> str:
    s = _num(seconds)
    if s is None or s < 0:
        return ""
    return f" {s * 1000:.0f} ms before" if s < 1 else f" {s:.1f} s before"


def _within(ev: Mapping[str, Any]) -> str:
    """`` within 0.4 s of the death``: the age of the reading the kill was counted after."""
    age = _num(ev.get("last_reading_age_seconds"))
    return "" if age is None else f" within {age:.1f} s of the death"


def _sampled(ev: Mapping[str, Any], rss: int, *, with_limit: bool = False) -> str:
    """``sampled RSS 986 MiB 500 ms before`` (and ``, of a 1 GiB limit`` when asked)."""
    ago = _ago(ev.get("rss_age_seconds"))
    limit = _of_limit(ev) if with_limit else ""
    return f"sampled RSS {format_bytes(rss)}{ago}{',' if ago and limit else ''}{limit}"


def _peak_label(ev: Mapping[str, Any]) -> str:
    # Older nannies send no scope: they always meant the group the worker was in.
    if ev.get("peak_scope") == "shared":
        return "kernel peak of its shared group"
    return "kernel peak of the worker's group"


def _peak_caveat(ev: Mapping[str, Any]) -> str:
    if ev.get("peak_scope") != "worker" or ev.get("charge_moved") is not False:
        return ""
    held = _int(ev.get("rss_at_move_bytes"))
    what = f"up to {format_bytes(held)}" if held is not None else "memory"
    return f"; the peak excludes {what} charged before the worker joined its group"


def evidence_summary(evidence: Mapping[str, Any], cause: str, killer: str = "") -> str:
    """One short phrase for people, built from `evidence` and the `killer`'s summary.

    Every size says which number it is: ``kernel peak of the worker's group`` (the kernel's
    high-water mark), ``sampled RSS`` (the flight recorder's last sample, and how long before
    the death) or ``nanny RSS`` (the reading the nanny's memory kill acted on).

    >>> evidence_summary({"oom_kill_delta": 1, "peak_bytes": 1095216660,
    ...                   "limit_bytes": 2**30, "rss_sampled_bytes": 986 * 2**20,
    ...                   "rss_age_seconds": 0.5}, "oom_kill")
    "kernel oom_kill counted: kernel peak of the worker's group 1.02 GiB of a 1 GiB limit, sampled RSS 986 MiB 500 ms before"
    >>> evidence_summary({"nanny_rss_bytes": 601_446_154, "memory_limit_bytes": 600 * 2**20},
    ...                  "memory_terminate")
    'nanny terminated it for memory: nanny RSS 574 MiB of a 600 MiB limit'
    """
    ev = _map(evidence)
    code = _int(ev.get("exitcode"))
    sig = ev.get("signal") if isinstance(ev.get("signal"), str) else None
    rss = _int(ev.get("rss_sampled_bytes"))
    if cause == Cause.OOM_KILL:
        delta = _int(ev.get("oom_kill_delta"))
        head = "kernel oom_kill counted" if delta else "kernel log shows an OOM kill"
        new = _int(ev.get("oom_kill_since_reading"))
        if new and ev.get("peak_scope") == "shared":
            # No group of its own: say why this kill is this worker's.
            why = (
                "kernel log names this PID"
                if "kernel log" in str(ev.get("oom_attribution"))
                else "every other process there still runs"
            )
            head = f"kernel oom_kill +{new} in its shared group{_within(ev)}; {why}"
        peak = _int(ev.get("peak_bytes"))
        if peak is not None:
            figures = f"{_peak_label(ev)} {format_bytes(peak)}{_of_limit(ev)}"
            if rss is not None:
                figures += f", {_sampled(ev, rss)}"
            return f"{head}: {figures}{_peak_caveat(ev)}"
        if rss is not None:
            return f"{head}: {_sampled(ev, rss, with_limit=True)}"
        return head
    if cause == Cause.MEMORY_TERMINATE:
        head = "nanny terminated it for memory"
        nanny_rss = _int(ev.get("nanny_rss_bytes"))
        if nanny_rss is not None:
            return f"{head}: nanny RSS {format_bytes(nanny_rss)}{_of_limit(ev)}"
        if rss is not None:
            return f"{head}: {_sampled(ev, rss, with_limit=True)}"
        return head
    if cause == Cause.NATIVE_CRASH:
        stack = "faulthandler stack captured" if ev.get("crash_stack") else "no faulthandler stack"
        return f"{sig or 'native crash'}, {stack}"
    if cause == Cause.SIGTERM:
        return killer if isinstance(killer, str) and killer else "SIGTERM from outside the nanny"
    if cause == Cause.SIGKILL:
        if ev.get("oom_confirmed") is False:
            gone = _int(ev.get("group_others_gone")) or 0
            return (
                f"SIGKILL; an OOM kill counted in its group{_within(ev)} is not confirmed as "
                f"this worker's ({gone} other process{'es' if gone != 1 else ''} there "
                f"stopped too)"
            )
        if isinstance(killer, str) and killer:
            return killer
        if ev.get("oom_kill_delta") is None and "oom_kill_source" in ev:
            return "SIGKILL, kernel OOM counters unreadable"
        return "SIGKILL with no kernel OOM evidence"
    if cause == Cause.WORKER_LOST:
        return "no report from the nanny: host or pod died with it"
    if cause == Cause.EXIT:
        if sig is not None:
            return f"killed by {sig}"
        if code is None:
            return "exit status unknown"
        if code == 255:
            return "exit status 255 (status possibly lost)"
        return f"exit status {code}"
    return str(cause)
